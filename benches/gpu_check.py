"""GPU check for a bare torch machine: trainer memory on long context, packed attention on GPU, CUDA IPC, out of memory.

No Ray and no sglang anywhere on its path (both are blocked: an import of either fails the check). It drives
forge-replay's own code directly: the rollout manager's conversion, rank split and packing, one trainer rank
(FSDP2, the loss, the memory probe), the report's records, summary and memory plot, the packed attention,
and the tensor path's IPC encoding. Four checks:

1. memory: a Qwen3-1.7B-like config (random init, bf16, gradient checkpointing) on synthesized slime-format
   dumps of 32k and 64k tokens per sample, three steps each: the report's per-step peak allocated and
   reserved beside ``torch.cuda.max_memory_allocated/reserved()`` read by this script (within 1%); tokens/s.
2. attention: the trainer's per-sample causal attention in bf16 against the reference (each sample alone through
   transformers' eager attention in float32, same weights): logits and every gradient within bf16 tolerance
   (at most twice the error of the same reference run in bf16); the profiler must show a flash,
   memory-efficient or cuDNN sdpa kernel and no math kernel. A leak control (one segment over the whole
   micro-batch) must be caught, so the comparison is known to be able to fail.
3. ipc: the tensor path's payload (``serialize_named_tensors`` of GPU tensors, in the
   ``/update_weights_from_tensor`` body) opened by another process with the sglang double's decoder and
   compared bit for bit; the receiver writes through the shared memory and the sender sees it.
4. oom: a real CUDA out-of-memory at a known phase: one micro-batch whose bf16 logits ask for 1.5x the device's
   memory, through the rollout manager and one trainer rank with ``memorySnapshot``: the rank's forward must raise
   the run's record (cudaAllocator, phase forward, rollout 0, the bytes requested as torch's OOM observer saw them,
   at least the device's total) and write the CUDA memory snapshot at that moment (a pickle whose trace holds the
   ``oom`` event). Skipped, said so, without a GPU.

    python benches/gpu_check.py --wheels .gpu-wheels          # one GPU: $OUT/gpu_check.json + $OUT/memory.png
    python benches/gpu_check.py --cpu-smoke --out DIR         # the same code paths, tiny sizes, on CPU (CI)
    python benches/gpu_check.py --collect-wheels .gpu-wheels  # here, with network: the wheels a GPU machine lacks

Prints one line per figure and exits 1 when a comparison fails or a check breaks. docs/benchmarks.md
("GPU check") has the device-tool command.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path

_STARTED = time.monotonic()  # torch, transformers and forge_replay are imported later: the budget counts them
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_args import existing_dir, output_dir, positive_int  # noqa: E402
DOUBLE_DECODER = REPO / "tests" / "doubles" / "tensor_payload.py"
BLOCKED = ("ray", "sglang")
"""Never imported on the check's path: the GPU machine has neither (and the Ray wheel cannot travel)."""

GPU_WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
"""What forge-replay's path needs that a bare torch machine lacks (pydantic for the spec models)."""

MEMORY_TOLERANCE = 0.01
"""The report's per-step peak against this script's own read: relative difference at most 1%."""
BF16_FACTOR, BF16_FLOOR = 2.0, 1e-3
"""Packed attention in bf16 against the float32 reference: the relative error ||ours - ref|| / ||ref|| of the
logits and of every parameter's gradient may be at most FACTOR x that of the bf16 reference, + FLOOR."""
FUSED_SDPA = ("flash", "efficient", "cudnn")
TIME_BUDGET_S = 480
"""The whole check on one GPU, imports included, must fit in 8 minutes (a device lease is 15)."""

_SDPA_OPS = {
    "flash": ("_scaled_dot_product_flash_attention",),  # also ..._for_cpu
    "efficient": ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"),
    "cudnn": ("_scaled_dot_product_cudnn_attention",),
    "math": ("_scaled_dot_product_attention_math",),
}


# ------------------------------------------------------------------------------------------- sizes


