"""The tensor weight-sync wire (``/update_weights_from_tensor``): serialize, decode in another process,
the restricted decoder, which trainer rank feeds which engine TP rank, and the CUDA round trip (GPU only)."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import pickle
import pickletools
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch

from forge_replay.runtime.weights.ipc import (
    TensorSyncError,
    serialize_named_tensors,
    update_request_body,
    with_device_uuid,
)
from forge_replay.runtime.weights.tensor import (
    EngineFeed,
    EngineGPUs,
    RankGPU,
    engine_feeders,
    in_tp_order,
    plan_feeds,
    tp_roles,
)
from tests.doubles.tensor_payload import (
    RefusedPayload,
    decode_named_tensors,
    device_index_from_uuid,
    summarize,
)

REPO = Path(__file__).resolve().parents[2]
DECODER = REPO / "tests" / "doubles" / "tensor_payload.py"

# A receiver process like the double: forge_replay cannot be imported there, the decoder is loaded by path.
RECEIVER = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch
    sys.modules["forge_replay"] = None  # the double stands in for sglang: any forge_replay import fails
    spec = importlib.util.spec_from_file_location("tensor_payload", sys.argv[1])
    decoder = importlib.util.module_from_spec(spec)
    sys.modules["tensor_payload"] = decoder
    spec.loader.exec_module(decoder)
    named = decoder.decode_named_tensors(sys.stdin.read())
    torch.save({name: tensor.clone() for name, tensor in named}, sys.argv[2])
    named[0][1].add_(1)  # written through the shared memory: the sender sees it
    print(json.dumps(decoder.summarize(named)))
    del named  # closes the mappings, as the double does after each request
    """
)


