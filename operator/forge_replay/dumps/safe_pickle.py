"""A safe, C-speed reader for ``torch.save`` zip files.

``torch.load(weights_only=False)`` runs any callable a pickle names; ``weights_only=True`` is safe
but parses in Python (about 9x slower on rollout dumps). This module keeps the C unpickler and
only overrides ``find_class`` (an allowlist: tensor rebuild, dtypes, OrderedDict, ...) and
``persistent_load`` (storages read from the zip's ``data/<key>`` records). No other global is
ever resolved, so nothing named by the pickle can run; the parse itself stays at C speed.
Builtins protocol 2 writes as globals (set, frozenset, complex, bytearray) are checked wrappers;
tensors of dtypes without a legacy storage class (uint16/32/64, float8) come through a checked
``_rebuild_tensor_v3``; the few upstream classes dumps hold (miles' ``AdapterRef`` / ``RewardSpec``,
PIL images) resolve to the inert stand-ins of :mod:`forge_replay.dumps.inert`.

Integrity: nothing ``find_class`` hands out can be changed by the pickle (BUILD, attribute
state), so no dump can affect a later load. Functions are handed out as read-only wrappers that
check their arguments, storage types as read-only markers (a pickle cannot even call a storage
constructor), numpy dtypes as checked tokens (numpy's own ``dtype.__setstate__`` can crash the
process), everything else is an immutable builtin. tests/unit/test_dumps_hostile.py holds the
attacks."""

from __future__ import annotations

import _compat_pickle
import collections
import io
import os
import pickle
import re
import sys
import warnings
from typing import IO, Any

import torch

from forge_replay.dumps.bounds import BoundsError, Limits, check_pickle, default_limits, open_regular, quote, raise_hint
from forge_replay.dumps.inert import upstream_globals
from forge_replay.dumps.refusal import Refused
from forge_replay.errors import Portable

ZIP_MAGIC = b"PK\x03\x04"
# torch's legacy (pre-1.6) serialization starts with this pickled magic number.
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C


class DumpError(Portable, Exception):
    """A dump cannot be read safely; the message names the file (and the refused global, if any)."""

    def __init__(self, path: str, problem: str, hint: str | None = None):
        self.path = path
        self.problem = problem
        self.hint = hint
        message = f"{path}: {problem}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class RefusedGlobal(Portable, Refused):
    """The pickle names a global outside the allowlist."""

    def __init__(self, module: str, name: str):
        self.global_name = f"{module}.{name}"
        super().__init__(f"the pickle names global {self.global_name}, which is not allowed in a rollout dump")


class _Sealed:
    """Base of everything ``find_class`` hands out that is not an immutable builtin.

    Nothing in a pickle can change it: BUILD with a dict state finds no ``__dict__`` (slots only),
    BUILD with slot state and SETATTR-like tricks hit ``__setattr__``, which refuses. A dump can
    therefore not change anything that outlives its own load (issue 19: a BUILD on a shared
    marker or on ``_rebuild_tensor_v2.__defaults__`` used to poison every later load).
    """

    __slots__ = ()

    @property
    def __dict__(self) -> Any:  # what pickle's BUILD writes a dict state into
        raise Refused(f"the pickle sets state on {self!r}, which is read-only")

    def __setattr__(self, name: str, value: Any) -> None:
        raise Refused(f"the pickle sets attribute {quote(name)} of {self!r}, which is read-only")

    def __delattr__(self, name: str) -> None:
        raise Refused(f"the pickle deletes attribute {quote(name)} of {self!r}, which is read-only")


class _StorageType(_Sealed):
    """Inert stand-in for ``torch.<X>Storage`` classes: carries the dtype, cannot be called or changed."""

    __slots__ = ("dtype", "name")

    def __init__(self, dtype: torch.dtype, name: str):
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "name", name)

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _Call(_Sealed):
    """A read-only callable standing for an allowlisted function (functions themselves are mutable)."""

    __slots__ = ("_fn", "_name")

    def __init__(self, fn: Any, name: str):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __repr__(self) -> str:
        return self._name


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any, *rest: Any):
    """``torch._utils._rebuild_tensor_v2`` with its arguments checked first (types, hooks, storage bounds)."""
    metadata = _checked_tensor_args(storage, storage.size() if _is_storage(storage) else 0, offset, size, stride,
                                    requires_grad, hooks, rest)
    return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, collections.OrderedDict(), metadata)


