"""Memory probe inside a foreign trainer's Ray workers (slime / miles): Ray's ``worker_process_setup_hook``.

Every Ray worker process of the job runs :func:`setup_hook` when it starts (the runtime env names it). A daemon
thread then records, every ``FORGE_REPLAY_PROBE_INTERVAL_S`` seconds (default 1) and when the process exits, the
peaks of a process that has imported torch (trainer ranks; idle workers and engines' Ray actors without torch are
skipped): torch's CUDA allocator peaks when CUDA is initialized (``source: cuda``), else the process's peak RSS
(``source: rss``). Each process writes ``probe-<host>-<pid>.json`` under ``FORGE_REPLAY_PROBE_DIR``;
:func:`memory_peak` reads them back as the builtin trainer's ``memory_peak`` summary (report.json's schema), each
figure naming its source and process. Imports nothing but the standard library (torch only if already loaded).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import socket
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


def _loop(folder: str, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        try:
            write(folder)
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
    figure from any process wins), with ``host`` and ``pid`` in place of a rank; None when nothing was recorded."""
    samples = []
    for path in sorted(Path(folder).glob("probe-*.json")):
        try:
            samples.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    if not samples:
        return None
    cuda = [s for s in samples if s["source"] == "cuda"]
    best = max(cuda, key=lambda s: s["peak_allocated_gib"]) if cuda else max(samples, key=lambda s: s["peak_rss_gib"])
    return {**best, "rank": None, "step": None, "processes": len(samples)}
