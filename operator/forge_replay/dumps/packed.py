"""The packed dump format: flat arrays + offsets for the big per-token fields, memory-mappable.

Layout (little endian)::

    b"FRPACK\\x00\\x01"  u64 header_length  header (JSON)  ... 64-byte aligned arrays ...  rest

For every packed column (``tokens``, ``loss_mask``, ``rollout_log_probs``, ``teacher_log_probs``)
the file holds ``<col>.values`` (all samples concatenated), ``<col>.offsets`` (int64, n + 1) and
``<col>.packed`` (uint8, n: 1 when sample i's value is a plain list stored in the arrays). Every
other field, and any column value that is not a plain list of ints/floats (a tensor, None), stays
in ``rest``: a ``torch.save`` archive of the per-sample dicts (and the dump's top-level ``metadata``,
when it has one), read with the safe loader. So a packed dump round-trips to exactly the dicts it
was made from.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from forge_replay.dumps.bounds import Limits, open_regular
from forge_replay.dumps.safe_pickle import DumpError, open_dump, safe_load_bytes
from forge_replay.dumps.writing import share_like_open

MAGIC = b"FRPACK\x00\x01"
FORMAT_VERSION = 1
ALIGN = 64
# column -> element kind ("int" columns pick the smallest signed dtype that holds them).
PACKED_COLUMNS: dict[str, str] = {
    "tokens": "int",
    "loss_mask": "int",
    "rollout_log_probs": "float",
    "teacher_log_probs": "float",
}


def is_packed(path: str) -> bool:
    """True when ``path`` is a regular file starting with the packed-format magic."""
    try:
        with open_regular(path) as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except (OSError, ValueError):
        return False


def _plain_list(value: Any, kind: str) -> bool:
    if type(value) is not list:
        return False
    wanted = int if kind == "int" else float
    if not all(type(x) is wanted for x in value):
        return False
    return kind != "int" or not value or (_INT64_MIN <= min(value) and max(value) <= _INT64_MAX)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int_dtype(values: list[int]) -> np.dtype:
    if not values:
        return np.dtype("<i4")
    low, high = min(values), max(values)
    for dtype in ("<i1", "<i4", "<i8"):
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return np.dtype(dtype)
    raise ValueError(f"integer values out of int64 range ({low}..{high})")


def pack_dicts(sample_dicts: list[dict[str, Any]]) -> tuple[dict[str, np.ndarray], list[dict]]:
    """Split sample dicts into flat column arrays and the remaining per-sample dicts."""
    arrays: dict[str, np.ndarray] = {}
    rest = [dict(d) for d in sample_dicts]
    for column, kind in PACKED_COLUMNS.items():
        flags = np.zeros(len(rest), dtype=np.uint8)
        offsets = np.zeros(len(rest) + 1, dtype=np.int64)
        chunks: list[list] = []
        total = 0
        for i, d in enumerate(rest):
            value = d.get(column)
            if column in d and _plain_list(value, kind):
                flags[i] = 1
                chunks.append(value)
                total += len(value)
                del d[column]
            offsets[i + 1] = total
        if not flags.any():
            continue
        flat = [x for chunk in chunks for x in chunk]
        dtype = _int_dtype(flat) if kind == "int" else np.dtype("<f8")
        arrays[f"{column}.values"] = np.asarray(flat, dtype=dtype)
        arrays[f"{column}.offsets"] = offsets
        arrays[f"{column}.packed"] = flags
    return arrays, rest


def write_packed(
    path: str, rollout_id: int, sample_dicts: list[dict[str, Any]], metadata: dict[str, Any] | None = None
) -> None:
    """Write ``sample_dicts`` (slime ``to_dict`` shape) and miles' top-level ``metadata`` (kept only when
    given) as a packed dump, atomically."""
    import io

    import torch

    key_orders = [list(d.keys()) for d in sample_dicts]
    arrays, rest = pack_dicts(sample_dicts)
    rest_buffer = io.BytesIO()
    rest_blob: dict[str, Any] = {"rollout_id": int(rollout_id), "samples": rest, "key_orders": key_orders}
    if metadata is not None:
        rest_blob["metadata"] = metadata
    torch.save(rest_blob, rest_buffer)
    rest_bytes = rest_buffer.getvalue()

    entries: dict[str, dict[str, Any]] = {}
    header: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "rollout_id": int(rollout_id),
        "num_samples": len(sample_dicts),
        "arrays": entries,
    }
    # Offsets depend on the header length, which depends on the offsets: iterate until stable.
    header_len = 0
    for _ in range(4):
        position = _align(len(MAGIC) + 8 + header_len)
        for name, array in arrays.items():
            entries[name] = {"dtype": array.dtype.str, "offset": position, "count": int(array.size)}
            position = _align(position + array.nbytes)
        header["rest"] = {"offset": position, "length": len(rest_bytes)}
        encoded = json.dumps(header, sort_keys=True).encode()
        if len(encoded) == header_len:
            break
        header_len = len(encoded)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pack", dir=directory)
    try:
        share_like_open(fd)
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + struct.pack("<Q", len(encoded)) + encoded)
            for name, array in arrays.items():
                out.seek(entries[name]["offset"])
                out.write(array.tobytes())
            out.seek(header["rest"]["offset"])
            out.write(rest_bytes)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class PackedDump:
    """An opened packed dump: column arrays are zero-copy views of the (memory-mapped) file."""

    path: str
    rollout_id: int
    num_samples: int
    arrays: dict[str, np.ndarray]
    rest_bytes: bytes

    def top_level(self, limits: Limits | None = None) -> dict[str, Any]:
        """slime's top-level dict ``{"rollout_id", "samples": [dict, ...]}``, with ``metadata`` between the
        two when the source dump had it (miles' order)."""
        blob = self._rest(limits)
        top: dict[str, Any] = {"rollout_id": self.rollout_id}
        if "metadata" in blob:
            top["metadata"] = blob["metadata"]
        top["samples"] = self._samples(blob)
        return top

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(values, offsets, packed flags) of a packed column, or None when no sample had it packed."""
        if f"{name}.values" not in self.arrays:
            return None
        return self.arrays[f"{name}.values"], self.arrays[f"{name}.offsets"], self.arrays[f"{name}.packed"]

    def sample_dicts(self, limits: Limits | None = None) -> list[dict[str, Any]]:
        """The original per-sample dicts, with the packed columns as Python lists again."""
        return self._samples(self._rest(limits))

    def _rest(self, limits: Limits | None) -> dict[str, Any]:
        blob = safe_load_bytes(self.rest_bytes, f"{self.path} (rest section)", limits)
        if not isinstance(blob, dict) or not isinstance(blob.get("metadata", {}), dict):
            raise DumpError(self.path, "packed rest section does not match the header", "re-run forge-replay dumps pack")
        return blob

    def _samples(self, blob: dict[str, Any]) -> list[dict[str, Any]]:
        rest = blob.get("samples")
        orders = blob.get("key_orders")
        if (
            not isinstance(rest, list)
            or len(rest) != self.num_samples
            or not all(isinstance(d, dict) for d in rest)
            or not isinstance(orders, list)
            or len(orders) != self.num_samples
            or not all(isinstance(o, list) and all(isinstance(k, str) for k in o) for o in orders)
        ):
            raise DumpError(self.path, "packed rest section does not match the header", "re-run forge-replay dumps pack")
        for column in PACKED_COLUMNS:
            found = self.column(column)
            if found is None:
                continue
            values, offsets, flags = found
            for i in np.flatnonzero(flags).tolist():
                rest[i][column] = values[offsets[i] : offsets[i + 1]].tolist()
        return [{key: d[key] for key in order} if set(order) == set(d) else d for d, order in zip(rest, orders)]


def open_packed(path: str, use_mmap: bool = True) -> PackedDump:
    """Open a packed dump; with ``use_mmap`` the arrays are read lazily from the page cache."""
    with open_dump(path) as handle:
        try:
            if use_mmap:
                buffer: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            else:
                buffer = handle.read()
        except (OSError, ValueError) as exc:
            raise DumpError(path, f"cannot open packed dump: {exc}") from None
    if len(buffer) < len(MAGIC) + 8 or buffer[: len(MAGIC)] != MAGIC:
        raise DumpError(path, "not a packed dump (bad magic)")
    (header_len,) = struct.unpack_from("<Q", buffer, len(MAGIC))
    start = len(MAGIC) + 8
    try:
        header = json.loads(bytes(buffer[start : start + header_len]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise DumpError(path, f"corrupt packed header: {_first(exc)}", "the file may be truncated") from None
    if not isinstance(header, dict) or header.get("version") != FORMAT_VERSION:
        header = header if isinstance(header, dict) else {}
        raise DumpError(path, f"packed format version {header.get('version')!r} is not supported (expected 1)")
    size = len(buffer)
    arrays: dict[str, np.ndarray] = {}
    try:
        for name, entry in header["arrays"].items():
            dtype = np.dtype(entry["dtype"])
            if dtype.kind not in "iuf" or min(entry["offset"], entry["count"]) < 0:
                raise DumpError(path, f"array {name[:100]!r} has dtype {dtype} at offset {entry['offset']}")
            end = entry["offset"] + entry["count"] * dtype.itemsize
            if end > size:
                raise DumpError(path, f"array {name!r} runs past the end of the file", "the file is truncated")
            arrays[name] = np.frombuffer(buffer, dtype=dtype, count=entry["count"], offset=entry["offset"])
        rest = header["rest"]
        if rest["offset"] + rest["length"] > size:
            raise DumpError(path, "rest section runs past the end of the file", "the file is truncated")
        rest_bytes = bytes(buffer[rest["offset"] : rest["offset"] + rest["length"]])
        num_samples = int(header["num_samples"])
        rollout_id = int(header["rollout_id"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DumpError(path, f"corrupt packed header: {type(exc).__name__}: {_first(exc)}") from None
    for column in PACKED_COLUMNS:
        if f"{column}.values" in arrays:
            if f"{column}.offsets" not in arrays or f"{column}.packed" not in arrays:
                raise DumpError(path, f"column {column!r} has values but no offsets or flags", "the file is corrupt")
            offsets = arrays[f"{column}.offsets"]
            if offsets.size != num_samples + 1 or arrays[f"{column}.packed"].size != num_samples:
                raise DumpError(path, f"column {column!r} offsets do not match {num_samples} samples")
            bad_start = offsets.size > 0 and offsets[0] != 0
            if bad_start or offsets[-1] != arrays[f"{column}.values"].size or np.any(np.diff(offsets) < 0):
                raise DumpError(path, f"column {column!r} offsets are inconsistent", "the file is corrupt")
    return PackedDump(path=path, rollout_id=rollout_id, num_samples=num_samples, arrays=arrays, rest_bytes=rest_bytes)


def load_packed_raw(path: str, limits: Limits | None = None) -> dict[str, Any]:
    """The packed dump as slime's top-level dict ``{"rollout_id", "samples": [dict, ...]}`` (with miles'
    ``metadata`` when the source had it)."""
    return open_packed(path, use_mmap=False).top_level(limits)


def _first(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def identical(a: Any, b: Any) -> bool:
    """Same structure, same types, same values (NaN equals NaN; tensors and arrays by dtype, shape, values).

    What `dumps pack` checks a packed file against its source with; dict key order counts, as
    ``Sample.to_dict`` keeps it.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        types = list(map(type, a))
        if len(a) != len(b) or types != list(map(type, b)):
            return False
        if set(types) <= _SCALARS and a == b:  # C-speed path for plain number lists (NaN falls through)
            return True
        return all(identical(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if hasattr(a, "dtype") and hasattr(a, "shape") and hasattr(a, "isnan"):  # a torch tensor (torch stays lazy here)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool((a == b).all())
    try:
        return bool(a == b)
    except (RuntimeError, ValueError):
        return False


_SCALARS = {int, float, str, bytes, bool, type(None)}