def _rebuild_tensor_v3(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                       dtype: Any, *rest: Any):
    """``torch._utils._rebuild_tensor_v3`` (dtypes without a legacy storage class: uint16/32/64, float8), checked as
    v2 is; its storage is untyped (bytes), so the geometry is checked in elements of ``dtype``."""
    if not isinstance(dtype, torch.dtype):
        raise pickle.UnpicklingError(f"malformed tensor record: dtype {quote(dtype)}")
    if _is_storage(storage) and storage.dtype != torch.uint8:
        raise pickle.UnpicklingError(f"a {dtype} tensor over a {storage.dtype} storage: expected an untyped storage")
    elements = storage.size() // torch._utils._element_size(dtype) if _is_storage(storage) else 0
    metadata = _checked_tensor_args(storage, elements, offset, size, stride, requires_grad, hooks, rest)
    return torch._utils._rebuild_tensor_v3(
        storage, offset, size, stride, requires_grad, collections.OrderedDict(), dtype, metadata
    )


def _is_storage(value: Any) -> bool:
    return isinstance(value, torch.storage.TypedStorage)


def _checked_tensor_args(storage: Any, elements: int, offset: Any, size: Any, stride: Any, requires_grad: Any,
                         hooks: Any, rest: tuple) -> dict | None:
    """The checks of a tensor rebuild's arguments (``elements``: the storage's, in the tensor's dtype); its metadata."""
    if not _is_storage(storage) or len(rest) > 1:
        raise pickle.UnpicklingError("malformed tensor record")
    if not isinstance(offset, int) or not _int_tuple(size) or not _int_tuple(stride) or len(size) != len(stride):
        raise pickle.UnpicklingError(f"malformed tensor geometry: offset {quote(offset)}, size {quote(size)}")
    if type(requires_grad) is not bool or (hooks is not None and (not isinstance(hooks, dict) or hooks)):
        raise pickle.UnpicklingError("malformed tensor record: requires_grad must be a bool and backward hooks empty")
    metadata = rest[0] if rest else None
    if metadata is not None and not isinstance(metadata, dict):
        raise pickle.UnpicklingError(f"malformed tensor metadata {quote(metadata)}")
    _check_geometry(elements, offset, size, stride)
    return metadata


def _check_geometry(storage_elements: int, offset: int, size: tuple, stride: tuple) -> None:
    """A tensor may not hold more elements than its storage, nor reach outside it.

    Stride-0 expansion would otherwise let a few bytes stand for 2^40 elements that training
    materializes (a blank MemoryError, or minutes per step).
    """
    if offset < 0 or any(n < 0 for n in size) or any(st < 0 for st in stride):
        raise pickle.UnpicklingError(f"malformed tensor geometry: offset {offset}, size {quote(size)}, stride {quote(stride)}")
    elements = 1
    for n in size:
        elements *= n
    if elements == 0:
        return
    if elements > storage_elements:
        raise Refused(
            f"a tensor of {elements} elements (size {quote(size)}, stride {quote(stride)}) over a storage of "
            f"{storage_elements}: expanded (stride-0) tensors are not allowed in dumps; save .contiguous() copies"
        )
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    if last >= storage_elements:
        raise pickle.UnpicklingError(f"a tensor reaches element {last} of a storage of {storage_elements}")


def _int_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and all(type(v) is int for v in value)