def qwen3_1_7b_like() -> dict:
    """The config benches/gpu_memory_peak.py uses (one definition, loaded by path: benches is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_memory_peak", HERE / "gpu_memory_peak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.QWEN3_1_7B_LIKE)


TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 512, "max_position_embeddings": 4096, "rope_theta": 1000000, "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Sizes:
    model: dict
    lengths: tuple[int, ...]
    """Tokens per sample (prompt + response), one dump and ``steps`` steps each."""
    prompt_len: int
    samples: int
    """Samples per step, one group (one micro-batch each)."""
    steps: int
    attention_model: dict
    attention_lengths: tuple[int, ...]
    """The samples packed into the attention check's micro-batch."""
    ipc_shape: tuple[int, int]


def gpu_sizes() -> Sizes:
    model = qwen3_1_7b_like()
    return Sizes(model=model, lengths=(32768, 65536), prompt_len=1024, samples=2, steps=3,
                 attention_model=dict(model, num_hidden_layers=2, vocab_size=16384),
                 attention_lengths=(3000, 1096, 4096), ipc_shape=(32768, 2048))


OOM_VOCAB, OOM_SAMPLE = 2**18, 4096
"""The out-of-memory check's model vocabulary and sample length: its logits grow with the samples of its one
micro-batch."""


def oom_samples(device_total: int, vocab: int = OOM_VOCAB, sample_len: int = OOM_SAMPLE) -> int:
    """Samples of ``sample_len`` tokens whose one micro-batch's bf16 logits ([tokens, vocab] x 2 bytes) ask for
    at least 1.5x ``device_total``: a power of two (at least one group of 2), so that torch's allocator asks exactly
    that (no rounding)."""
    samples = 2
    while samples * sample_len * vocab * 2 < device_total * 3 // 2:
        samples *= 2
    return samples


def cpu_sizes() -> Sizes:
    return Sizes(model=TINY_QWEN3, lengths=(256, 512), prompt_len=32, samples=2, steps=3,
                 attention_model=TINY_QWEN3, attention_lengths=(40, 72, 24), ipc_shape=(64, 32))


# ------------------------------------------------------------------------------ figures (pure)


@dataclass
class Figure:
    """One printed line: ``ok`` is True/False for a comparison, None for a figure that is only recorded."""

    check: str
    name: str
    value: float | str
    unit: str = ""
    detail: str = ""
    ok: bool | None = None

    def line(self) -> str:
        value = f"{self.value:.4g}" if isinstance(self.value, float) else str(self.value)
        verdict = {True: "OK", False: "FAIL", None: "info"}[self.ok]
        return f"{self.check}: {self.name} = {value}{' ' + self.unit if self.unit else ''}" \
               f"{'  (' + self.detail + ')' if self.detail else ''}  [{verdict}]"


def relative_difference(reported: float, measured: float) -> float:
    """|reported - measured| / measured (0 when both are 0)."""
    if measured == 0:
        return 0.0 if reported == 0 else float("inf")
    return abs(reported - measured) / abs(measured)


def memory_figures(label: str, reported: dict, measured: dict, tolerance: float = MEMORY_TOLERANCE) -> list[Figure]:
    """The report's peaks of one step against this script's own read, key by key (GiB)."""
    figures = []
    for key, value in measured.items():
        mine = reported.get(key)
        diff = float("inf") if mine is None else relative_difference(mine, value)
        figures.append(Figure("memory", f"{label} {key}", float(mine) if mine is not None else "missing", "GiB",
                              f"own read {value:.4f} GiB, diff {100 * diff:.3f}% <= {100 * tolerance:g}%",
                              diff <= tolerance))
    return figures


def sdpa_backends(op_names) -> list[str]:
    """Which sdpa backends a profile shows, from its op names (``aten::_scaled_dot_product_..``)."""
    seen = set()
    for name in op_names:
        for backend, markers in _SDPA_OPS.items():
            if any(marker in name for marker in markers):
                seen.add(backend)
    return sorted(seen)


def kernel_figure(backends: list[str], on_gpu: bool) -> Figure:
    """On GPU a fused sdpa kernel and no math kernel; on CPU the backend is only recorded."""
    fused = [b for b in backends if b in FUSED_SDPA]
    ok = (bool(fused) and "math" not in backends) if on_gpu else None
    return Figure("attention", "sdpa kernel", ",".join(backends) or "none", "",
                  "needs flash, efficient or cudnn and no math" if on_gpu else "recorded only on CPU", ok)


