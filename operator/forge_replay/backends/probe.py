"""Memory probe inside a foreign trainer's Ray workers (slime / miles): Ray's ``worker_process_setup_hook``.

Every Ray worker process of the job runs :func:`setup_hook` when it starts (the runtime env names it). A daemon
thread then records, every ``FORGE_REPLAY_PROBE_INTERVAL_S`` seconds (default 1) and when the process exits, the
peaks of a process that has imported torch (trainer ranks; idle workers and engines' Ray actors without torch are
skipped): torch's CUDA allocator peaks when CUDA is initialized (``source: cuda``), else the process's peak RSS
(``source: rss``). Each process writes ``probe-<host>-<pid>.json`` under ``FORGE_REPLAY_PROBE_DIR``;
:func:`memory_peak` reads them back as the builtin trainer's ``memory_peak`` summary (report.json's schema), each
figure naming its source and process. Imports nothing but the standard library (torch only if already loaded) and
runtime.memory_signals (standard library only too).

One worker per node (whichever holds ``gpus-<host>.lock``; another takes over when it exits) also samples every
GPU's used memory at device level (NVML through pynvml when the image has it, else ``nvidia-smi``): sglang's KV
cache and CUDA graphs included, which no torch allocator of a trainer sees. Its peaks per GPU go to
``gpus-<host>.json`` (``source: nvml``).

Out-of-memory signals (issue 31), for the publish step to recognize structurally (backends.out_of_memory):

- The memory cgroup of the worker and its ``oom_kill`` count when the first worker of that cgroup started
  (``cgroup-<host>-<key>.json``, the baseline): a process the kernel's OOM killer kills cannot say so, but the count
  of its cgroup rises (cgroup v1 ``memory.oom_control``, v2 ``memory.events``; Documentation/admin-guide/cgroup-v1/
  memory.rst 10, cgroup-v2.rst ``memory.events``). Every sampler tick also compares the count with the baseline and
  writes ``oomkill-<host>-<key>.json`` when it rose, so a kill on another node is recorded by the workers that
  survive there.
- On GPU, torch's OOM observer (``torch._C._cuda_attach_out_of_memory_observer``, called by the CUDA caching
  allocator before it raises ``torch.OutOfMemoryError`` with the device, the bytes requested, the device's total and
  its free memory: c10/cuda/CUDACachingAllocator.h:97-101 at torch 2.15), attached once CUDA is initialized; it writes
  ``oom-<host>-<pid>.json`` with those figures and the allocator's allocated and reserved bytes at that moment.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from forge_replay.runtime.memory_signals import CGROUP_ROOT, MemoryCgroup, cgroup_named

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


# ------------------------------------------------------------------------- out-of-memory signals (issue 31)

def memory_cgroup(proc_cgroup: str, root: str = CGROUP_ROOT) -> tuple[str, int] | None:
    """(folder, cgroup version) of the memory cgroup a ``/proc/<pid>/cgroup`` text names, or None
    (runtime.memory_signals.cgroup_named)."""
    found = cgroup_named(proc_cgroup, root)
    return None if found is None else (found.directory, found.version)


def cgroup_figures(folder: str, version: int) -> dict[str, Any]:
    """The memory cgroup's OOM kill count, limit and peak usage (None where the kernel does not say), as the
    probe's files carry them (``oom_kill``)."""
    figures = MemoryCgroup(version, folder).read()
    return {"oom_kill": figures.oom_kills, "limit_bytes": figures.limit_bytes,
            "max_usage_bytes": figures.max_usage_bytes}


