"""The distributed weight sync's group forms against sglang's own ``init_custom_process_group`` (the helper an engine
calls on ``/init_weights_update_group``), over gloo on CPU: our trainer side (``join_weight_group`` with the
group planned by ``plan_weight_group``) and an engine side built from the very ``/init_weights_update_group`` body
we send, in two processes; a broadcast from trainer rank 0 arrives, as the engine receives each bucket."""

from __future__ import annotations

import multiprocessing
import queue

import torch
from forge_replay.runtime.ports import free_port
from forge_replay.runtime.weights.distributed import init_group_body, join_weight_group, plan_weight_group

SENT = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5


def trainer_side(group, results) -> None:
    import torch.distributed as dist

    process_group = join_weight_group(group, 0, timeout_s=60)
    dist.broadcast(SENT.clone(), src=0, group=process_group)
    results.put(("trainer", "sent"))


def engine_side(body, results) -> None:
    """What an sglang engine does with the body: sglang's helper, then a receive into its own buffer."""
    import torch.distributed as dist

    from tests.doubles import real_sglang

    process_group = real_sglang.init_weight_group(
        backend=body["backend"], init_method=f"tcp://{body['master_address']}:{body['master_port']}",
        world_size=body["world_size"], rank=body["rank_offset"], group_name=body["group_name"], timeout_s=60)
    received = torch.zeros(3, 4)
    dist.broadcast(received, src=0, group=process_group)
    results.put(("engine", received.tolist()))


def test_a_broadcast_from_trainer_rank_0_reaches_a_group_formed_by_sglang():
    group = plan_weight_group("127.0.0.1", free_port("127.0.0.1"), [1], "gloo", generation=1)
    body = init_group_body(group, 0)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=trainer_side, args=(group, results)),
                 context.Process(target=engine_side, args=(body, results))]
    for process in processes:
        process.start()
    got = {}
    try:
        for _ in processes:
            side, value = results.get(timeout=240)
            got[side] = value
    except queue.Empty:
        pass
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert got == {"trainer": "sent", "engine": SENT.tolist()}, [p.exitcode for p in processes]
