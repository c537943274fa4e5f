"""A process's memory cgroup as the kernel shows it: its OOM-kill count, its limit and its peak usage.

The kernel's OOM killer tells the process it kills nothing (SIGKILL); the only record is the count of OOM kills of
the memory cgroup the process was in. Read it at a rank's start (the baseline) and after its death: a count that
rose is the kernel's kill (``kernelOomKiller``); a death without it is something else.

- cgroup v1 (Documentation/admin-guide/cgroup-v1/memory.rst): ``/sys/fs/cgroup/memory/<path>/memory.oom_control``
  holds ``oom_kill N`` (Linux 4.13+, mm/memcontrol.c ``mem_cgroup_oom_control_read``), counted for that cgroup
  only; ``memory.limit_in_bytes`` (unlimited: a page-rounded LLONG_MAX) and ``memory.max_usage_in_bytes``.
- cgroup v2 (Documentation/admin-guide/cgroup-v2.rst): ``/sys/fs/cgroup/<path>/memory.events`` holds ``oom_kill N``;
  ``memory.max`` (``max``: none) and ``memory.peak`` (Linux 5.19+).

``<path>`` comes from ``/proc/<pid>/cgroup``. In a container the mount is the container's own cgroup while the path
may name the host's hierarchy (cgroup v1 without a cgroup namespace): a path that does not exist under the mount
means the mount root is the process's cgroup.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED = 2**62
"""A v1 limit at or above this is "no limit" (the kernel shows LLONG_MAX rounded down to a page)."""


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
    """The memory cgroup of ``pid`` (v1 when a v1 memory hierarchy is mounted, else v2), or None when neither is
    there to read (not Linux, no memory controller)."""
    try:
        lines = Path(proc, str(pid), "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            v1 = path
        elif controllers == "" and line.startswith("0:"):
            v2 = path
    mount = Path(root, "memory")
    if v1 is not None and (mount / "memory.oom_control").exists():
        return MemoryCgroup(1, str(_under(mount, v1)))
    if v2 is not None and "memory" in _text(Path(root, "cgroup.controllers")).split():
        return MemoryCgroup(2, str(_under(Path(root), v2)))
    return None


def _under(mount: Path, path: str) -> Path:
    """``path`` under ``mount`` when it is there, else the mount itself (a container's own cgroup)."""
    folder = mount / path.lstrip("/")
    return folder if path.strip("/") and folder.is_dir() else mount


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