def record_cgroup(folder: str, proc_cgroup: str | None = None) -> dict[str, Any] | None:
    """Write the baseline of this process's memory cgroup (``cgroup-<host>-<key>.json``) unless a worker of that
    cgroup wrote it first; returns the baseline in force (None where no memory cgroup can be read)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None
    found = memory_cgroup(proc_cgroup)
    if found is None:
        return None
    cgroup, version = found
    host = socket.gethostname()
    record = {"host": host, "cgroup": cgroup, "version": version, "pid": os.getpid(), **cgroup_figures(cgroup, version)}
    if record["oom_kill"] is None:
        return None
    target = Path(folder, f"cgroup-{host}-{hashlib.sha1(cgroup.encode()).hexdigest()[:12]}.json")
    try:  # the first worker's count is the baseline: never replaced
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            return json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return record
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True))
    return record


def watch_cgroup(folder: str, baseline: dict[str, Any]) -> Path | None:
    """Write ``oomkill-<host>-<key>.json`` when the cgroup's OOM kill count rose above ``baseline``'s (a process of
    this node's cgroup was killed by the kernel); returns the file written."""
    figures = cgroup_figures(baseline["cgroup"], baseline["version"])
    if figures["oom_kill"] is None or figures["oom_kill"] <= baseline["oom_kill"]:
        return None
    key = hashlib.sha1(baseline["cgroup"].encode()).hexdigest()[:12]
    target = Path(folder, f"oomkill-{baseline['host']}-{key}.json")
    try:
        if json.loads(target.read_text(encoding="utf-8"))["oom_kill"] >= figures["oom_kill"]:
            return None
    except (OSError, ValueError, KeyError):
        pass
    record = {**baseline, **figures, "baseline": baseline["oom_kill"], "seen_at": _now()}
    partial = target.with_suffix(f".json.{os.getpid()}.part")
    partial.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
    os.replace(partial, target)
    return target


def cuda_oom_observer(folder: str):
    """torch's OOM observer for this process: ``fn(device, requested, device_total, device_free)`` writes
    ``oom-<host>-<pid>.json`` (the first out-of-memory of the process; the allocator may call it again for the
    same one, cuDNN's retries for instance)."""
    target = Path(folder, f"oom-{socket.gethostname()}-{os.getpid()}.json")

    def observe(device: int, requested: int, device_total: int, device_free: int) -> None:
        if target.exists():
            return
        record: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "device": f"cuda:{device}",
                                  "requested_bytes": int(requested), "device_total_bytes": int(device_total),
                                  "device_free_bytes": int(device_free), "at": _now()}
        torch = sys.modules.get("torch")
        try:
            stats = torch.cuda.memory_stats(device)
            record.update(allocated_bytes=stats.get("allocated_bytes.all.current"),
                          reserved_bytes=stats.get("reserved_bytes.all.current"))
        except Exception:  # noqa: BLE001 - the figures the allocator gave are written anyway
            pass
        try:
            partial = target.with_suffix(".json.part")
            partial.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
            os.replace(partial, target)
        except OSError:
            pass

    return observe


def _attach_cuda_observer(folder: str) -> bool:
    """Attach :func:`cuda_oom_observer` once torch has initialized CUDA in this process; True once attached (or
    never possible: no CUDA)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return False
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is not None:
        attach(cuda_oom_observer(folder))
    return True


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _loop(folder: str, interval_s: float, stop: threading.Event, baseline: dict[str, Any] | None = None) -> None:
    gpus = _GpuSampler(folder)
    attached = False
    while not stop.wait(interval_s):
        try:
            write(folder)
            gpus.tick()
            if baseline is not None:
                watch_cgroup(folder, baseline)
            if not attached:
                attached = _attach_cuda_observer(folder)
        except OSError:  # a full or vanished results volume must not fail the trainer
            pass


def setup_hook() -> None:
    """Ray's worker_process_setup_hook: start the sampler thread of this worker (no-op without a probe dir)."""
    folder = os.environ.get(PROBE_DIR_ENV)
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    try:
        baseline = record_cgroup(folder)
    except OSError:
        baseline = None
    stop = threading.Event()
    interval = float(os.environ.get(INTERVAL_ENV, "1"))
    threading.Thread(target=_loop, args=(folder, interval, stop, baseline), name="forge-replay-probe",
                     daemon=True).start()

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
