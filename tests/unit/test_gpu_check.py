"""benches/gpu_check.py's comparisons: each one passes what it should and fails what it should."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PATH = Path(__file__).resolve().parents[2] / "benches" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_check", None)


@pytest.mark.parametrize("reported, measured, ok", [
    (61.20, 61.20, True),
    (61.20, 61.80, True),  # 0.97%
    (61.20, 62.00, False),  # 1.3%
    (None, 1.0, False),  # the report lost the figure
])
def test_memory_figures_allow_one_percent(gpu_check, reported, measured, ok):
    [figure] = gpu_check.memory_figures("step 1", {"peak_allocated_gib": reported}, {"peak_allocated_gib": measured})
    assert figure.ok is ok
    assert figure.name == "step 1 peak_allocated_gib" and ("OK" if ok else "FAIL") in figure.line()


def test_memory_figures_compare_every_figure_read(gpu_check):
    figures = gpu_check.memory_figures("s", {"peak_allocated_gib": 10.0, "peak_reserved_gib": 20.0},
                                       {"peak_allocated_gib": 10.0, "peak_reserved_gib": 12.0})
    assert [f.ok for f in figures] == [True, False]


@pytest.mark.parametrize("ops, backends, on_gpu_ok", [
    (["aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"],
     ["flash"], True),
    (["aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_backward"], ["efficient"], True),
    (["aten::_scaled_dot_product_cudnn_attention"], ["cudnn"], True),
    (["aten::_scaled_dot_product_attention_math", "aten::bmm"], ["math"], False),
    (["aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_attention_math"], ["flash", "math"],
     False),
    (["aten::_scaled_dot_product_flash_attention_for_cpu"], ["flash"], True),
    (["aten::mm", "aten::softmax"], [], False),  # no sdpa at all (eager attention): not the trainer's path
])
def test_sdpa_kernels_are_told_apart_and_only_fused_ones_pass_on_gpu(gpu_check, ops, backends, on_gpu_ok):
    assert gpu_check.sdpa_backends(ops) == backends
    assert gpu_check.kernel_figure(backends, on_gpu=True).ok is on_gpu_ok
    assert gpu_check.kernel_figure(backends, on_gpu=False).ok is None  # CPU: recorded only


def test_relative_error(gpu_check):
    ref = torch.tensor([3.0, 4.0])
    assert gpu_check.relative_error(ref, ref) == 0.0
    assert gpu_check.relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert gpu_check.relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert gpu_check.relative_error(torch.ones(2), torch.zeros(2)) == float("inf")
    assert gpu_check.bf16_bound(0.01) == pytest.approx(0.021)


def test_tensor_digests_see_every_bit(gpu_check):
    tensor = torch.randn(4, 6).to(torch.bfloat16)
    flipped = tensor.clone()
    flipped.view(torch.int16)[2, 3] ^= 1  # the lowest mantissa bit of one element
    view = tensor[1:3]
    assert gpu_check.tensor_digest("w", tensor) == gpu_check.tensor_digest("w", tensor.clone())
    assert gpu_check.tensor_digest("w", flipped)["sha256"] != gpu_check.tensor_digest("w", tensor)["sha256"]
    assert gpu_check.tensor_digest("v", view)["bytes"] == 2 * 6 * 2
    assert gpu_check.tensor_digest("s", torch.tensor(3.5))["shape"] == []
    assert gpu_check.tensor_digest("t", torch.randn(3, 5).t())["shape"] == [5, 3]


def test_ipc_figures_fail_on_any_difference(gpu_check):
    named = [("a", torch.arange(6.0)), ("b", torch.ones(3, dtype=torch.int64))]
    sent = [gpu_check.tensor_digest(n, t) for n, t in named]
    [same] = gpu_check.ipc_figures(sent, [dict(d) for d in sent])
    assert same.ok is True and same.value == "2/2"
    changed = [dict(d) for d in sent]
    changed[1]["sha256"] = "0" * 64
    [differs] = gpu_check.ipc_figures(sent, changed)
    assert differs.ok is False and "b" in differs.detail and differs.value == "1/2"
    [short] = gpu_check.ipc_figures(sent, sent[:1])
    assert short.ok is False and "1 tensors received, 2 sent" in short.detail
    other_gpu = [dict(d) for d in sent]
    other_gpu[0]["device"] = "GPU-00000000"
    assert gpu_check.ipc_figures(sent, other_gpu)[0].ok is False


def test_exit_code_fails_only_on_a_failed_comparison(gpu_check):
    figure = gpu_check.Figure
    assert gpu_check.exit_code([figure("c", "x", 1.0, ok=True), figure("c", "y", 2.0)]) == 0
    assert gpu_check.exit_code([figure("c", "x", 1.0, ok=True), figure("c", "z", "boom", ok=False)]) == 1


def test_gpu_sizes_are_the_issues(gpu_check):
    sizes = gpu_check.gpu_sizes()
    assert sizes.lengths == (32768, 65536) and sizes.steps == 3
    assert sizes.model["architectures"] == ["Qwen3ForCausalLM"] and sizes.model["hidden_size"] == 2048
    assert sizes.model["num_hidden_layers"] == 28  # the 1.7B shape, from benches/gpu_memory_peak.py


def test_the_out_of_memory_micro_batch_asks_for_one_and_a_half_devices(gpu_check):
    h200 = 143_771_369_472  # torch.cuda.get_device_properties(0).total_memory of an H200
    samples = gpu_check.oom_samples(h200)
    logits = samples * gpu_check.OOM_SAMPLE * gpu_check.OOM_VOCAB * 2
    assert samples == 128 and logits == 2**38 >= 1.5 * h200  # 256 GiB of bf16 logits, a power of two
    assert gpu_check.oom_samples(80 * 2**30) == 64


def oom_record(signal="cudaAllocator", phase="forward", rollout=0, requested=2**38, snapshot="snap.pickle",
               others=2**29):
    return {"signal": signal, "when": {"phase": phase, "rollout": rollout}, "snapshot": snapshot,
            "how_much": {"requested_bytes": requested, "allocated_bytes": 2**30, "reserved_bytes": 2**31,
                         "held_by_others_bytes": others}}


def snapshot_file(path, actions):
    """A file in the format of torch.cuda.memory._snapshot() (torch/cuda/memory.py: ``device_traces``, one list of
    trace entries per device, each with its ``action``)."""
    import pickle

    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": a, "size": 2**38} for a in actions]]}))
    return path


def test_the_out_of_memory_record_passes_only_as_provoked(gpu_check, tmp_path):
    total, logits = 143_771_369_472, 2**38
    snapshot = snapshot_file(tmp_path / "snap.pickle", ["alloc", "free_requested", "oom"])
    assert all(f.ok for f in gpu_check.oom_figures(oom_record(), total, logits, snapshot))
    failed = {name: [f.name for f in gpu_check.oom_figures(record, total, logits, snap) if f.ok is False]
              for name, record, snap in [
                  ("signal", oom_record(signal="cpuAllocator"), snapshot),
                  ("phase", oom_record(phase="backward"), snapshot),
                  ("requested", oom_record(requested=2**20), snapshot),  # not the logits' allocation
                  ("no bytes", oom_record(requested=None), snapshot),
                  ("no others", oom_record(others=None), snapshot),
                  ("no snapshot", oom_record(snapshot=None), None),
                  ("no oom in it", oom_record(), snapshot_file(tmp_path / "other.pickle", ["alloc"])),
              ]}
    assert failed == {"signal": ["signal / phase / rollout"], "phase": ["signal / phase / rollout"],
                      "requested": ["bytes requested"], "no bytes": ["bytes requested"],
                      "no others": ["held by others at the moment"],
                      "no snapshot": ["snapshot"], "no oom in it": ["snapshot"]}
    [fitted] = gpu_check.oom_figures(None, total, logits, None)  # nothing raised: the check fails
    assert fitted.ok is False and "fitted" in fitted.detail
