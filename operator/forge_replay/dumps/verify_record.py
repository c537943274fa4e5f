"""The verify Job's record of what it checked, so that the runtime's pre-flight, where GPUs are already held, does not
verify the same files again.

`forge-replay dumps verify --record FILE` (the operator's verify Job writes it into the run's folder of the results
claim) lists every file that passed: its path relative to the dumps root, whether it was checked as a train or an
eval dump, its size and mtime (ns) when it was read, and what verify found (samples, the dump's own rollout_id, samples
with an all-zero loss mask), under the settings the verdict depends on (:meth:`FileSettings.to_dict`: reward keys,
samples per prompt, the model's vocab_size and max_position_embeddings, the loader's bounds).

The pre-flight (:func:`~forge_replay.dumps.verify.verify_dumps` with ``trust=FILE``) trusts a file only when the record
holds it for the same kind with the same size and mtime and the record's settings are its own; a file that changed,
or one the record does not hold, is verified again; a record that is missing, unreadable or made under other settings
trusts nothing, and the report's notes say which. Trusting the record skips only the pre-flight: training still reads
every dump through the safe loader and the same conversion, and refuses a bad one there.

For a slime / miles job the record also keeps what that framework would drop without a word (per file, and as
verify's ``notes``); the job's publish step copies those notes into report.json's ``preflight``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from forge_replay.dumps.writing import now_rfc3339, write_atomically

RECORD_FILE = "verify-record.json"
FORMAT = "forge-replay/verify-record"
VERSION = 1
MAX_RECORD_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Stamp:
    """What tells a file changed: its size and modification time (ns)."""

    size: int
    mtime_ns: int


def stamp_of(path: str) -> Stamp | None:
    """``path``'s stamp, or None when it cannot be stat'ed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return Stamp(info.st_size, info.st_mtime_ns)


def record_key(path: str, root: str | None) -> str:
    """How the record names a file: relative to the dumps root (mounted elsewhere in another pod), else absolute."""
    return os.path.relpath(path, root) if root else os.path.abspath(path)


@dataclass(frozen=True)
class Entry:
    """One file the record holds: its stamp when verified and what verify found."""

    stamp: Stamp
    samples: int
    rollout_id: int | None
    masked_out: int | None
    dropped: tuple[str, ...] = ()  # what slime / miles would drop of it without a word (acceptance.dropped_notes)


def record_document(settings: dict[str, Any], entries: dict[tuple[str, str], Entry],
                    notes: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The record as JSON: ``entries`` maps (record key, kind) to what was found; ``notes`` are verify's notes of what
    a slime / miles run would drop without a word (``VerifyReport.dropped``), which a slime / miles run's report.json
    carries in its ``preflight`` (backends/publish.py)."""
    written_at = now_rfc3339()
    files = [{"path": path, "kind": kind, "size": e.stamp.size, "mtime_ns": e.stamp.mtime_ns, "samples": e.samples,
              "rollout_id": e.rollout_id, "masked_out": e.masked_out, **({"dropped": list(e.dropped)} if e.dropped
                                                                          else {})}
             for (path, kind), e in sorted(entries.items())]
    return {"format": FORMAT, "version": VERSION, "written_at": written_at, "settings": settings, "files": files,
            "notes": list(notes)}


def write_record(path: str, document: dict[str, Any]) -> None:
    """Write the record whole (a temporary file and a rename), creating its folder; raises OSError."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(path, json.dumps(document, indent=1, sort_keys=True) + "\n")


@dataclass
class Trust:
    """What a record lets the pre-flight skip: its entries, or none and a note saying why."""

    path: str | None
    entries: dict[tuple[str, str], Entry]
    note: str = ""

    def entry_for(self, key: str, kind: str, stamp: Stamp | None) -> tuple[Entry | None, str]:
        """The entry to trust for a file, or None and why it is verified again."""
        entry = self.entries.get((key, kind))
        if entry is None:
            return None, "" if self.note else "not in the verify record"  # an unusable record: the note says why
        if stamp != entry.stamp:
            return None, "changed since the verify record (size or mtime)"
        return entry, ""


def read_record(path: str | None, settings: dict[str, Any]) -> Trust:
    """The record at ``path`` for files verified under ``settings``; a record that is missing, unreadable or for other
    settings trusts nothing, with a note that says so."""
    if path is None:
        return Trust(None, {}, "no verify record was given: every file is verified here")
    try:
        if os.path.getsize(path) > MAX_RECORD_BYTES:
            raise ValueError(f"larger than {MAX_RECORD_BYTES // 2**20} MiB")
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        entries = _entries(document)
    except FileNotFoundError:
        return Trust(path, {}, f"no verify record at {path}: every file is verified here")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        return Trust(path, {}, f"cannot read the verify record {path} ({reason}): every file is verified here")
    differences = _differences(document["settings"], settings)
    if differences:
        return Trust(path, {}, f"the verify record {path} was made under other settings ({'; '.join(differences[:4])}):"
                               " every file is verified here")
    return Trust(path, entries)


def _entries(document: Any) -> dict[tuple[str, str], Entry]:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    if document.get("version") != VERSION:
        raise ValueError(f"version {document.get('version')!r}, this forge-replay reads version {VERSION}")
    if not isinstance(document.get("settings"), dict) or not isinstance(document.get("files"), list):
        raise ValueError("settings or files missing")
    entries = {}
    for item in document["files"]:
        if not (isinstance(item, dict) and isinstance(item["path"], str) and item["kind"] in ("train", "eval")
                and all(_is_int(item[k]) for k in ("size", "mtime_ns", "samples"))
                and all(item[k] is None or _is_int(item[k]) for k in ("rollout_id", "masked_out"))):
            raise ValueError(f"malformed file entry {json.dumps(item)[:120]}")
        dropped = item.get("dropped", [])
        if not (isinstance(dropped, list) and all(isinstance(d, str) for d in dropped)):
            raise ValueError(f"malformed file entry {json.dumps(item)[:120]}")
        entries[(item["path"], item["kind"])] = Entry(Stamp(item["size"], item["mtime_ns"]), item["samples"],
                                                      item["rollout_id"], item["masked_out"], tuple(dropped))
    return entries


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _differences(recorded: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """The settings that differ, as ``name: X there, Y here``."""
    found = []
    for name in sorted(set(recorded) | set(current)):
        there, here = recorded.get(name), current.get(name)
        if isinstance(there, dict) and isinstance(here, dict):
            found += _differences(there, here, f"{prefix}{name}.")
        elif there != here:
            found.append(f"{prefix}{name}: {json.dumps(there)} there, {json.dumps(here)} here")
    return found
