"""Process checks shared by the integration tests."""

from __future__ import annotations

import os
import signal
import subprocess


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` still exists (an engine that must be gone after a run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_and_wait(run: subprocess.Popen, signame: str, timeout_s: float, *, group: bool = False) -> str:
    """Send ``signame`` to ``run`` (to its whole process group with ``group``), wait for it to exit and return its
    stderr; a run still alive after ``timeout_s`` is killed, so no test leaves one behind."""
    try:
        if group:
            os.killpg(run.pid, getattr(signal, signame))
        else:
            run.send_signal(getattr(signal, signame))
        return run.communicate(timeout=timeout_s)[1]
    finally:
        if run.poll() is None:
            run.kill()


def family(pid: int) -> tuple[list, set[int]]:
    """``pid``'s descendants now, and the sessions among them lead (the local Ray helper, the engines: each starts
    a session of its own, where processes started later land too)."""
    import psutil

    procs = psutil.Process(pid).children(recursive=True)
    return procs, {p.pid for p in procs if _sid(p.pid) == p.pid}


def left_behind(procs: list, sessions: set[int], wait_s: float = 10.0) -> list[str]:
    """The command lines of processes of a :func:`family` still alive after ``wait_s``: one of ``procs``, or any
    process in one of ``sessions``."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    alive += [p for p in psutil.process_iter() if p not in alive and _sid(p.pid) in sessions]
    # One that ended between the wait and this look (or is a zombie waiting for init) is not left behind.
    return [" ".join(_cmdline(p)[:3]) for p in alive if _running(p)]


def _running(process) -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone
        return False


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _cmdline(process) -> list[str]:
    try:
        return process.cmdline()
    except Exception:  # noqa: BLE001 - gone or a zombie: its pid says enough
        return [str(process.pid)]