def receive_in_another_process(payload: str, out: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", RECEIVER, str(DECODER), str(out)],
        input=payload, capture_output=True, text=True, timeout=120, cwd=str(out.parent),
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def abs_sum(tensors) -> float:
    return sum(float(t.detach().double().abs().sum()) for t in tensors)


def weights() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    return [
        ("model.embed_tokens.weight", torch.randn(16, 8, generator=gen).to(torch.bfloat16)),
        ("model.layers.0.mlp.down_proj.weight", torch.randn(8, 12, generator=gen).t()),  # non-contiguous view
        ("model.norm.weight", torch.nn.Parameter(torch.ones(8))),  # a Parameter arrives as a plain tensor
        ("positions", torch.arange(5, dtype=torch.int64)),
        ("empty", torch.empty(0, 3)),
    ]


# ---------------------------------------------------------------------------------------- CPU round trip


def test_cpu_tensors_round_trip_through_another_process_sharing_the_senders_memory(tmp_path):
    named = weights()
    expected = {name: tensor.detach().clone() for name, tensor in named}
    payload = serialize_named_tensors(named)

    summary = receive_in_another_process(payload, tmp_path / "received.pt")  # `named` stays alive meanwhile

    received = torch.load(tmp_path / "received.pt", weights_only=True)
    assert list(received) == [name for name, _ in named] == summary["names"]
    for name, tensor in expected.items():
        assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape, name
        assert torch.equal(received[name], tensor), name
    assert summary["shapes"] == [list(t.shape) for t in expected.values()]
    assert summary["dtypes"] == ["bfloat16", "float32", "float32", "int64", "float32"]
    # the receiver added 1 to the first tensor in place: shared memory, not a copy
    assert torch.equal(named[0][1], expected["model.embed_tokens.weight"] + 1)
    assert summary["abs_sum"] == pytest.approx(abs_sum(t for _, t in named), rel=1e-12)


def own_shm_files() -> set[str]:
    shm = Path("/dev/shm")
    return {f.name for f in shm.glob(f"torch_{os.getpid()}_*")} if shm.is_dir() else set()


def test_shared_memory_files_go_with_the_senders_tensors_opened_or_not(tmp_path):
    """No reference is handed to the receiver: a payload an engine refused (never opened) leaves nothing in
    /dev/shm once the sender drops the tensors, and neither does one that was opened."""
    before = own_shm_files()
    refused = [("w", torch.randn(64))]
    serialize_named_tensors(refused)
    opened = weights()
    receive_in_another_process(serialize_named_tensors(opened), tmp_path / "received.pt")
    created = own_shm_files() - before
    if not created:
        pytest.skip("torch's shared-memory files are not under /dev/shm here")
    del refused, opened
    assert not own_shm_files() & created


def test_decoding_in_this_process_gives_the_same_tensors():
    named = weights()
    decoded = decode_named_tensors(serialize_named_tensors(named))
    assert [n for n, _ in decoded] == [n for n, _ in named]
    for (_, got), (_, sent) in zip(decoded, named):
        assert type(got) is torch.Tensor and not got.requires_grad
        assert torch.equal(got, sent.detach())
    assert summarize(decoded)["abs_sum"] == pytest.approx(abs_sum(t for _, t in named))


def test_the_default_file_descriptor_route_is_refused_with_the_reason():
    """torch's default CPU route passes a file descriptor through the sender's resource sharer, which only
    the sender's children can reach (they hold its authkey); an sglang server never can."""
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([("w", torch.ones(3))])
    names = {arg for _, arg, _ in pickletools.genops(buffer.getvalue()) if isinstance(arg, str)}
    if "rebuild_storage_fd" not in names:
        pytest.skip(f"torch's sharing strategy here is {torch.multiprocessing.get_sharing_strategy()}, not file_descriptor")
    with pytest.raises(RefusedPayload, match="rebuild_storage_fd.*file_system route"):
        decode_named_tensors(base64.b64encode(buffer.getvalue()).decode())


def test_serialize_refuses_what_is_not_a_list_of_named_tensors():
    with pytest.raises(TypeError, match="named tensor 0 is list"):
        serialize_named_tensors([["w", torch.ones(1)]])
    with pytest.raises(TypeError, match="'w' is a ndarray"):
        import numpy as np

        serialize_named_tensors([("w", np.ones(1))])
    with pytest.raises(ValueError, match="'w' appears twice"):
        serialize_named_tensors([("w", torch.ones(1)), ("w", torch.zeros(1))])
    with pytest.raises(TensorSyncError, match="dense CPU or CUDA"):
        serialize_named_tensors([("s", torch.eye(2).to_sparse())])


def test_request_body_is_sglangs():
    assert update_request_body(["a", "b"], flush_cache=True, weight_version="3") == {
        "serialized_named_tensors": ["a", "b"], "load_format": None, "flush_cache": True, "weight_version": "3",
    }
    with pytest.raises(ValueError, match="one non-empty str per engine TP rank"):
        update_request_body([], flush_cache=False, weight_version=None)


# --------------------------------------------------------------------------------- the restricted decoder


class _Runs:
    """Unpickling this calls ``func(*args)``: how a malicious payload runs code."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payload(obj) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode()


@pytest.mark.parametrize(
    "make, refused",
    [
        (lambda marker: _Runs(os.system, f"touch {marker}"), "refused global posix.system"),
        (lambda marker: _Runs(eval, f"open({str(marker)!r}, 'w')"), "refused global builtins.eval"),
        (lambda marker: _Runs(torch.save, {}, str(marker)), "refused global torch.serialization.save"),
        (lambda marker: [("w", _Runs(subprocess.call, ["touch", str(marker)]))], "refused global subprocess.call"),
    ],
    ids=["os.system", "eval", "torch.save", "nested-subprocess"],
)
def test_the_decoder_refuses_a_malicious_pickle_and_nothing_runs(tmp_path, make, refused):
    marker = tmp_path / "pwned"
    with pytest.raises(RefusedPayload, match=refused):
        decode_named_tensors(_payload(make(marker)))
    assert not marker.exists()


def test_allowed_rebuild_functions_check_their_arguments():
    from torch.multiprocessing import reductions

    bad_storage = _Runs(reductions.rebuild_tensor, torch.Tensor, "not a storage", (0, (1,), (1,), False))
    with pytest.raises(RefusedPayload, match="tensor storage must be"):
        decode_named_tensors(_payload([("w", bad_storage)]))
    # the storage constructor never resolves: a payload cannot allocate through it
    with pytest.raises(TypeError):
        decode_named_tensors(_payload([("w", _Runs(torch.UntypedStorage, 10))]))
    with pytest.raises(RefusedPayload, match="15 arguments"):
        decode_named_tensors(_payload([("w", _Runs(reductions.rebuild_cuda_tensor, torch.Tensor))]))


def test_the_decoder_wants_a_list_of_named_tensors():
    with pytest.raises(RefusedPayload, match="not base64"):
        decode_named_tensors("%%%")
    with pytest.raises(RefusedPayload, match="holds a dict"):
        decode_named_tensors(_payload({"w": 1}))
    with pytest.raises(RefusedPayload, match="item 0 is not a"):
        decode_named_tensors(_payload([("w", 1)]))


def test_the_double_decoder_imports_nothing_from_forge_replay():
    tree = ast.parse(DECODER.read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.split(".")[0] in ("forge_replay", "tests")]


# ------------------------------------------------------------------------------------------ device UUIDs


def test_the_sender_puts_the_device_uuid_where_torch_puts_the_index():
    args = tuple(range(15))
    replaced = with_device_uuid(args, lambda index: f"GPU-uuid-{index}")
    assert replaced[6] == "GPU-uuid-6" and replaced[:6] == args[:6] and replaced[7:] == args[7:]
    assert with_device_uuid(replaced, lambda index: pytest.fail("a UUID is kept")) == replaced
    with pytest.raises(TensorSyncError, match="3 arguments"):
        with_device_uuid((1, 2, 3), str)


def test_the_receiver_maps_a_uuid_to_its_own_index():
    uuids = ["GPU-a", "GPU-b", "GPU-c"]
    assert device_index_from_uuid("GPU-c", uuids) == 2
    assert device_index_from_uuid(1, uuids) == 1
    with pytest.raises(RefusedPayload, match="GPU-z, which this process does not see"):
        device_index_from_uuid("GPU-z", uuids)
    with pytest.raises(RefusedPayload, match="neither an index nor a GPU UUID"):
        device_index_from_uuid(True, uuids)


# ---------------------------------------------------------------------------------- engine <- trainer ranks


A, B = "10.0.0.1", "10.0.0.2"
# 2 nodes x 4 GPUs, 8 trainer ranks: Ray gives rank r some GPU of its node, in no particular order.
RAY_GPUS = {0: (A, 2), 1: (A, 0), 2: (A, 3), 3: (A, 1), 4: (B, 1), 5: (B, 3), 6: (B, 0), 7: (B, 2)}
RANKS = [RankGPU(rank, node, str(gpu)) for rank, (node, gpu) in RAY_GPUS.items()]
# 4 colocated engines of TP 2 laid over the same GPUs (the fleet's base GPU: index * tp % gpus per node).
ENGINES = [EngineGPUs(f"http://e{i}", A if i < 2 else B, (i * 2) % 4, 2) for i in range(4)]


def test_each_engine_tp_rank_is_fed_by_the_trainer_rank_on_its_gpu():
    assert engine_feeders(ENGINES, RANKS) == [(1, 3), (0, 2), (6, 4), (7, 5)]
    # one engine of TP 4 per node
    wide = [EngineGPUs("http://w0", A, 0, 4), EngineGPUs("http://w1", B, 0, 4)]
    assert engine_feeders(wide, RANKS) == [(1, 3, 0, 2), (6, 4, 7, 5)]


def test_an_engine_gpu_without_a_trainer_rank_is_named():
    ranks = [r for r in RANKS if r.rank != 5]  # nobody on GPU 3 of node B
    with pytest.raises(TensorSyncError) as failure:
        engine_feeders(ENGINES, ranks)
    message = str(failure.value)
    assert "engine 3 (http://e3) TP rank 1 runs on GPU 3 of node 10.0.0.2" in message
    assert "GPU 0: rank 6, GPU 1: rank 4, GPU 2: rank 7" in message
    with pytest.raises(TensorSyncError, match="node 10.0.0.9, .*trainer ranks there: none"):
        engine_feeders([EngineGPUs("http://x", "10.0.0.9", 0, 1)], RANKS)


def test_two_ranks_on_one_gpu_or_a_gpu_that_is_no_number_are_refused():
    with pytest.raises(TensorSyncError, match="ranks 0 and 8 both report GPU 2 of node 10.0.0.1"):
        engine_feeders(ENGINES, [*RANKS, RankGPU(8, A, 2)])
    with pytest.raises(TensorSyncError, match="rank 0 reports GPU 'GPU-1234', not a GPU number"):
        engine_feeders(ENGINES, [RankGPU(0, A, "GPU-1234")])


def test_feeds_roles_and_tp_order_for_the_push():
    feeds = plan_feeds(ENGINES, RANKS)
    assert feeds[0] == EngineFeed("http://e0", (1, 3)) and feeds[3] == EngineFeed("http://e3", (7, 5))
    assert tp_roles(feeds, 3) == [(0, 1)] and tp_roles(feeds, 6) == [(2, 0)]
    shared = [EngineFeed("http://a", (2, 0)), EngineFeed("http://b", (0,))]  # rank 0 feeds two engines
    assert tp_roles(shared, 0) == [(0, 1), (1, 0)] and tp_roles(shared, 5) == []
    # gather_object returns entries in the order of the group's (sorted) ranks, not the TP order
    assert in_tp_order([(1, "from rank 0"), (0, "from rank 2")], shared[0]) == ["from rank 2", "from rank 0"]
    with pytest.raises(TensorSyncError, match=r"http://a: no tensors for TP rank\(s\) \[1\] \(trainer rank\(s\) \[0\]"):
        in_tp_order([(1, None), (0, "from rank 2")], shared[0])


# ----------------------------------------------------------------------------------------------- CUDA


SENDER = textwrap.dedent(
    """
    import sys, torch
    from forge_replay.runtime.weights.ipc import device_uuid, serialize_named_tensors
    gen = torch.Generator().manual_seed(11)
    named = [("a", torch.randn(64, 32, generator=gen).to(torch.bfloat16).cuda()),
             ("b", torch.randn(32, 16, generator=gen).cuda().t())]
    abs_sum = sum(float(t.double().abs().sum()) for _, t in named)
    print(device_uuid(0), abs_sum, serialize_named_tensors(named), sep="\\n", flush=True)
    sys.stdin.readline()  # the tensors stay alive until the receiver is done
    """
)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_reach_a_process_that_sees_every_gpu_on_the_senders_gpu():
    """The sender sees only the last GPU (as cuda:0, like a trainer rank); this process sees them all."""
    last = torch.cuda.device_count() - 1
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(last)}
    sender = subprocess.Popen([sys.executable, "-c", SENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env, cwd=str(REPO))
    try:
        uuid, checksum, payload = (sender.stdout.readline().strip() for _ in range(3))
        assert uuid == str(torch.cuda.get_device_properties(last).uuid)
        strings = {arg for _, arg, _ in pickletools.genops(base64.b64decode(payload)) if isinstance(arg, str)}
        assert uuid in strings  # the device travels as its UUID, not as the sender's index 0
        named = decode_named_tensors(payload)
        gen = torch.Generator().manual_seed(11)
        a, b = torch.randn(64, 32, generator=gen).to(torch.bfloat16), torch.randn(32, 16, generator=gen).t()
        assert [n for n, _ in named] == ["a", "b"]
        assert all(t.device == torch.device("cuda", last) for _, t in named)
        assert torch.equal(named[0][1].cpu(), a) and torch.equal(named[1][1].cpu(), b)
        assert summarize(named)["abs_sum"] == pytest.approx(float(checksum), rel=1e-9)
        del named
        torch.cuda.synchronize()
    finally:
        sender.communicate("done\n", timeout=60)
    assert sender.returncode == 0
