"""Process checks shared by the integration tests."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` still exists (an engine that must be gone after a run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
