"""A safe, C-speed reader for ``torch.save`` zip files.

``torch.load(weights_only=False)`` runs any callable a pickle names; ``weights_only=True`` is safe
but parses in Python (about 9x slower on rollout dumps). This module keeps the C unpickler and
only overrides ``find_class`` (an allowlist: tensor rebuild, dtypes, OrderedDict, ...) and
``persistent_load`` (storages read from the zip's ``data/<key>`` records). No other global is
ever resolved, so nothing named by the pickle can run; the parse itself stays at C speed.
Storage-type globals resolve to inert markers, so a pickle cannot even call a storage
constructor.
"""

from __future__ import annotations

import _codecs
import _compat_pickle
import collections
import io
import os
import pickle
import sys
import warnings
from dataclasses import dataclass
from typing import IO, Any

import torch

ZIP_MAGIC = b"PK\x03\x04"
# torch's legacy (pre-1.6) serialization starts with this pickled magic number.
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C


class DumpError(Exception):
    """A dump cannot be read safely; the message names the file (and the refused global, if any)."""

    def __init__(self, path: str, problem: str, hint: str | None = None):
        self.path = path
        self.problem = problem
        self.hint = hint
        message = f"{path}: {problem}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside the allowlist."""

    def __init__(self, module: str, name: str):
        self.global_name = f"{module}.{name}"
        super().__init__(f"refused global {self.global_name}: not in forge-replay's allowlist")


@dataclass(frozen=True)
class _StorageType:
    """Inert stand-in for ``torch.<X>Storage`` classes: carries the dtype, cannot be called."""

    dtype: torch.dtype


def _tensor_rebuild_globals() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch", "Size"): torch.Size,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "device"): torch.device,
        # protocol 2 pickles bytes (e.g. numpy array data) as _codecs.encode(str, "latin1")
        ("_codecs", "encode"): _codecs.encode,
    }
    with warnings.catch_warnings():  # touching legacy storage classes warns about TypedStorage
        warnings.simplefilter("ignore")
        _add_torch_names(allowed)
    return allowed