def _latin1(text: Any, encoding: Any) -> bytes:
    """``_codecs.encode`` as protocol 2 uses it (bytes pickled as a latin-1 str), and nothing else."""
    if not isinstance(text, str) or encoding != "latin1":
        raise Refused(f"_codecs.encode with encoding {quote(encoding)}: only latin1 is allowed")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()``, which protocol 2 writes for ``b""``; ``bytes(n)`` would allocate n bytes, so no arguments."""
    if args:
        raise Refused(f"bytes{quote(args)}: only bytes() is allowed")
    return b""


def _set(*args: Any) -> set:
    """``set(list)`` as protocol 2 writes a set; anything but one list or tuple of items is refused."""
    return set(_items("set", args))


def _frozenset(*args: Any) -> frozenset:
    return frozenset(_items("frozenset", args))


def _items(kind: str, args: tuple) -> Any:
    if not args:
        return ()
    if len(args) != 1 or type(args[0]) not in (list, tuple):
        raise Refused(f"{kind}{quote(args)}: only {kind}(list) is allowed")
    return args[0]


def _complex(*args: Any) -> complex:
    """``complex(real, imag)`` of two floats (or ints), as protocol 2 writes a complex number."""
    if len(args) > 2 or not all(type(a) in (int, float) for a in args):
        raise Refused(f"complex{quote(args)}: only complex(real, imag) of numbers is allowed")
    try:
        return complex(*args)
    except OverflowError:
        raise Refused(f"complex{quote(args)}: a part does not fit a float") from None


def _bytearray(*args: Any) -> bytearray:
    """``bytearray(bytes)`` as protocol 2 writes one; ``bytearray(n)`` would allocate n bytes, so it is refused."""
    if len(args) > 1 or (args and type(args[0]) is not bytes):
        raise Refused(f"bytearray{quote(args)}: only bytearray(bytes) is allowed")
    return bytearray(*args)


def _tensor_rebuild_globals() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _Call(_rebuild_tensor, "torch._utils._rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor_v3"): _Call(_rebuild_tensor_v3, "torch._utils._rebuild_tensor_v3"),
        ("torch.storage", "UntypedStorage"): _StorageType(torch.uint8, "storage.UntypedStorage"),
        # builtins protocol 2 writes as globals (REDUCE calls), each through a checked wrapper
        ("builtins", "set"): _Call(_set, "builtins.set"),
        ("builtins", "frozenset"): _Call(_frozenset, "builtins.frozenset"),
        ("builtins", "complex"): _Call(_complex, "builtins.complex"),
        ("builtins", "bytearray"): _Call(_bytearray, "builtins.bytearray"),
        ("torch", "Size"): torch.Size,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "device"): torch.device,
        # protocol 2 pickles bytes (e.g. numpy array data) as _codecs.encode(str, "latin1")
        ("_codecs", "encode"): _Call(_latin1, "_codecs.encode"),
        ("builtins", "bytes"): _Call(_empty_bytes, "builtins.bytes"),
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
                allowed[("torch", name)] = _StorageType(torch.uint8, name)
            elif issubclass(value, torch.storage._LegacyStorage):
                allowed[("torch", name)] = _StorageType(value.dtype, name)


# numpy: plain numeric arrays and scalars only (slime stores routed experts as an int32 ndarray).
# numpy's own dtype.__setstate__ crashes the interpreter on some states, so dtypes are tokens
# checked here and turned into real dtypes only when an array or scalar is built.
_PLAIN_NUMPY_DTYPE = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248]|c(8|16))")


class _NumpyDType(_Sealed):
    """A checked ``numpy.dtype(spec, align, copy)`` call; its BUILD state may only set the byte order."""

    __slots__ = ("spec", "byteorder")

    def __init__(self, spec: Any, align: Any = False, copy: Any = False):
        if not isinstance(spec, str) or not _PLAIN_NUMPY_DTYPE.fullmatch(spec) or type(align) is not bool:
            raise Refused(f"numpy dtype {quote(spec)}: only plain numeric dtypes are allowed")
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "byteorder", "=")

    def __setstate__(self, state: Any) -> None:
        # numpy pickles a plain dtype's state as (3, byteorder, None, None, None, -1, -1, 0).
        if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in ("<", ">", "|", "=")):
            raise Refused(f"numpy dtype state {quote(state)}: only a byte order may be set")
        if state[2:] != (None, None, None, -1, -1, 0):
            raise Refused(f"numpy dtype state {quote(state)}: only a byte order may be set")
        object.__setattr__(self, "byteorder", state[1])

    def real(self) -> Any:
        import numpy as np

        dtype = np.dtype(self.spec)
        return dtype if self.byteorder in ("=", "|") else dtype.newbyteorder(self.byteorder)

    def __repr__(self) -> str:
        return f"numpy.dtype({self.spec!r})"


def _numpy_array_class() -> Any:
    import numpy as np

    class DumpArray(np.ndarray):
        """An ndarray read from a dump: its pickled state is checked before numpy sees it; pickles as ndarray."""

        def __setstate__(self, state: Any) -> None:
            if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
                raise Refused(f"numpy array state {quote(state)}")
            _, shape, dtype, fortran, data = state
            if not _int_tuple(shape) or any(n < 0 for n in shape) or not isinstance(dtype, _NumpyDType):
                raise Refused(f"numpy array of shape {quote(shape)} and dtype {quote(dtype)}")
            real = dtype.real()
            count = 1
            for n in shape:
                count *= n
            if type(fortran) is not bool or not isinstance(data, bytes) or len(data) != count * real.itemsize:
                raise pickle.UnpicklingError(f"numpy array data does not match shape {quote(shape)} and {real}")
            np.ndarray.__setstate__(self, (1, shape, real, fortran, data))

        def __reduce__(self) -> Any:  # saved again (pack, Ray), it is a plain ndarray
            return self.view(np.ndarray).__reduce__()

    DumpArray.__module__ = __name__
    DumpArray.__qualname__ = "DumpArray"
    return DumpArray


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """numpy arrays and scalars of plain numeric dtypes (some dumps hold them); nothing else of numpy."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return {}
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]

    array_class = _numpy_array_class()

    def reconstruct(cls: Any, shape: Any, typecode: Any) -> Any:
        if cls is not np.ndarray or shape != (0,) or typecode != b"b":
            raise Refused(f"numpy _reconstruct of {quote(cls)}: only plain ndarrays are allowed")
        return array_class((0,), dtype=np.uint8)

    def scalar(dtype: Any, data: Any) -> Any:
        if not isinstance(dtype, _NumpyDType) or not isinstance(data, bytes):
            raise Refused(f"numpy scalar of {quote(dtype)}")
        real = dtype.real()
        if len(data) != real.itemsize:
            raise pickle.UnpicklingError(f"numpy scalar data has {len(data)} bytes, {real} needs {real.itemsize}")
        return multiarray.scalar(real, data)

    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _Call(_NumpyDType, "numpy.dtype"),
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = _Call(reconstruct, f"{module}._reconstruct")
        allowed[(module, "scalar")] = _Call(scalar, f"{module}.scalar")
    return allowed


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {**_tensor_rebuild_globals(), **_numpy_globals(), **upstream_globals()}


