"""An engine's out-of-memory read from what sglang 0.5.23 (and Ray 2.60) really produce: sglang's own exceptions,
raised by sglang's own code where it runs on CPU and logged as its scheduler logs them; torch's allocator message as
torch formats it; Ray's memory monitor's exception with the message Ray gave on this machine."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from forge_replay.api.outcome import OutOfMemory, RanOutOfMemory
from forge_replay.runtime.engines.oom import EngineAt, engine_record, ray_monitor_record, read_answer, read_log
from forge_replay.runtime.engines.process import EngineProcess

GOLDEN = Path(__file__).parent / "golden"
DOUBLES = Path(__file__).resolve().parents[1] / "doubles"

TORCH_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB is "
    "free. Process 4242 has 30.00 GiB memory in use. Including non-PyTorch memory, this process has 47.60 GiB "
    "memory in use. Of the allocated memory 45.00 GiB is allocated by PyTorch, and 1.25 GiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-"
    "alloc-conf)"
)
"""torch 2.15's message (``c10/cuda/CUDACachingAllocator.cpp``, the strings in libc10_cuda.so): there is no GPU
here to make the allocator say it, so it is written as the allocator formats it, another process on the GPU
included (``Process P has X memory in use.``)."""


def scheduler_log(raise_it) -> str:
    """What sglang's server writes when ``raise_it()`` raises in its scheduler: ``run_scheduler_process``'s
    ``logger.error(f"Scheduler hit an exception: {get_exception_traceback()}")`` (managers/scheduler.py:6370-6373,
    the traceback from sglang's own ``get_exception_traceback``, sglang/utils.py:119-122) with sglang's log format
    (utils/common.py:2630-2637), then the launcher's SIGQUIT line (entrypoints/engine.py:1976-1979)."""
    utils = pytest.importorskip("sglang.utils")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("sglang.srt.managers.scheduler.test")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise_it()
        except Exception:  # noqa: BLE001 - as run_scheduler_process catches it
            logger.error(f"Scheduler hit an exception: {utils.get_exception_traceback()}")
        logger.error("Received sigquit from a child process. It usually means the child failed.")
    finally:
        logger.removeHandler(handler)
    return "[2026-12-02 10:00:00] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16\n" + stream.getvalue()


def test_sglangs_own_kv_cache_refusal_is_read_from_the_log_and_names_engine_phase_and_fraction():
    pool = pytest.importorskip("sglang.srt.model_executor.pool_configurator")
    # sglang's MemoryPoolConfig.__post_init__ refuses a pool of no token (model_executor/pool_configurator.py:94-99)
    text = scheduler_log(lambda: pool.MemoryPoolConfig(max_total_num_tokens=0))
    refusal = read_log(text)
    assert refusal is not None and refusal.kv_cache
    assert refusal.message == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert "pool_configurator.py:94-99" in refusal.source
    record = engine_record(refusal, EngineAt(engine=1, phase="engineStart", pid=4321, node="10.0.0.7",
                                             mem_fraction_static="0.5"))
    assert record.signal == "sglangRefusal" and record.where.component == "engine"
    assert (record.where.engine, record.where.pid, record.where.node) == (1, 4321, "10.0.0.7")
    assert record.when.phase == "engineStart" and record.when.rollout is None
    assert "mem-fraction-static 0.5" in record.message and "could not size its KV cache" in record.message
    assert record.line().startswith("out of memory (sglangRefusal): engine 1 on 10.0.0.7, engineStart")
    again = RanOutOfMemory(record)
    import pickle

    assert pickle.loads(pickle.dumps(again)).record == record  # crosses Ray intact


def test_weights_leaving_no_room_for_the_kv_cache_is_read_and_the_double_says_it_as_sglang_does(monkeypatch):
    """sglang's own ``_profile_available_bytes`` (mem_cache/kv_cache_configurator.py:2990-3060) run with the figures of
    a device that the weights fill past the static budget: it raises the ValueError of :3043-3058."""
    kvc = pytest.importorskip("sglang.srt.mem_cache.kv_cache_configurator")
    monkeypatch.setattr(kvc, "get_available_gpu_memory", lambda *a, **k: 0.5)  # GiB free after the weights
    monkeypatch.setattr(kvc, "get_parallel", lambda: NS(launch_world_size=1, world_group=NS(cpu_group=None)))
    monkeypatch.setattr(kvc, "get_schedule", lambda: NS(mem_fraction_static=0.4, prefill_max_requests=None))
    monkeypatch.setattr(kvc, "get_exec", lambda: NS(graph=NS(cuda_graph_config=NS(
        prefill=NS(full_prefill_max_req=None, backend=None)))))
    monkeypatch.setattr(kvc, "get_disagg", lambda: NS(disaggregation_mode="null"))
    monkeypatch.setattr(kvc, "get_mm", lambda: NS(mm_feature_transport=None))
    configurator = NS(device="cuda", gpu_id=0, mambaish_config=None, model_config=NS(is_multimodal=False),
                      post_capture_kv_active=False)
    with pytest.raises(ValueError) as raised:
        kvc.KVCacheConfigurator._profile_available_bytes(configurator, 1.0)  # 1 GiB before the weights
    refusal = read_log(scheduler_log(lambda: kvc.KVCacheConfigurator._profile_available_bytes(configurator, 1.0)))
    assert refusal is not None and refusal.kv_cache
    assert refusal.message == f"ValueError: {raised.value}"
    # the double raises this one with sglang's text (it cannot call sglang's method without sglang's runtime)
    memory = _load_double_memory()
    assert memory.weights_leave_no_room(0.4, 0.5) == str(raised.value)


def _load_double_memory():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_double_memory_test", DOUBLES / "sglang_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_cuda_oom_while_serving_gives_its_figures():
    import torch

    def forward():
        raise torch.OutOfMemoryError(TORCH_OOM)

    refusal = read_log(scheduler_log(forward))
    assert refusal is not None and not refusal.kv_cache
    assert refusal.message.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert refusal.requested_bytes == 2 << 30
    assert refusal.device_total_bytes == int(79.19 * (1 << 30)) and refusal.device_free_bytes == int(1.5 * (1 << 30))
    assert refusal.allocated_bytes == 45 << 30 and refusal.reserved_bytes == int(46.25 * (1 << 30))
    assert refusal.held_by_others_bytes == 30 << 30
    record = engine_record(refusal, EngineAt(engine=0, phase="engineServing", rollout=3))
    assert record.when.rollout == 3 and record.how_much.requested_bytes == 2 << 30
    assert "mem-fraction-static not set" in record.message
    assert record.line() == ("out of memory (sglangRefusal): engine 0, rollout 3 engineServing; requested 2.00 GiB, "
                             "allocated 45.00 GiB, reserved 46.25 GiB, device total 79.19 GiB")


def test_a_kv_pool_that_cannot_take_a_prefill_keeps_its_lines():
    """mem_cache/allocation.py:237-246: a RuntimeError of several lines."""
    message = "Prefill out of memory. Try to lower your batch size.\nTry to allocate 8192 tokens.\navailable: 12"

    def prefill():
        raise RuntimeError(message)

    refusal = read_log(scheduler_log(prefill))
    assert refusal is not None and refusal.message == f"RuntimeError: {message}"
    assert "allocation.py:237-246" in refusal.source


def test_other_deaths_are_not_out_of_memory():
    assert read_log("") is None
    assert read_log("[2026-12-02 10:00:00] Received sigquit from a child process. It usually means the child "
                    "failed.\n") is None  # a SIGKILL (-9) alone, or a child dying of anything: not out of memory

    def other():
        raise RuntimeError("Not enough GPUs: tp_size 8 > 1")

    assert read_log(scheduler_log(other)) is None
    # the sentence outside a scheduler's exception block (a user's prompt, a warning) is not the cause
    assert read_log("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n") is None


def test_an_earlier_process_of_the_engine_is_not_read_as_this_ones(tmp_path):
    pool = pytest.importorskip("sglang.srt.model_executor.pool_configurator")
    log_path = tmp_path / "engine-0.log"
    log_path.write_text(scheduler_log(lambda: pool.MemoryPoolConfig(max_total_num_tokens=0)))
    engine = EngineProcess([sys.executable, "-c", "print('restarted, then killed')"], "http://127.0.0.1:1", log_path)
    engine.start()
    engine.process.wait(timeout=60)
    assert "restarted, then killed" in engine.log_since_start()
    assert read_log(engine.log_since_start()) is None
    assert read_log(log_path.read_text()) is not None  # the whole file still holds the first one's


def test_a_weight_update_answered_out_of_memory():
    """sglang 0.5.23 catches an allocation that fails while receiving a bucket and answers ``success: false``
    (managers/scheduler_components/weight_updater.py:201-211); forge-replay's error carries the answer."""
    answer = ('POST http://127.0.0.1:30000/update_weights_from_distributed answered 400: {"success": false, '
              f'"message": "Failed to receive weights: {TORCH_OOM}"}}')
    refusal = read_answer(answer)
    assert refusal is not None and refusal.message.startswith("Failed to receive weights: CUDA out of memory.")
    assert refusal.requested_bytes == 2 << 30
    assert read_answer('answered 400: {"success": false, "message": "Failed to update parameter online: shape '
                       'mismatch"}') is None


def test_rays_memory_monitor_killing_an_engine_actor():
    """``ray.exceptions.OutOfMemoryError`` (not a RayActorError) with the message Ray 2.60's monitor gave on this
    machine (/tmp/issue31 experiment b, golden/ray_2.60_memory_monitor_message.txt)."""
    import ray

    error = ray.exceptions.OutOfMemoryError((GOLDEN / "ray_2.60_memory_monitor_message.txt").read_text())
    assert not isinstance(error, ray.exceptions.RayActorError)
    record = ray_monitor_record(str(error), EngineAt(engine=2, phase="engineServing", rollout=5))
    assert isinstance(record, OutOfMemory) and record.signal == "rayMemoryMonitor"
    assert (record.where.engine, record.where.node, record.where.pid) == (2, "192.0.2.2", 10883)
    assert record.how_much.limit_bytes == 25276059648 and record.when.rollout == 5
    assert "Selected to kill" in record.message and len(record.message) <= 2000


def test_the_double_refuses_a_kv_cache_that_does_not_fit_with_sglangs_own_exception(tmp_path):
    """The double's budget (tests/doubles/sglang_memory.py) on a stand-in device: weights past the static budget, a
    budget under one token, and room to serve."""
    import json

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256}))
    memory = _load_double_memory()
    args = NS(model_path=str(model), dtype="float32", kv_cache_dtype="auto", mem_fraction_static=0.5, page_size=None,
              tp_size=1)
    weights = memory.plan_memory(args, 1 / 1024).weights_bytes
    assert weights == 25696 * 4  # the model's parameters (embeddings, one layer, norm, head) in float32
    tight = memory.plan_memory(args, (weights + 64) / 0.5 / (1 << 30))  # half a cell (128 bytes) of budget
    assert tight.cell_size == 128 and tight.max_total_num_tokens == 0
    assert tight.refusal == "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    small = memory.plan_memory(args, weights / (1 << 30))
    assert small.refusal.startswith("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                                    "--mem-fraction-static=0.5.")
    roomy = memory.plan_memory(args, 1 / 1024)
    # sglang's budget, in GiB floats (kv_cache_configurator.py:3007-3060): half the device less the weights
    assert roomy.refusal is None and abs(roomy.max_total_num_tokens - ((1 << 19) - weights) // 128) <= 1
    assert roomy.free_bytes == (1 << 20) - weights - roomy.kv_pool_bytes


def test_a_push_that_failed_for_memory_keeps_the_record_across_ray():
    """The driver's weight sync (runtime/weights/sync.py) keeps an engine's RanOutOfMemory whole through the
    PushFailed it raises when one side of a push fails (Ray pickles it between the rollout manager and the driver)."""
    import pickle

    from forge_replay.runtime.weights.sync import PushFailed

    record = engine_record(read_answer(f"Failed to receive weights: {TORCH_OOM}"),
                           EngineAt(engine=1, phase="engineServing", rollout=2))
    failed = pickle.loads(pickle.dumps(PushFailed("broadcasting weight version 3: ...", stuck=[],
                                                  out_of_memory=RanOutOfMemory(record))))
    assert isinstance(failed.out_of_memory, RanOutOfMemory) and failed.out_of_memory.record == record
