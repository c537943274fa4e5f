"""Per-step peak memory of one trainer rank.

GPU: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` (reset before each step).
CPU: the process's peak resident set size. On Linux the peak (VmHWM) is reset before each step
by writing 5 to /proc/self/clear_refs, so each step reports its own peak; where that is not
possible the peak since process start (``ru_maxrss``) is reported and ``rss_reset`` says so.
"""

from __future__ import annotations

import re
import resource
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 1024**3
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class RankMemory:
    """Peaks of one rank over one step, in GiB. On CPU allocated/reserved are None."""

    rank: int
    device: str
    peak_allocated_gib: float | None
    peak_reserved_gib: float | None
    peak_rss_gib: float
    rss_reset: bool
    host: str | None = None
    """The rank's host name: its pod's name in a cluster, where a trainer spans pods."""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def headline_gib(self) -> float:
        """The number a memory test looks at: CUDA peak allocated on GPU, peak RSS on CPU."""
        return self.peak_allocated_gib if self.peak_allocated_gib is not None else self.peak_rss_gib


def _peak_rss_bytes() -> int:
    try:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", _STATUS.read_text())
        if match:
            return int(match.group(1)) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _reset_peak_rss() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    """Resets the peaks before a step and reads them after it."""

    def __init__(self, rank: int, device: str):
        self.rank = rank
        self.device = device
        self._rss_reset = False

    def reset(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._rss_reset = _reset_peak_rss()

    def read(self) -> RankMemory:
        allocated = reserved = None
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            allocated = torch.cuda.max_memory_allocated() / GIB
            reserved = torch.cuda.max_memory_reserved() / GIB
        return RankMemory(self.rank, self.device, allocated, reserved, _peak_rss_bytes() / GIB, self._rss_reset,
                          socket.gethostname())


def start_memory_history(max_entries: int = 100_000) -> bool:
    """Start recording CUDA allocations for a snapshot; False (nothing done) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return False
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    return True


def dump_memory_snapshot(path: str) -> bool:
    """Write the recorded CUDA memory history (open it at https://pytorch.org/memory_viz)."""
    import torch

    if not torch.cuda.is_available():
        return False
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(path)
    return True