_PREFETCH_BYTES = 1 << 17
"""The C unpickler's prefetch size (_pickle.c: PREFETCH); the buffered reader holds that much."""


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
            raise pickle.UnpicklingError(f"persistent id {quote(saved_id)} outside a torch.save zip archive")
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise pickle.UnpicklingError(f"malformed persistent id {quote(saved_id)}")
        typename, storage_type, key, _location, numel = saved_id
        if isinstance(typename, bytes):
            typename = typename.decode("ascii")
        if typename != "storage" or not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unsupported persistent id {quote(saved_id[:2])}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"malformed storage reference {quote(saved_id)}")
        dtype = storage_type.dtype
        cached = self._storages.get(key)
        if cached is not None:
            # torch.save refuses to write one storage under two dtypes; re-reading it for each would let
            # a small pickle allocate the record again and again.
            if cached.dtype != dtype:
                raise pickle.UnpicklingError(f"storage record {quote(key)} is referenced as {cached.dtype} and {dtype}")
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
            raise pickle.UnpicklingError(f"storage record {quote(name)} is missing from the archive")
        # Check the size before reading, so a lying header cannot make us allocate a huge buffer.
        size = self._reader.get_record_size(name)
        if size != nbytes:
            raise pickle.UnpicklingError(f"storage record {quote(name)} has {size} bytes, the pickle expects {nbytes}")
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


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, cut to ``limit`` characters."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def safe_load_bytes(data: bytes, path: str = "<bytes>", limits: Limits | None = None) -> Any:
    """Safely load a ``torch.save`` zip archive held in memory (see :func:`safe_load`)."""
    return _load_zip(_open_zip(data, path), path, len(data), limits or default_limits())


