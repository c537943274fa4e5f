"""Writing files whole, readable by other users, and the time stamp the records written here carry.

- :func:`write_atomically` writes a temporary file in the same folder and renames it over the target: a reader (or a
  run killed mid-write, or a full disk) sees the old file or the new one, never half of one.
- :func:`share_like_open` gives a ``mkstemp`` file the mode ``open()`` would, for dumps written to a shared claim.
- :func:`now_rfc3339` is the time the verify record, the run's progress and its report say they were written.

The dumps, the runtime's results folder and the bring-your-own publish step all write through here.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path


def now_rfc3339() -> str:
    """The time now in UTC, to the second, as RFC 3339 (``2026-12-01T10:00:00Z``)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through ``.<name>.tmp`` in the same folder and a rename.

    Raises OSError (disk full, read-only, something in the way of the temporary name) with ``path``
    unchanged; the temporary file is removed."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(temp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            temp.unlink()
        except OSError:
            pass
        raise


def share_like_open(fd: int) -> None:
    """Give a ``mkstemp`` file (always 0600) the mode ``open()`` would: 0666 less the umask, so runtime pods of
    another uid can read dumps written to a shared PVC."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