def relative_error(ours, ref) -> float:
    """||ours - ref|| / ||ref|| in float64 (0 when both are zero)."""
    ours, ref = ours.detach().double(), ref.detach().double()
    norm = float(ref.norm())
    diff = float((ours - ref).norm())
    return diff / norm if norm else (0.0 if diff == 0 else float("inf"))


def tensor_digest(name: str, tensor) -> dict:
    """What the IPC round trip compares: name, dtype, shape, device UUID (or "cpu") and sha256 of the bytes."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).cpu().numpy().tobytes()
    device = str(torch.cuda.get_device_properties(tensor.device).uuid) if tensor.is_cuda else "cpu"
    return {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
            "device": device, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}


def ipc_figures(sent: list[dict], received: list[dict]) -> list[Figure]:
    """Every tensor identical on both sides (bytes, dtype, shape, GPU), in the same order."""
    keys = ("name", "dtype", "shape", "device", "sha256")
    same = sum(1 for a, b in zip(sent, received) if all(a[k] == b[k] for k in keys))
    bad = [a["name"] for a, b in zip(sent, received) if any(a[k] != b[k] for k in keys)]
    if len(received) != len(sent):
        bad.append(f"{len(received)} tensors received, {len(sent)} sent")
    return [Figure("ipc", "tensors identical bit for bit", f"{same}/{len(sent)}", "",
                   "differ: " + ", ".join(bad) if bad else f"{sum(d['bytes'] for d in sent)} bytes",
                   not bad)]


def snapshot_has_oom(path: Path) -> bool:
    """Whether a CUDA memory snapshot (torch.cuda.memory._dump_snapshot's pickle) holds the ``oom`` event of its
    trace (torch/cuda/memory.py: "'size' is the requested number of bytes that did not succeed")."""
    import pickle

    with path.open("rb") as handle:
        snapshot = pickle.load(handle)
    return any(entry.get("action") == "oom" for trace in snapshot.get("device_traces") or [] for entry in trace)


def oom_figures(record: dict | None, device_total: int, logits_bytes: int, snapshot: Path | None) -> list[Figure]:
    """The out-of-memory check's record against what it provoked: its signal, phase and rollout, the bytes
    requested (at least the device's total, at most the logits), the snapshot written with its ``oom`` event."""
    if record is None:
        return [Figure("oom", "raised", "nothing", "", f"{logits_bytes / 2**30:.1f} GiB of logits fitted", False)]
    when, much = record["when"], record["how_much"]
    requested = much.get("requested_bytes")
    written = snapshot is not None and snapshot.is_file()
    return [
        Figure("oom", "signal / phase / rollout", f"{record['signal']} / {when['phase']} / {when['rollout']}", "",
               "expected cudaAllocator / forward / 0",
               (record["signal"], when["phase"], when["rollout"]) == ("cudaAllocator", "forward", 0)),
        Figure("oom", "bytes requested", float(requested or 0) / 2**30, "GiB",
               f"the observer's; device total {device_total / 2**30:.1f} GiB, logits {logits_bytes / 2**30:.1f} GiB",
               requested is not None and device_total <= requested <= logits_bytes),
        Figure("oom", "allocated / reserved at the moment", f"{(much.get('allocated_bytes') or 0) / 2**30:.2f} / "
               f"{(much.get('reserved_bytes') or 0) / 2**30:.2f}", "GiB", "memory_stats in the observer",
               much.get("allocated_bytes") is not None and much.get("reserved_bytes") is not None),
        Figure("oom", "held by others at the moment", float(much.get("held_by_others_bytes") or 0) / 2**30, "GiB",
               "device used less this process's reserved: its CUDA context, other processes",
               much.get("held_by_others_bytes") is not None),
        Figure("oom", "snapshot", record.get("snapshot") or "none", "", "written at the moment, with its oom event",
               written and snapshot_has_oom(snapshot)),
    ]


def exit_code(figures: list[Figure]) -> int:
    return 1 if any(f.ok is False for f in figures) else 0


# ------------------------------------------------------------------------------------- the checks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        import torch

        torch.cuda.synchronize()


def _own_peaks(on_gpu: bool) -> dict:
    """This script's read of the step's peaks (GiB), independent of the trainer's memory probe."""
    import torch

    from forge_replay.runtime.trainer.memory import GIB

    if on_gpu:
        torch.cuda.synchronize()
        return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return {"peak_rss_gib": int(line.split()[1]) * 1024 / GIB}
    raise RuntimeError("no VmHWM in /proc/self/status: the CPU smoke needs Linux")


def _job_doc(sizes: Sizes, length: int, on_gpu: bool) -> dict:
    return {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": f"gpu-check-{length}"},
        "spec": {
            "replay": {"mode": "debug", "dumps": {"claimName": "gpu-check", "path": f"long-{length}.pt"},
                       "numRollouts": sizes.steps, "verify": False},
            "model": {"config": dict(sizes.model)},
            "trainer": {"nodes": 1, "gpusPerNode": 1 if on_gpu else 0, "microBatchTokens": length,
                        "dtype": "bfloat16", "gradientCheckpointing": True, "learningRate": 1e-6,
                        "nSamplesPerPrompt": sizes.samples},
        },
    }


def check_memory(sizes: Sizes, on_gpu: bool, work: Path, out: Path) -> tuple[list[Figure], dict]:
    """Three steps per length on one trainer rank; each step's reported peaks against our own read."""
    import torch

    from forge_replay.api import parse_job
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples
    from forge_replay.runtime.report import RunReport, combine_rank_results, summarize, write_plot
    from forge_replay.runtime.rollout_manager import RolloutManager
    from forge_replay.runtime.trainer.model import model_source
    from forge_replay.runtime.trainer.rank import TrainerRank, trainer_settings

    vocab = sizes.model["vocab_size"]
    jobs = {}
    for length in sizes.lengths:
        samples = synth_samples(0, 1, sizes.samples, sizes.prompt_len, length - sizes.prompt_len, vocab_size=vocab)
        for i, sample in enumerate(samples):
            sample.reward = float(i % 2)  # both rewards in the group: non-zero advantages, a real gradient
        save(work / f"long-{length}.pt", 0, samples)
        jobs[length] = parse_job(_job_doc(sizes, length, on_gpu))
    first = jobs[sizes.lengths[0]]
    rank = TrainerRank(0, trainer_settings(first.spec.trainer))
    report = RunReport(job="gpu-check " + " + ".join(f"{n} tok x{sizes.steps}" for n in sizes.lengths),
                       mode="debug", world_size=1, device="cuda:0" if on_gpu else "cpu", num_params=0,
                       started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    figures: list[Figure] = []
    details: dict = {"own_peaks": [], "tolerance": MEMORY_TOLERANCE}
    try:
        rank.init_process_group("127.0.0.1", _free_port())
        began = time.perf_counter()
        report.num_params = rank.setup(model_source(first.spec.model, None))["num_params"]
        details["setup_seconds"] = time.perf_counter() - began
        step = 0
        for length, job in jobs.items():
            manager = RolloutManager(job, str(work), world_size=1, vocab_size=vocab, use_object_store=False)
            records = []
            for rollout in range(sizes.steps):
                batch = manager.get_rollout(rollout)
                step += 1
                if on_gpu:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()  # our own window: the whole train_step call
                began = time.perf_counter()
                result = rank.train_step(step, batch.rank_batches[0], batch.loss_tokens)
                _sync(on_gpu)
                seconds = time.perf_counter() - began
                peaks = _own_peaks(on_gpu)
                record = combine_rank_results(step, batch, [result.to_dict()], batch.load_seconds, seconds)
                report.rollouts.append(record)
                records.append(record)
                details["own_peaks"].append({"step": step, "tokens_per_sample": length, **peaks})
                figures += memory_figures(f"{length} tok step {step}", record.memory[0], peaks)
            figures += throughput_figures(length, records)
    except Exception as exc:  # noqa: BLE001 - a failed step (out of memory, say) keeps the steps before it
        figures.append(Figure("memory", "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}", ok=False))
        details["traceback"] = traceback.format_exc()
    finally:
        rank.shutdown()
        del rank
    report.summary = summarize(report.rollouts, [], details.get("setup_seconds"))
    plot = write_plot(report, out)
    details.update(report=report.to_dict(), plot=plot.name if plot else None)
    return figures, details


def throughput_figures(length: int, records: list) -> list[Figure]:
    """tokens/s of one length's steps after the first (warm-up), by the report's own summary, and its losses."""
    from forge_replay.runtime.report import summarize

    steady = summarize(records[1:] or records, [], None)
    every = summarize(records, [], None)
    return [
        Figure("memory", f"{length} tok tokens/s", steady["tokens_per_second"], "tok/s",
               f"steps after the first; all {len(records)} steps: {every['tokens_per_second']:.0f} tok/s"),
        Figure("memory", f"{length} tok losses finite", str(every["all_losses_finite"]), "",
               f"first {every['first_loss']:.4g}, last {every['last_loss']:.4g}", every["all_losses_finite"]),
    ]


def _forward_backward(model, segments_of, total: int):
    """Logits (concatenated) and parameter gradients of ``sum(logits**2) / total`` over ``segments_of``'s calls."""
    import torch

    model.zero_grad(set_to_none=True)
    logits = []
    for call in segments_of:
        out = call(model)
        out.float().square().sum().div(total).backward()
        logits.append(out.detach())
    return torch.cat(logits), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def bf16_bound(reference_error: float) -> float:
    """What bf16 may cost: twice the plain bf16 reference's own error, plus a floor (FlashAttention's tests'
    rule, on norms)."""
    return BF16_FACTOR * reference_error + BF16_FLOOR


def check_attention(sizes: Sizes, on_gpu: bool) -> tuple[list[Figure], dict]:
    """The trainer's packed attention (bf16) against each sample alone through transformers' eager attention in
    float32; within bf16 tolerance means no worse than twice the same eager reference run in bf16 (+ a floor)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from forge_replay.runtime.trainer.batching import segment_bounds
    from forge_replay.dumps.model_config import config_from_dict
    from forge_replay.runtime.trainer.model import PACKED_ATTENTION, build_model

    device = "cuda" if on_gpu else "cpu"
    ours = build_model(sizes.attention_model, seed=0, gradient_checkpointing=False)
    refs = {}
    for dtype in (torch.float32, torch.bfloat16):
        ref = AutoModelForCausalLM.from_config(config_from_dict(sizes.attention_model), attn_implementation="eager",
                                               dtype=torch.float32)
        ref.load_state_dict(ours.state_dict())
        refs[dtype] = ref.to(device=device, dtype=dtype)
    ours.to(device=device, dtype=torch.bfloat16)
    figures = [Figure("attention", "implementation", ours.config._attn_implementation, "",
                      f"expected {PACKED_ATTENTION}", ours.config._attn_implementation == PACKED_ATTENTION)]
    vocab = sizes.attention_model["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, vocab, (n,), generator=generator).to(device) for n in sizes.attention_lengths]
    total = sum(sizes.attention_lengths)
    ids = torch.cat(samples).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in sizes.attention_lengths]).unsqueeze(0).to(device)
    bounds = torch.tensor(segment_bounds(positions[0].tolist()), dtype=torch.int32)  # host tensor, as the trainer

    def packed(segments):
        return [lambda model: model(input_ids=ids, position_ids=positions, use_cache=False,
                                    cu_seq_lens_q=segments).logits[0]]

    alone = [lambda model, s=s: model(input_ids=s.unsqueeze(0), use_cache=False).logits[0] for s in samples]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        logits, grads = _forward_backward(ours, packed(bounds), total)
        _sync(on_gpu)
    names = [event.key for event in prof.key_averages()]
    exact_logits, exact_grads = _forward_backward(refs[torch.float32], alone, total)
    bf16_logits, bf16_grads = _forward_backward(refs[torch.bfloat16], alone, total)
    # the control: one segment over the micro-batch, so later samples see earlier ones; it must be caught
    leaked, _ = _forward_backward(ours, packed(torch.tensor([0, total], dtype=torch.int32)), total)
    first = sizes.attention_lengths[0]
    logit_error, logit_bound = relative_error(logits, exact_logits), bf16_bound(relative_error(bf16_logits, exact_logits))
    leak_error = relative_error(leaked[first:], exact_logits[first:])
    grad_errors = {name: (relative_error(g, exact_grads[name]), bf16_bound(relative_error(bf16_grads[name], exact_grads[name])))
                   for name, g in grads.items()}
    worst = max(grad_errors, key=lambda name: grad_errors[name][0] / grad_errors[name][1])
    backends = sdpa_backends(names)
    figures += [
        Figure("attention", "logits rel error", logit_error, "", f"<= {logit_bound:.4g} (2x bf16 eager + "
               f"{BF16_FLOOR}), {len(samples)} samples, {total} tokens", logit_error <= logit_bound),
        Figure("attention", "worst gradient rel error", grad_errors[worst][0], "",
               f"{worst}, <= {grad_errors[worst][1]:.4g}", grad_errors[worst][0] <= grad_errors[worst][1]),
        Figure("attention", "leak control rel error", leak_error, "",
               f"one segment over all samples must exceed {logit_bound:.4g}", leak_error > logit_bound),
        kernel_figure(backends, on_gpu),
    ]
    kernels = sorted({n for n in names if any(k in n.lower() for k in ("flash", "fmha", "attention", "attn"))})
    details = {"lengths": list(sizes.attention_lengths), "logits_rel_error": logit_error, "logits_bound": logit_bound,
               "leak_control_rel_error": leak_error,
               "gradient_rel_errors": {n: {"error": e, "bound": b} for n, (e, b) in grad_errors.items()},
               "sdpa_backends": backends, "attention_ops_and_kernels": [k[:160] for k in kernels][:20]}
    return figures, details


def check_oom(sizes: Sizes, on_gpu: bool, work: Path, out: Path) -> tuple[list[Figure], dict]:
    """A micro-batch too large for the device, in the rank's forward: the record it raises, the snapshot it writes."""
    if not on_gpu:
        return [Figure("oom", "skipped", "no GPU", "", "a CUDA out-of-memory needs CUDA")], {"skipped": "no GPU"}
    import torch

    from forge_replay.api import parse_job
    from forge_replay.api.outcome import RanOutOfMemory
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples
    from forge_replay.runtime.rollout_manager import RolloutManager
    from forge_replay.runtime.trainer.model import model_source
    from forge_replay.runtime.trainer.rank import TrainerRank, trainer_settings

    total = torch.cuda.get_device_properties(0).total_memory
    samples = oom_samples(total)
    save(work / "oom.pt", 0, synth_samples(0, samples // 2, 2, 64, OOM_SAMPLE - 64, vocab_size=OOM_VOCAB))
    doc = _job_doc(sizes, OOM_SAMPLE, on_gpu)
    doc["spec"]["replay"].update(numRollouts=1, dumps={"claimName": "gpu-check", "path": "oom.pt"})
    doc["spec"]["model"]["config"] = dict(TINY_QWEN3, vocab_size=OOM_VOCAB, max_position_embeddings=OOM_SAMPLE)
    doc["spec"]["trainer"].update(microBatchTokens=samples * OOM_SAMPLE, memorySnapshot=True, nSamplesPerPrompt=2,
                                  gradientCheckpointing=False)
    job = parse_job(doc)
    rank = TrainerRank(0, trainer_settings(job.spec.trainer))
    record = None
    try:
        rank.init_process_group("127.0.0.1", _free_port())
        rank.watch.arm(None, str(out), memory_snapshot=True)  # no phase board here (no Ray): the record and snapshot
        rank.setup(model_source(job.spec.model, None))
        batch = RolloutManager(job, str(work), world_size=1, vocab_size=OOM_VOCAB, use_object_store=False).get_rollout(0)
        try:
            rank.train_step(0, batch.rank_batches[0], batch.loss_tokens, rollout_id=0)
        except RanOutOfMemory as exc:
            record = exc.record.model_dump(mode="json")
    finally:
        rank.shutdown()
        del rank
    logits = samples * OOM_SAMPLE * OOM_VOCAB * 2
    snapshot = out / record["snapshot"] if record and record.get("snapshot") else None
    details = {"record": record, "device_total_bytes": total, "logits_bytes": logits, "samples": samples,
               "snapshot_bytes": snapshot.stat().st_size if snapshot is not None and snapshot.is_file() else None}
    return oom_figures(record, total, logits, snapshot), details


def ipc_payload(shape: tuple[int, int], device: str) -> list:
    """The tensors sent: bf16 weights, a view at a storage offset, a transposed view, float32, int64, a scalar."""
    import torch

    generator = torch.Generator().manual_seed(0)
    rows, cols = shape
    weight = torch.randn(rows, cols, generator=generator).to(torch.bfloat16).to(device)
    return [
        ("model.embed_tokens.weight", weight),
        ("rows_7_to_100", weight[7:100]),
        ("transposed", torch.randn(cols, rows // 4, generator=generator).to(device).t()),
        ("model.norm.weight", torch.randn(cols, generator=generator).to(device)),
        ("counts", torch.arange(1000, dtype=torch.int64, device=device) * 7),
        ("scalar", torch.tensor(3.5, device=device)),
    ]


def check_ipc(sizes: Sizes, on_gpu: bool) -> tuple[list[Figure], dict]:
    """The tensor path's payload, opened by another process (the sglang double's decoder), compared bit for bit."""
    from forge_replay.runtime.weights.ipc import serialize_named_tensors, update_request_body

    named = ipc_payload(sizes.ipc_shape, "cuda" if on_gpu else "cpu")
    sent = [tensor_digest(name, tensor) for name, tensor in named]
    counts = dict(named)["counts"]
    before = int(counts[0])
    began = time.perf_counter()
    body = update_request_body([serialize_named_tensors(named)], flush_cache=True, weight_version="gpu-check")
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--receive-ipc"], input=json.dumps(body),
                          capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"the receiving process failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    received = json.loads(done.stdout.strip().splitlines()[-1])
    _sync(on_gpu)
    after = int(counts[0])
    figures = ipc_figures(sent, received["tensors"])
    figures += [
        Figure("ipc", "receiver's write seen by the sender", f"{before} -> {after}", "",
               "shared memory, not a copy: the receiver added 1 to counts[0]", after == before + 1),
        Figure("ipc", "round trip", seconds, "s", "serialize, start the receiver, open, hash, answer"),
    ]
    details = {"sent": sent, "received": received["tensors"], "route": "CUDA IPC" if on_gpu else "shared memory",
               "weight_version": received.get("weight_version")}
    return figures, details


def receive_ipc() -> int:
    """The other process (sglang's role): open the body's payload with the double's decoder, report digests."""
    sys.modules["forge_replay"] = None  # type: ignore[assignment]  # the receiver stands in for sglang
    import torch

    spec = importlib.util.spec_from_file_location("tensor_payload", DOUBLE_DECODER)
    decoder = importlib.util.module_from_spec(spec)
    sys.modules["tensor_payload"] = decoder
    spec.loader.exec_module(decoder)
    body = json.load(sys.stdin)
    named = decoder.decode_named_tensors(body["serialized_named_tensors"][0])
    digests = [tensor_digest(name, tensor) for name, tensor in named]
    dict(named)["counts"][0] += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(json.dumps({"tensors": digests, "weight_version": body.get("weight_version")}))
    del named
    return 0


# ------------------------------------------------------------------------------------ the command


def block_imports() -> None:
    """Make ``import ray`` / ``import sglang`` fail here, so nothing on the path can use them unnoticed."""
    for name in BLOCKED:
        sys.modules[name] = None  # type: ignore[assignment]


def use_wheels(folder: Path, target: Path) -> str:
    """Install the carried wheels into ``target`` (no index, no network) when pydantic is missing."""
    if importlib.util.find_spec("pydantic") is not None:
        return "pydantic already installed"
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu_check: pydantic is missing and {folder} holds no wheels; see --collect-wheels")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", str(target), *wheels], check=True)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    return f"installed {len(wheels)} wheels from {folder}"


def collect_wheels(folder: Path, python_version: str) -> int:
    """Download (here, with network) the GPU_WHEELS at the versions installed here, for an x86-64 Linux CPython."""
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in GPU_WHEELS]
    platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                             "manylinux2014_x86_64", "any")]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               f"--python-version={python_version}", "--implementation=cp", *platforms, "-d", str(folder), *pins]
    subprocess.run(command, check=True)
    size = sum(p.stat().st_size for p in folder.glob("*.whl"))
    print(f"gpu_check: {len(list(folder.glob('*.whl')))} wheels in {folder}, {size / 2**20:.1f} MiB ({', '.join(pins)})")
    return 0


def machine(on_gpu: bool) -> dict:
    import torch
    import transformers

    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


CHECKS = ("memory", "attention", "ipc", "oom")


def _release(on_gpu: bool) -> None:
    """Give back what a check held (a failed one too), so the next one starts from an empty cache."""
    import gc

    gc.collect()
    if on_gpu:
        import torch

        torch.cuda.synchronize()
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


def run_checks(checks: list[str], sizes: Sizes, on_gpu: bool, out: Path, document: dict) -> list[Figure]:
    """Run ``checks`` in order; after each, ``document`` (figures, per-check details) is written as it stands."""
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for name in checks:
            began = time.perf_counter()
            try:
                if name == "memory":
                    found, details = check_memory(sizes, on_gpu, Path(work), out)
                elif name == "attention":
                    found, details = check_attention(sizes, on_gpu)
                elif name == "oom":
                    found, details = check_oom(sizes, on_gpu, Path(work), out)
                else:
                    found, details = check_ipc(sizes, on_gpu)
            except Exception as exc:  # noqa: BLE001 - one broken check is a failure, the others still run
                found = [Figure(name, "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}", ok=False)]
                details = {"traceback": traceback.format_exc()}
            _release(on_gpu)
            details["seconds"] = time.perf_counter() - began
            details["ok"] = exit_code(found) == 0
            for figure in found:
                print(figure.line(), flush=True)
            figures += found
            document["checks"][name] = details
            write_document(out, document, figures)  # a run cut short by its time limit keeps what it did
    return figures


def write_document(out: Path, document: dict, figures: list[Figure]) -> Path:
    """gpu_check.json with ``figures``; ``ok`` is None until the last figure (total seconds) is in."""
    document["figures"] = [asdict(f) for f in figures]
    path = out / "gpu_check.json"
    path.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (IPC through shared memory)")
    parser.add_argument("--out", type=output_dir, default=os.environ.get("OUT") or "results/gpu-check",
                        help="where gpu_check.json and memory.png go (default $OUT)")
    parser.add_argument("--wheels", type=existing_dir, default=None,
                        help="folder of carried wheels, installed when pydantic is missing")
    parser.add_argument("--collect-wheels", metavar="DIR", help="download the wheels a bare torch machine lacks, exit")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (for --collect-wheels)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument("--lengths", type=positive_int, nargs="+", help="tokens per sample of the memory check")
    parser.add_argument("--steps", type=positive_int, help="steps per length")
    parser.add_argument("--receive-ipc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.receive_ipc:
        return receive_ipc()
    if args.collect_wheels:
        return collect_wheels(Path(args.collect_wheels), args.python_version)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    block_imports()
    wheels = use_wheels(Path(args.wheels), Path(tempfile.mkdtemp(prefix="gpu-check-site-"))) if args.wheels else None
    sys.path.insert(0, str(REPO / "operator"))  # this checkout's forge_replay, installed or not
    import torch

    on_gpu = not args.cpu_smoke
    if on_gpu and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available; run with --cpu-smoke on a machine without a GPU")
        return 2
    sizes = cpu_sizes() if args.cpu_smoke else gpu_sizes()
    if args.lengths:
        sizes = replace(sizes, lengths=tuple(args.lengths))
    if args.steps:
        sizes = replace(sizes, steps=args.steps)
    info = machine(on_gpu)
    print(f"gpu_check: {'cpu smoke' if args.cpu_smoke else info.get('gpu')}, torch {info['torch']}, "
          f"transformers {info['transformers']}, {info['date']}" + (f"; {wheels}" if wheels else ""), flush=True)
    document = {"ok": None, "mode": "cpu-smoke" if args.cpu_smoke else "gpu", "machine": info,
                "blocked_imports": list(BLOCKED), "sizes": asdict(sizes), "figures": [], "checks": {}}
    figures = run_checks(args.checks, sizes, on_gpu, out, document)
    total = time.monotonic() - _STARTED
    figures.append(Figure("total", "seconds", total, "s", f"imports included, <= {TIME_BUDGET_S} s on one GPU"
                          if on_gpu else "imports included", total <= TIME_BUDGET_S if on_gpu else None))
    print(figures[-1].line())
    code = exit_code(figures)
    document["ok"] = code == 0
    path = write_document(out, document, figures)
    print(f"gpu_check: {'all comparisons passed' if code == 0 else 'FAILED'}; wrote {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