def _add_torch_names(allowed: dict[tuple[str, str], Any]) -> None:
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
        elif name.endswith("Storage") and isinstance(value, type):
            if value is torch.UntypedStorage:
                allowed[("torch", name)] = _StorageType(torch.uint8)
            elif issubclass(value, torch.storage._LegacyStorage):
                allowed[("torch", name)] = _StorageType(value.dtype)


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """numpy arrays of plain dtypes (some dumps hold them); object arrays still go through the allowlist."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return {}
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]

    reconstruct = multiarray._reconstruct
    scalar = multiarray.scalar
    allowed: dict[tuple[str, str], Any] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    for name in dir(np.dtypes):
        value = getattr(np.dtypes, name)
        if isinstance(value, type) and issubclass(value, np.dtype) and name != "ObjectDType":
            allowed[("numpy.dtypes", name)] = value
    return allowed


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {**_tensor_rebuild_globals(), **_numpy_globals()}


class _SafeUnpickler(pickle.Unpickler):
    """C unpickler that resolves only allowlisted globals and reads storages from a zip reader."""

    def __init__(self, file: IO[bytes], storage_reader: Any | None):
        super().__init__(file)
        self._storage_reader = storage_reader
        self._storages: dict[str, torch.storage.TypedStorage] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2, which torch.save uses), mapped as pickle's own find_class does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise RefusedGlobal(module, name) from None

    def persistent_load(self, saved_id: Any) -> Any:
        if self._storage_reader is None:
            raise pickle.UnpicklingError(f"persistent id {saved_id!r} outside a torch.save zip archive")
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise pickle.UnpicklingError(f"malformed persistent id {saved_id!r}")
        typename, storage_type, key, _location, numel = saved_id
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage" or not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unsupported persistent id {saved_id[:2]!r}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"malformed storage reference {saved_id!r}")
        dtype = storage_type.dtype
        cached = self._storages.get(key)
        if cached is not None and cached.dtype == dtype:
            return cached
        nbytes = numel * torch._utils._element_size(dtype)
        untyped = self._storage_reader.read_storage(key, nbytes, dtype)
        typed = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
        self._storages[key] = typed
        return typed


class _ZipStorageReader:
    """Reads ``data/<key>`` records of a torch zip archive as CPU storages (torch's own C++ reader)."""

    def __init__(self, reader: Any, path: str):
        self._reader = reader
        self._path = path
        self._swap = False
        if reader.has_record("byteorder"):
            order = reader.get_record("byteorder").decode()
            self._swap = order != sys.byteorder

    def read_storage(self, key: str, nbytes: int, dtype: torch.dtype) -> torch.UntypedStorage:
        name = f"data/{key}"
        if not self._reader.has_record(name):
            raise pickle.UnpicklingError(f"storage record {name!r} is missing from the archive")
        # Check the size before reading, so a lying header cannot make us allocate a huge buffer.
        size = self._reader.get_record_size(name)
        if size != nbytes:
            raise pickle.UnpicklingError(f"storage record {name!r} has {size} bytes, the pickle expects {nbytes}")
        storage = self._reader.get_storage_from_record(name, nbytes, torch.UntypedStorage)
        untyped = storage._typed_storage()._untyped_storage
        if self._swap:  # written on a machine of the other byte order
            untyped.byteswap(dtype)
        return untyped


def _open_zip(source: str | bytes | IO[bytes], path: str) -> Any:
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return torch._C.PyTorchFileReader(io.BytesIO(bytes(source)))
        return torch._C.PyTorchFileReader(source)
    except Exception as exc:  # the C++ reader raises RuntimeError with a long C++ trace
        raise DumpError(
            path, f"not a readable torch.save zip archive: {_first_line(exc)}", "the file may be truncated or corrupt"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def safe_load_bytes(data: bytes, path: str = "<bytes>") -> Any:
    """Safely load a ``torch.save`` zip archive held in memory (see :func:`safe_load`)."""
    return _load_zip(_open_zip(data, path), path)


def safe_load(path: str | os.PathLike[str]) -> Any:
    """Load a ``torch.save`` file without executing pickled code; tensors land on the CPU.

    Raises DumpError naming ``path`` (and the refused global) for unreadable, corrupt or
    disallowed content.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise DumpError(path, f"cannot open: {exc.strerror or exc}") from None
    if head != ZIP_MAGIC:
        return _load_plain_pickle(path)
    return _load_zip(_open_zip(path, path), path)


def _load_zip(reader: Any, path: str) -> Any:
    if not reader.has_record("data.pkl"):
        raise DumpError(path, "archive has no data.pkl record", "is this a torch.save file?")
    try:
        pickled = reader.get_record("data.pkl")
    except Exception as exc:
        raise DumpError(path, f"cannot read data.pkl: {_first_line(exc)}", "the file may be truncated") from None
    return _unpickle(pickled, _ZipStorageReader(reader, path), path)


def _load_plain_pickle(path: str) -> Any:
    with open(path, "rb") as handle:
        data = handle.read()
    if not data or data[:1] != b"\x80":
        raise DumpError(path, "not a torch.save zip archive, a packed dump or a pickle", "check the path")
    result = _unpickle(data, None, path)
    if result == _LEGACY_TORCH_MAGIC:
        raise DumpError(
            path,
            "legacy (pre-1.6) torch serialization is not supported",
            "re-save it with torch.save's default zip format",
        )
    return result


def _unpickle(pickled: bytes, storage_reader: Any, path: str) -> Any:
    unpickler = _SafeUnpickler(io.BytesIO(pickled), storage_reader)
    try:
        return unpickler.load()
    except RefusedGlobal as exc:
        raise DumpError(
            path,
            f"refused to load: the pickle names global {exc.global_name}, which is not allowed in a rollout dump",
            "nothing was executed; dumps may only hold plain data and tensors",
        ) from None
    except (EOFError, pickle.UnpicklingError) as exc:
        raise DumpError(path, f"corrupt pickle data: {exc or type(exc).__name__}", "the file may be truncated") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, MemoryError) as exc:
        raise DumpError(path, f"malformed pickle data: {type(exc).__name__}: {_first_line(exc)}") from None