def safe_load(path: str | os.PathLike[str], limits: Limits | None = None) -> Any:
    """Load a ``torch.save`` file without executing pickled code; tensors land on the CPU.

    Only regular files are read, and the work is bounded by ``limits`` (default:
    :func:`~forge_replay.dumps.bounds.default_limits`). Raises DumpError naming ``path`` (and the
    refused global, or the limit to raise) for unreadable, corrupt, oversized or disallowed content.
    """
    path = os.fspath(path)
    limits = limits or default_limits()
    with open_dump(path) as handle:
        head = handle.read(4)
        handle.seek(0)
        if head != ZIP_MAGIC:
            return _load_plain_pickle(handle.read(), path, limits)
        return _load_zip(_open_zip(handle, path), path, os.fstat(handle.fileno()).st_size, limits)


def open_dump(path: str) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file; DumpError otherwise (FIFOs, devices, missing)."""
    try:
        return open_regular(path)
    except OSError as exc:
        raise DumpError(path, f"cannot open: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise DumpError(path, str(exc)) from None


def _load_zip(reader: Any, path: str, file_size: int, limits: Limits) -> Any:
    if not reader.has_record("data.pkl"):
        raise DumpError(path, "archive has no data.pkl record", "is this a torch.save file?")
    try:
        unpacked = sum(reader.get_record_size(name) for name in reader.get_all_records())
    except Exception as exc:
        raise DumpError(path, f"cannot list the archive: {_first_line(exc)}", "the file may be corrupt") from None
    if unpacked > limits.max_compression_ratio * max(file_size, 4096):
        raise DumpError(
            path,
            f"the archive's records unpack to {unpacked} bytes from a {file_size}-byte file "
            f"(more than {limits.max_compression_ratio}x; torch.save does not compress)",
            raise_hint("max_compression_ratio"),
        )
    try:
        pickled = reader.get_record("data.pkl")
    except Exception as exc:
        raise DumpError(path, f"cannot read data.pkl: {_first_line(exc)}", "the file may be truncated") from None
    return _unpickle(pickled, _ZipStorageReader(reader, path), path, limits)


def _load_plain_pickle(data: bytes, path: str, limits: Limits) -> Any:
    if not data or data[:1] != b"\x80":
        raise DumpError(path, "not a torch.save zip archive, a packed dump or a pickle", "check the path")
    result = _unpickle(data, None, path, limits)
    if type(result) is int and result == _LEGACY_TORCH_MAGIC:
        raise DumpError(
            path,
            "legacy (pre-1.6) torch serialization is not supported",
            "re-save it with torch.save's default zip format",
        )
    return result


def _unpickle(pickled: bytes, storage_reader: Any, path: str, limits: Limits) -> Any:
    try:
        check_pickle(pickled, limits)
    except BoundsError as exc:
        raise DumpError(path, f"refused to load: {exc}") from None
    # Through a buffered reader: the C unpickler prefetches 128 KiB at a time with peek() where the stream has it,
    # and calls read() once per opcode where it has not (a plain BytesIO: 2-3x slower on protocol-2 pickles).
    unpickler = _SafeUnpickler(io.BufferedReader(io.BytesIO(pickled), _PREFETCH_BYTES), storage_reader)
    try:
        return unpickler.load()
    except Refused as exc:
        raise DumpError(
            path, f"refused to load: {exc}", "nothing was executed; dumps may only hold plain data and tensors"
        ) from None
    except (EOFError, pickle.UnpicklingError) as exc:
        problem = _first_line(exc) if str(exc) else type(exc).__name__
        raise DumpError(path, f"corrupt pickle data: {problem}", "the file may be truncated") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, MemoryError) as exc:
        raise DumpError(path, f"malformed pickle data: {type(exc).__name__}: {_first_line(exc)}") from None
