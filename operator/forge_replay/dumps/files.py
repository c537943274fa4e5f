"""Reading and writing rollout dump files in slime's exact format (and the packed format)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from forge_replay.dumps.bounds import Limits, quote
from forge_replay.dumps.packed import is_packed, load_packed_raw
from forge_replay.dumps.safe_pickle import DumpError, safe_load
from forge_replay.dumps.sample import Sample, SampleError
from forge_replay.dumps.writing import share_like_open


@dataclass
class Dump:
    """One dump file: the ``rollout_id`` stored in it, its samples, where it was read from, and the top-level
    ``metadata`` dict miles writes (and reads back) next to the samples (empty when the dump has none)."""

    rollout_id: int
    samples: list[Sample]
    path: str
    metadata: dict[str, Any] = field(default_factory=dict)


def load_raw(path: str | os.PathLike[str], limits: Limits | None = None) -> dict[str, Any]:
    """The dump's top-level dict ``{"rollout_id": int, "samples": [dict, ...]}``, read safely; every other
    top-level key (miles' ``metadata``) is kept as it is.

    Packed dumps (``forge-replay dumps pack``) are read transparently; ``limits`` bound the work
    (see :mod:`forge_replay.dumps.bounds`). Raises DumpError.
    """
    path = os.fspath(path)
    if is_packed(path):
        blob = load_packed_raw(path, limits)
    else:
        blob = safe_load(path, limits)
    check_top_level(blob, path)
    return blob


def check_top_level(blob: Any, path: str) -> None:
    """Raise DumpError unless ``blob`` has slime's dump shape."""
    if not isinstance(blob, dict):
        raise DumpError(path, f"expected a dict with 'rollout_id' and 'samples', got {type(blob).__name__}")
    missing = [key for key in ("rollout_id", "samples") if key not in blob]
    if missing:
        raise DumpError(path, f"missing top-level key(s) {missing}; found {quote(sorted(map(quote, blob)))}")
    if not isinstance(blob["rollout_id"], int) or isinstance(blob["rollout_id"], bool):
        raise DumpError(path, f"'rollout_id' must be an int, got {quote(blob['rollout_id'])}")
    if not isinstance(blob["samples"], list):
        raise DumpError(path, f"'samples' must be a list, got {type(blob['samples']).__name__}")
    if not isinstance(blob.get("metadata", {}), dict | None):  # miles reads it back with payload.get("metadata") or {}
        raise DumpError(path, f"'metadata' must be a dict, got {type(blob['metadata']).__name__}")


def load(path: str | os.PathLike[str], limits: Limits | None = None) -> Dump:
    """Load a slime/miles dump safely (no pickled code runs); packed dumps are read transparently.

    Raises DumpError (file-level problems) or SampleError (naming the file and sample index).
    """
    path = os.fspath(path)
    blob = load_raw(path, limits)
    samples = [Sample.from_dict(d, index=i, where=path) for i, d in enumerate(blob["samples"])]
    return Dump(rollout_id=blob["rollout_id"], samples=samples, path=path, metadata=blob.get("metadata") or {})


def save(
    path: str | os.PathLike[str],
    rollout_id: int,
    samples: Iterable[Sample | dict[str, Any]],
    metadata: dict[str, Any] | None = None,
) -> None:
    """Write ``torch.save({"rollout_id": ..., "samples": [s.to_dict() ...]}, path)`` like slime does; with
    ``metadata``, ``{"rollout_id", "metadata", "samples"}`` like miles does.

    The write is atomic (temporary file + rename) so a reader never sees half a dump.
    """
    import torch

    path = os.fspath(path)
    dicts = [s.to_dict() if isinstance(s, Sample) else dict(s) for s in samples]
    blob: dict[str, Any] = {"rollout_id": int(rollout_id)}
    if metadata is not None:
        blob["metadata"] = metadata
    blob["samples"] = dicts
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    try:
        share_like_open(fd)
        with os.fdopen(fd, "wb") as handle:
            torch.save(blob, handle)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


__all__ = ["Dump", "DumpError", "SampleError", "check_top_level", "load", "load_raw", "save"]
