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
