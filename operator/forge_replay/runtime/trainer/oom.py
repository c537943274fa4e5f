"""Out-of-memory inside a trainer rank: torch's allocators' errors, caught per phase and raised as the run's record.

Each phase of a rank (setup: the model and the optimizer; forward; backward; optimizerStep; weightSync) runs in
:meth:`RankWatch.phase`, which

- tells the run's :class:`PhaseBoard` (a tiny Ray actor, fire-and-forget) the rank's rollout and phase before it
  starts, so that the driver still knows them when the rank is killed from outside (SIGKILL leaves no last words);
- turns torch's allocator running out into :class:`~forge_replay.api.outcome.RanOutOfMemory` carrying the record
  (signal, rank, host, pid, device, rollout, phase, bytes), which crosses Ray intact.

The CUDA figures come from torch's OOM observer (``torch._C._cuda_attach_out_of_memory_observer``; torch 2.15
c10/cuda/CUDACachingAllocator.h:97-101, called in CUDACachingAllocator.cpp's malloc just before it throws, with
``(device, bytes requested, device total or the per-process cap, device free)``) and ``torch.cuda.memory_stats``
read in it. With ``trainer.memorySnapshot`` the observer writes the CUDA memory snapshot at that moment, as torch's
own documentation does (docs/source/torch_cuda_memory.rst, "oom_observer").
"""

from __future__ import annotations

import functools
import os
import re
import socket
import time
from contextlib import contextmanager

from forge_replay.api.outcome import OutOfMemory, OutOfMemoryHowMuch, OutOfMemoryWhen, OutOfMemoryWhere, RanOutOfMemory
from forge_replay.runtime.memory_signals import held_by_others_bytes

CPU_ALLOCATOR_MESSAGE = "DefaultCPUAllocator: can't allocate memory"
"""torch's CPU allocator has no error type of its own: c10/core/impl/alloc_cpu.cpp (torch 2.15, line 127) fails a
``CAFFE_ENFORCE`` whose c10::Error reaches Python as a plain RuntimeError: "[enforce fail at alloc_cpu.cpp:127] err ==
0. DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate
memory)". This sentence is the only handle (accelerate and Lightning match the same one)."""
_CPU_REQUESTED = re.compile(r"you tried to allocate (\d+) bytes")
SNAPSHOT_NAME = "memory-snapshot-oom-rank{rank}.pickle"
"""The CUDA memory snapshot written at an out-of-memory, in the results folder."""


def allocator_error(exc: BaseException) -> tuple[str, int | None] | None:
    """``(signal, bytes requested)`` when ``exc`` is torch's allocator running out of memory: ``cudaAllocator`` for
    ``torch.OutOfMemoryError`` (its type; the bytes come from the observer), ``cpuAllocator`` for the CPU
    allocator's RuntimeError (the bytes from its message); None for anything else."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "cudaAllocator", None
    if isinstance(exc, RuntimeError) and CPU_ALLOCATOR_MESSAGE in str(exc):
        found = _CPU_REQUESTED.search(str(exc))
        return "cpuAllocator", int(found.group(1)) if found else None
    return None


def host_and_pod() -> tuple[str | None, str | None]:
    """(node or host, pod) of this process: in a pod its host name is the pod's, the node is ``NODE_NAME`` if set."""
    host = socket.gethostname()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return os.environ.get("NODE_NAME"), host
    return host, None


class PhaseBoard:
    """The ranks' last (rollout, phase), kept outside them (a Ray actor the driver owns): read after a rank died."""

    def __init__(self):
        self.phases: dict[int, dict] = {}

    def tell(self, rank: int, rollout: int | None, phase: str) -> None:
        self.phases[rank] = {"rollout": rollout, "phase": phase, "at": time.time()}

    def read(self) -> dict[int, dict]:
        return dict(self.phases)


class CudaOomObserver:
    """What torch's CUDA allocator said as it ran out (the last time in the current phase), and the snapshot."""

    def __init__(self, snapshot_path: str | None):
        self.snapshot_path = snapshot_path
        self.seen: dict | None = None
        self.snapshot: str | None = None

    def __call__(self, device: int, requested: int, device_total: int, device_free: int) -> None:
        import torch

        stats = torch.cuda.memory_stats(device)
        self.seen = {"device": device, "requested_bytes": int(requested), "device_total_bytes": int(device_total),
                     "device_free_bytes": int(device_free),
                     "allocated_bytes": stats.get("allocated_bytes.all.current"),
                     "reserved_bytes": stats.get("reserved_bytes.all.current")}
        if self.snapshot_path and self.snapshot is None:
            try:
                os.makedirs(os.path.dirname(self.snapshot_path) or ".", exist_ok=True)
                torch.cuda.memory._dump_snapshot(self.snapshot_path)
                self.snapshot = self.snapshot_path
            except Exception:  # noqa: BLE001 - the record matters more than the snapshot (a full disk)
                self.snapshot = ""


