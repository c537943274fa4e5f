"""The results folder of a run: checked writable before Ray starts, used by one run at a time, and every
file in it written whole.

- :func:`check_writable` fails in seconds on a folder that cannot be written; :func:`set_previous_aside`
  renames the previous run's report and plot (``report.previous.json``, ``memory.previous.png``) so that a
  report this run fails to write can never pass for this run's.
- :class:`ResultsLock` is a lock file naming the run that holds the folder (pid, host, job, start time);
  a second run is refused naming the first, a lock left by a dead process on this host is taken over with
  a note, and the lock is released on every way out of the run.
- every file is written with :func:`~forge_replay.dumps.writing.write_atomically`: a temporary file in the same
  folder renamed over the target, so a reader (or a run killed mid-write, or a full disk) sees the old file or
  the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from forge_replay.dumps.writing import now_rfc3339

log = logging.getLogger(__name__)

LOCK_NAME = ".forge-replay.lock"
SET_ASIDE = {"report.json": "report.previous.json", "memory.png": "memory.previous.png",
             # a slime / miles run (forge-replay run --trainer-root): its logs, its Ray job's record, and the memory
             # probe's folder, whose files a later run would otherwise count in its own peak
             "trainer.log": "trainer.previous.log", "job.json": "job.previous.json",
             "ray-head.log": "ray-head.previous.log", "probe": "probe.previous"}


class ResultsError(RuntimeError):
    """The results folder cannot be used; the message names the folder and what to do."""


def check_writable(directory: str | Path) -> None:
    """Create ``directory`` and prove it writable, or raise ResultsError naming it. Run before Ray starts,
    so that a bad folder fails in seconds."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-check-")
        try:
            os.write(fd, b"forge-replay")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ResultsError(f"results folder {directory} is not writable: {exc.strerror or exc}; "
                           "pass --results DIR with a folder this user can write") from None


def set_previous_aside(directory: str | Path) -> list[str]:
    """Rename the previous run's files (:data:`SET_ASIDE`: report.json to report.previous.json, memory.png, a slime /
    miles run's logs, job.json and probe folder) to their ``previous`` names (kept, one run back), so that a report
    this run fails to write never passes for this run's and no figure of the previous run is counted in this one;
    returns the new names. Raises ResultsError."""
    directory = Path(directory)
    moved = []
    for name, aside in SET_ASIDE.items():
        try:
            if (directory / name).is_dir() and (directory / aside).is_dir():  # a folder is not renamed over one
                shutil.rmtree(directory / aside)
            os.replace(directory / name, directory / aside)
            moved.append(aside)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ResultsError(f"cannot set the previous {directory / name} aside: {exc.strerror or exc}") from None
    return moved


def prepare_results(directory: str | Path) -> list[str]:
    """:func:`check_writable`, then :func:`set_previous_aside` (for a folder no other run can use)."""
    check_writable(directory)
    return set_previous_aside(directory)


@dataclass(frozen=True)
class LockOwner:
    """Who holds a results folder."""

    pid: int
    host: str
    job: str
    started_at: str
    process_start: str | None = None
    """The process's start time in /proc (Linux): a recycled pid is not mistaken for the owner."""

    def describe(self) -> str:
        return f"job {self.job!r} (pid {self.pid} on {self.host}, started {self.started_at})"

    @classmethod
    def current(cls, job: str) -> LockOwner:
        return cls(os.getpid(), socket.gethostname(), job, now_rfc3339(), process_start(os.getpid()))


def process_start(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None where unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def owner_alive(owner: LockOwner) -> bool:
    """Whether the lock's process still runs (only knowable on its own host: elsewhere, assume it does)."""
    if owner.host != socket.gethostname():
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = process_start(owner.pid)
    return owner.process_start is None or started is None or started == owner.process_start


class ResultsLock:
    """The lock file of a results folder (use as a context manager, or acquire/release)."""

    def __init__(self, directory: str | Path, job: str):
        self.path = Path(directory) / LOCK_NAME
        self.owner = LockOwner.current(job)
        self.note: str | None = None
        """Set when a stale lock was taken over: say it to the user."""
        self.held = False

    def acquire(self) -> ResultsLock:
        """Take the folder, or raise ResultsError naming the run that holds it."""
        for _ in range(5):
            if self._create():
                self.held = True
                return self
            other = read_owner(self.path)
            if other is None:
                continue  # removed meanwhile, or being written: look again
            if owner_alive(other):
                raise ResultsError(
                    f"results folder {self.path.parent} is in use by {other.describe()}; wait for that run, "
                    f"stop it, or pass another --results (if it is gone, delete {self.path})"
                )
            self._take_over(other)
        raise ResultsError(f"cannot take the lock {self.path}: other runs keep taking it")

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        if self.held and read_owner(self.path) == self.owner:
            try:
                self.path.unlink()
            except OSError as exc:
                log.warning("cannot remove the results lock %s: %s", self.path, exc)
        self.held = False

    def __enter__(self) -> ResultsLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _create(self) -> bool:
        """Link a complete lock file into place: atomic, and never seen half written."""
        fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=f"{LOCK_NAME}.new-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(asdict(self.owner), fh)
            os.link(temp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)

    def _take_over(self, stale: LockOwner) -> None:
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if read_owner(aside) != stale:  # another run replaced it meanwhile: put theirs back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            os.unlink(aside)
            return
        os.unlink(aside)
        self.note = f"took over the results lock of {stale.describe()}: that process is gone"
        log.warning("%s", self.note)


def read_owner(path: Path) -> LockOwner | None:
    """The owner a lock file names; None when it is absent. An unreadable lock names an unknown owner."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockOwner(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        return LockOwner(-1, "an unknown host", f"<unreadable lock: {exc}>"[:200], "?")
