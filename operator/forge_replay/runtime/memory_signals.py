"""The out-of-memory signals a process's death leaves outside it, read with the standard library only (the memory
probe, backends/probe.py, imports this inside a team's image): a process's memory cgroup, and Ray's memory monitor's
message.

A process's memory cgroup as the kernel shows it: its OOM-kill count, its limit and its peak usage. The kernel's OOM
killer tells the process it kills nothing (SIGKILL); the only record is the count of OOM kills of the memory cgroup
the process was in. Read it at a rank's start (the baseline) and after its death: a count that rose is the kernel's
kill (``kernelOomKiller``); a death without it is something else.

- cgroup v1 (Documentation/admin-guide/cgroup-v1/memory.rst): ``/sys/fs/cgroup/memory/<path>/memory.oom_control``
  holds ``oom_kill N`` (Linux 4.13+, mm/memcontrol.c ``mem_cgroup_oom_control_read``), counted for that cgroup
  only; ``memory.limit_in_bytes`` (unlimited: a page-rounded LLONG_MAX) and ``memory.max_usage_in_bytes``.
- cgroup v2 (Documentation/admin-guide/cgroup-v2.rst): ``/sys/fs/cgroup/<path>/memory.events`` holds ``oom_kill N``;
  ``memory.max`` (``max``: none) and ``memory.peak`` (Linux 5.19+).

``<path>`` comes from ``/proc/<pid>/cgroup``. In a container the mount is the container's own cgroup while the path
may name the host's hierarchy (cgroup v1 without a cgroup namespace): a path whose OOM-kill file is not there under
the mount means the mount root is the process's cgroup (runc bind-mounts it so).

Ray's memory monitor killing a worker is a type (``ray.exceptions.OutOfMemoryError``, Ray 2.60.0
ray/exceptions.py:655-667, not a RayActorError); its figures exist only in its message (:func:`ray_monitor_figures`).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED = 2**62
"""A v1 limit at or above this is "no limit" (the kernel shows LLONG_MAX rounded down to a page)."""


def held_by_others_bytes(device_total: int | None, device_free: int | None, reserved: int | None) -> int | None:
    """What else held the device when this process's CUDA allocator ran out: the device's used memory (total less
    free, as the driver counts it) less what this process's allocator had reserved; other processes' memory
    (colocated engines, another rank) and this process's CUDA context. None when a figure is missing."""
    if device_total is None or device_free is None or reserved is None:
        return None
    return max(0, int(device_total) - int(device_free) - int(reserved))


@dataclass(frozen=True)
class MemoryCgroup:
    """Where a process's memory cgroup is: ``version`` 1 or 2 and its ``directory``."""

    version: int
    directory: str

    def read(self) -> CgroupMemory:
        """Its figures now; a file that cannot be read leaves its figure None."""
        folder = Path(self.directory)
        if self.version == 1:
            return CgroupMemory(oom_kills=_key(folder / "memory.oom_control", "oom_kill"),
                                limit_bytes=_limit(_number(folder / "memory.limit_in_bytes")),
                                max_usage_bytes=_number(folder / "memory.max_usage_in_bytes"))
        return CgroupMemory(oom_kills=_key(folder / "memory.events", "oom_kill"),
                            limit_bytes=_limit(_number(folder / "memory.max")),
                            max_usage_bytes=_number(folder / "memory.peak"))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's figures at one moment (None: not shown by this kernel, or unreadable)."""

    oom_kills: int | None
    limit_bytes: int | None
    max_usage_bytes: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def memory_cgroup(pid: int | str = "self", root: str = CGROUP_ROOT, proc: str = "/proc") -> MemoryCgroup | None:
    """The memory cgroup of ``pid`` (:func:`cgroup_named`), or None when there is none to read (not Linux, no memory
    controller, no such process)."""
    try:
        text = Path(proc, str(pid), "cgroup").read_text()
    except OSError:
        return None
    return cgroup_named(text, root)


def cgroup_named(proc_cgroup: str, root: str = CGROUP_ROOT) -> MemoryCgroup | None:
    """The memory cgroup a ``/proc/<pid>/cgroup`` text names (v1 when its memory hierarchy has the path, else v2),
    or None: the first of the named path and the mount root (a container's own cgroup) that holds the version's
    OOM-kill file."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    candidates = []
    if v1 is not None:
        candidates += [(Path(root, "memory", v1.lstrip("/")), 1), (Path(root, "memory"), 1)]
    if v2 is not None:
        candidates += [(Path(root, v2.lstrip("/")), 2), (Path(root), 2)]
    for folder, version in candidates:
        if (folder / ("memory.oom_control" if version == 1 else "memory.events")).is_file():
            return MemoryCgroup(version, str(folder))
    return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _number(path: Path) -> int | None:
    text = _text(path).strip()
    if text == "max":
        return UNLIMITED
    return int(text) if text.isdigit() else None


def _key(path: Path, key: str) -> int | None:
    """The number after ``key`` in a flat keyed file (``oom_kill 1``)."""
    for line in _text(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _limit(value: int | None) -> int | None:
    return None if value is None or value >= UNLIMITED else value


def this_process_cgroup() -> dict | None:
    """This process's memory cgroup and its figures now (``{"version", "directory", "oom_kills", ...}``), or None:
    what a rank records at its start."""
    cgroup = memory_cgroup(os.getpid())
    return None if cgroup is None else {**cgroup.to_dict(), **cgroup.read().to_dict()}


def read_cgroup(version: int, directory: str) -> dict:
    """The figures of the cgroup a rank recorded (``this_process_cgroup``), read now: on the rank's node, after its
    death."""
    return MemoryCgroup(version, directory).read().to_dict()


# ------------------------------------------------------------------------- Ray's memory monitor

_MONITOR_NODE = re.compile(r"Memory on the node \(IP:? ([^,\s)]+)")
_MONITOR_REASON = re.compile(r"Memory usage (\d+)B exceeded threshold of (\d+)B")
"""Ray 2.60's raylet memory monitor, its "OOM kill reason:" line."""
_MONITOR_LIMIT = re.compile(r"\(\s*[\d.]+% of (\d+)B limit\)")
_MONITOR_VICTIM = re.compile(r"Selected to kill: .*?\bpid=(\d+)")


def ray_monitor_figures(message: str) -> dict:
    """What Ray's memory monitor's message (``str()`` of ``ray.exceptions.OutOfMemoryError``) says, each key only
    when it says it. Ray 2.60: "1 worker(s) were killed due to the node running low on memory. Memory on the node
    (IP: ..., ID: ...) was 4.73GB used / 23.54GB limit ...\nOOM kill reason: Memory usage 5079146496B exceeded
    threshold of 5055212032B (20.0% of 25276059648B limit)\n... Selected to kill: (Actor(...): ... pid=10883,
    actual memory used=1.55GB, ...)": ``node`` (its IP), ``pid`` (the killed worker's), ``usage_bytes`` and
    ``threshold_bytes`` (the node's usage and the threshold it went over), ``limit_bytes`` (the node's limit)."""
    message = message or ""
    figures: dict = {}
    if node := _MONITOR_NODE.search(message):
        figures["node"] = node.group(1)
    if victim := _MONITOR_VICTIM.search(message):
        figures["pid"] = int(victim.group(1))
    if reason := _MONITOR_REASON.search(message):
        figures.update(usage_bytes=int(reason.group(1)), threshold_bytes=int(reason.group(2)))
    if limit := _MONITOR_LIMIT.search(message):
        figures["limit_bytes"] = int(limit.group(1))
    return figures