class RankWatch:
    """One rank's phases (:meth:`phase`) and what it records when one runs out of memory."""

    def __init__(self, rank: int):
        self.rank = rank
        self.device = "cpu"
        self.rollout: int | None = None
        self.board = None
        self.results_dir: str | None = None
        self.observer: CudaOomObserver | None = None
        self._told: tuple | None = None

    def arm(self, board, results_dir: str | None, memory_snapshot: bool) -> None:
        """Tell ``board`` (a PhaseBoard actor handle, or None) from now on; on CUDA attach the OOM observer (once per
        process: torch has no detach), which writes the snapshot into ``results_dir`` with ``memory_snapshot``."""
        self.board, self.results_dir = board, results_dir
        if not self.device.startswith("cuda") or self.observer is not None:
            return
        import torch

        from forge_replay.runtime.trainer.memory import start_memory_history

        path = None
        if memory_snapshot and results_dir and start_memory_history():
            path = os.path.join(results_dir, SNAPSHOT_NAME.format(rank=self.rank))
        self.observer = CudaOomObserver(path)
        torch._C._cuda_attach_out_of_memory_observer(self.observer)

    @contextmanager
    def phase(self, name: str, rollout: int | None = None):
        """Run a phase: the board told first; torch's allocator running out in it raises RanOutOfMemory."""
        if rollout is not None:
            self.rollout = rollout
        if self.board is not None and self._told != (self.rollout, name):
            self._told = (self.rollout, name)
            self.board.tell.remote(self.rank, self.rollout, name)  # fire-and-forget: in order, never waited on
        if self.observer is not None:
            self.observer.seen = None
        try:
            yield
        except RanOutOfMemory:
            raise
        except Exception as exc:
            found = allocator_error(exc)
            if found is None:
                raise
            raise RanOutOfMemory(self.record(found[0], found[1], name, exc)) from None

    def record(self, signal: str, requested: int | None, phase: str, exc: BaseException) -> OutOfMemory:
        """The record of an allocator error in ``phase``: what the observer saw (CUDA), else what the error says."""
        node, pod = host_and_pod()
        seen = dict(self.observer.seen or {}) if self.observer is not None else {}
        seen.pop("device", None)
        if signal == "cudaAllocator" and not seen:
            seen = _cuda_now()
        if signal == "cudaAllocator":
            seen["held_by_others_bytes"] = held_by_others_bytes(
                seen.get("device_total_bytes"), seen.get("device_free_bytes"), seen.get("reserved_bytes"))
        snapshot = None
        if self.observer is not None and self.observer.snapshot and self.results_dir:
            snapshot = os.path.relpath(self.observer.snapshot, self.results_dir)
        return OutOfMemory(
            signal=signal,
            where=OutOfMemoryWhere(component="trainer", rank=self.rank, node=node, pod=pod, pid=os.getpid(),
                                   device=self.device),
            when=OutOfMemoryWhen(rollout=self.rollout, phase=phase, at=_now()),
            how_much=OutOfMemoryHowMuch(**{"requested_bytes": requested, **seen}),
            message=" ".join(str(exc).split())[:2000], snapshot=snapshot,
        )


def in_phase(name: str):
    """A TrainerRank method that runs as phase ``name`` of its :class:`RankWatch` (``self.watch``)."""
    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with self.watch.phase(name):
                return method(self, *args, **kwargs)
        return run
    return wrap


def _cuda_now() -> dict:
    """CUDA figures read after the error, when the observer saw nothing (not attached)."""
    import torch

    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"allocated_bytes": stats.get("allocated_bytes.all.current"),
            "reserved_bytes": stats.get("reserved_bytes.all.current"), "device_total_bytes": total,
            "device_free_bytes": free}


def _now() -> str:
    from forge_replay.dumps.writing import now_rfc3339

    return now_rfc3339()
