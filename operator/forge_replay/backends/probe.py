"""Memory probe inside a foreign trainer's Ray workers (slime / miles): Ray's ``worker_process_setup_hook``.

Every Ray worker process of the job runs :func:`setup_hook` when it starts (the runtime env names it). A daemon
thread then records, every ``FORGE_REPLAY_PROBE_INTERVAL_S`` seconds (default 1) and when the process exits, the
peaks of a process that has imported torch (trainer ranks; idle workers and engines' Ray actors without torch are
skipped): torch's CUDA allocator peaks when CUDA is initialized (``source: cuda``), else the process's peak RSS
(``source: rss``). Each process writes ``probe-<host>-<pid>.json`` under ``FORGE_REPLAY_PROBE_DIR``;
:func:`memory_peak` reads them back as the builtin trainer's ``memory_peak`` summary (report.json's schema), each
figure naming its source and process. Imports nothing but the standard library (torch only if already loaded).

One worker per node (whichever holds ``gpus-<host>.lock``; another takes over when it exits) also samples every
GPU's used memory at device level (NVML through pynvml when the image has it, else ``nvidia-smi``): sglang's KV
cache and CUDA graphs included, which no torch allocator of a trainer sees. Its peaks per GPU go to
``gpus-<host>.json`` (``source: nvml``).
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import resource
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

PROBE_DIR_ENV = "FORGE_REPLAY_PROBE_DIR"
INTERVAL_ENV = "FORGE_REPLAY_PROBE_INTERVAL_S"
HOOK = "forge_replay.backends.probe.setup_hook"
"""What the runtime env's ``worker_process_setup_hook`` names."""
GIB = 2**30


def sample() -> dict[str, Any] | None:
    """This process's memory peaks, or None when it has not imported torch (not a trainer process)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    figures: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "device": "cpu"}
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        device = cuda.current_device()
        figures.update(source="cuda", device=f"cuda:{device}", peak_rss_gib=None,
                       peak_allocated_gib=cuda.max_memory_allocated(device) / GIB,
                       peak_reserved_gib=cuda.max_memory_reserved(device) / GIB)
    else:  # ru_maxrss is KiB on Linux
        figures.update(source="rss", peak_allocated_gib=None, peak_reserved_gib=None,
                       peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB)
    return figures


def write(folder: str) -> Path | None:
    """Write this process's sample to ``folder`` (atomically); None when there is nothing to write."""
    figures = sample()
    if figures is None:
        return None
    target = Path(folder, f"probe-{figures['host']}-{figures['pid']}.json")
    partial = target.with_suffix(".json.part")
    partial.write_text(json.dumps(figures, sort_keys=True), encoding="utf-8")
    os.replace(partial, target)
    return target


def gpu_used_from_smi(text: str) -> dict[str, float]:
    """GiB used per GPU index from ``nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits``
    (one ``<index>, <MiB>`` line per GPU)."""
    used = {}
    for line in text.splitlines():
        if line.strip():
            index, mib = (part.strip() for part in line.split(","))
            used[index] = float(mib) / 1024
    return used


def read_gpus() -> dict[str, float] | None:
    """GiB used per GPU of this node (NVML, else nvidia-smi); None where neither is there (CPU nodes)."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            return {str(i): pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / GIB
                    for i in range(pynvml.nvmlDeviceGetCount())}
        except pynvml.NVMLError:
            return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return gpu_used_from_smi(done.stdout)


def merge_peaks(peaks: dict[str, float], used: dict[str, float]) -> dict[str, float]:
    """Per-GPU peaks after one more sample."""
    return {index: max(peaks.get(index, 0.0), used.get(index, 0.0)) for index in sorted({*peaks, *used})}


class _GpuSampler:
    """This node's device-level sampler, held by one worker at a time (an flock released when it exits)."""

    def __init__(self, folder: str):
        host = socket.gethostname()
        self.path = Path(folder, f"gpus-{host}.json")
        self.host = host
        self.lock = open(Path(folder, f"gpus-{host}.lock"), "a")  # noqa: SIM115 - held for the process's life
        self.owner = False
        self.usable = True

    def tick(self) -> None:
        if not self.usable:
            return
        if not self.owner:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return
            self.owner = True
        used = read_gpus()
        if used is None:
            self.usable = False  # no GPU here: stop trying
            return
        try:
            peaks = json.loads(self.path.read_text(encoding="utf-8"))["peak_used_gib"]
        except (OSError, ValueError, KeyError):
            peaks = {}
        record = {"host": self.host, "source": "nvml", "peak_used_gib": merge_peaks(peaks, used)}
        partial = self.path.with_suffix(".json.part")
        partial.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(partial, self.path)


def _loop(folder: str, interval_s: float, stop: threading.Event) -> None:
    gpus = _GpuSampler(folder)
    while not stop.wait(interval_s):
        try:
            write(folder)
            gpus.tick()
        except OSError:  # a full or vanished results volume must not fail the trainer
            pass


def setup_hook() -> None:
    """Ray's worker_process_setup_hook: start the sampler thread of this worker (no-op without a probe dir)."""
    folder = os.environ.get(PROBE_DIR_ENV)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    stop = threading.Event()
    interval = float(os.environ.get(INTERVAL_ENV, "1"))
    threading.Thread(target=_loop, args=(folder, interval, stop), name="forge-replay-probe", daemon=True).start()

    def final() -> None:
        stop.set()
        try:
            write(folder)
        except OSError:
            pass

    atexit.register(final)


def memory_peak(folder: str) -> dict[str, Any] | None:
    """The highest peak the probes recorded, as report.json's ``memory_peak`` (CUDA allocated over RSS: a CUDA
    figure from any process wins), with ``host`` and ``pid`` in place of a rank, and ``gpus`` (per host, each GPU's
    peak used memory at device level, ``source: nvml``) when a node has GPUs; None when nothing was recorded."""
    samples = []
    for path in sorted(Path(folder).glob("probe-*.json")):
        try:
            samples.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    gpus = {}
    for path in sorted(Path(folder).glob("gpus-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        gpus[record["host"]] = {"source": record["source"], "peak_used_gib": record["peak_used_gib"]}
    if not samples:
        return {"gpus": gpus} if gpus else None
    cuda = [s for s in samples if s["source"] == "cuda"]
    best = max(cuda, key=lambda s: s["peak_allocated_gib"]) if cuda else max(samples, key=lambda s: s["peak_rss_gib"])
    return {**best, "rank": None, "step": None, "processes": len(samples), **({"gpus": gpus} if gpus else {})}
