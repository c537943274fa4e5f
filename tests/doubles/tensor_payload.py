"""TEST DOUBLE's decoder for ``/update_weights_from_tensor`` payloads (sglang's side of the wire).

One entry of ``serialized_named_tensors`` is base64 of a ``ForkingPickler`` dump of
``[(name, tensor), ...]``. sglang opens it with its own restricted unpickler; this double does the
same with a tighter one: only torch's tensor/storage rebuild functions (each wrapped to check its
arguments), ``torch.Size`` and dtypes resolve. Tensor and storage classes resolve to inert markers
(a pickle cannot call a constructor), and every other global is refused before anything runs.

CUDA tensors arrive as IPC handles whose device is a GPU UUID (the sender sees one GPU as cuda:0, this
process sees them all); the UUID is mapped back to the local index as sglang does. CPU tensors arrive
as torch shared-memory files (the ``file_system`` route).

This module imports nothing from forge_replay: the double stands in for sglang.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing import reductions

DEVICE_SLOT = 6
"""Where ``rebuild_cuda_tensor``'s arguments hold the device (index, or UUID from our sender)."""


class RefusedPayload(pickle.UnpicklingError):
    """The payload names something outside the allowlist, or a rebuild gets arguments it must not."""


@dataclass(frozen=True)
class _ClassMarker:
    """Stands in for a tensor or storage class named by the pickle: it carries a name, it cannot be called."""

    name: str


_TENSOR = _ClassMarker("torch.Tensor")
_UNTYPED = _ClassMarker("torch.UntypedStorage")
_TYPED = _ClassMarker("torch.TypedStorage")


def device_index_from_uuid(device: int | str, local_uuids: Sequence[str]) -> int:
    """The local index of ``device``: an int is taken as is, a UUID is looked up among ``local_uuids``."""
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise RefusedPayload(f"CUDA tensor device {device!r} is neither an index nor a GPU UUID")
    if isinstance(device, int):
        return device
    for index, uuid in enumerate(local_uuids):
        if uuid == device:
            return index
    raise RefusedPayload(f"CUDA tensor on GPU {device}, which this process does not see (it sees "
                         f"{list(local_uuids) or 'no GPU'}): the engine must run on the sender's GPU")


def local_gpu_uuids() -> list[str]:
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def _expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise RefusedPayload(f"{what} must be {kind}, got {type(value).__name__}")
    return value


def _rebuild_tensor(cls, storage, metadata):
    if cls is not _TENSOR:
        raise RefusedPayload(f"tensor class {cls!r} refused (plain torch.Tensor only)")
    _expect(storage, torch.storage.TypedStorage, "tensor storage")
    offset, size, stride, requires_grad = _expect(metadata, tuple, "tensor metadata")
    _expect(offset, int, "storage offset")
    _expect(size, tuple, "size")
    _expect(stride, tuple, "stride")
    _expect(requires_grad, bool, "requires_grad")
    return reductions.rebuild_tensor(torch.Tensor, storage, (offset, size, stride, requires_grad))


def _rebuild_typed_storage(storage, dtype):
    _expect(storage, torch.UntypedStorage, "storage")
    _expect(dtype, torch.dtype, "dtype")
    return reductions.rebuild_typed_storage(storage, dtype)


def _rebuild_storage_filename(cls, manager, handle, size, dtype=None):
    if cls is not _UNTYPED or dtype is not None:
        raise RefusedPayload(f"shared-memory storage of class {cls!r} refused (untyped storages only)")
    _expect(manager, bytes, "shared-memory manager")
    _expect(handle, bytes, "shared-memory handle")
    _expect(size, int, "storage size")
    # The mapping holds its own reference to the file; torch's rebuild would also drop one the sender handed
    # over, which ours does not (forge_replay.runtime.weights.ipc keeps the tensors alive instead).
    return torch.UntypedStorage._new_shared_filename_cpu(manager, handle, size)


def _rebuild_storage_empty(cls):
    if cls is not _UNTYPED:
        raise RefusedPayload(f"empty storage of class {cls!r} refused")
    return torch.UntypedStorage()


def make_cuda_rebuild(uuids: Callable[[], Sequence[str]] = local_gpu_uuids):
    """torch's ``rebuild_cuda_tensor`` behind a check of its arguments, with a UUID device mapped to an index."""

    def rebuild_cuda_tensor(*args):
        if len(args) != 15:
            raise RefusedPayload(f"rebuild_cuda_tensor takes 15 arguments, the payload gives {len(args)}")
        if args[0] is not _TENSOR or args[4] not in (_TYPED, _UNTYPED):
            raise RefusedPayload(f"CUDA tensor classes {args[0]!r}/{args[4]!r} refused")
        _expect(args[5], torch.dtype, "dtype")
        device = device_index_from_uuid(args[DEVICE_SLOT], uuids())
        storage_cls = torch.storage.TypedStorage if args[4] is _TYPED else torch.UntypedStorage
        return reductions.rebuild_cuda_tensor(
            torch.Tensor, *args[1:4], storage_cls, args[5], device, *args[DEVICE_SLOT + 1:]
        )

    return rebuild_cuda_tensor


def _allowed() -> dict[tuple[str, str], Any]:
    mp = "torch.multiprocessing.reductions"
    cuda = make_cuda_rebuild()
    allowed: dict[tuple[str, str], Any] = {
        (mp, "rebuild_tensor"): _rebuild_tensor,
        (mp, "rebuild_typed_storage"): _rebuild_typed_storage,
        (mp, "rebuild_storage_filename"): _rebuild_storage_filename,
        (mp, "rebuild_storage_empty"): _rebuild_storage_empty,
        (mp, "rebuild_cuda_tensor"): cuda,
        # a sender with sglang's reduction patch loaded names sglang's rebuild function instead
        ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): cuda,
        ("sglang.srt.patch_torch", "_rebuild_cuda_tensor_modified"): cuda,
        ("torch", "Tensor"): _TENSOR,
        ("torch", "UntypedStorage"): _UNTYPED,
        ("torch.storage", "UntypedStorage"): _UNTYPED,
        ("torch", "TypedStorage"): _TYPED,
        ("torch.storage", "TypedStorage"): _TYPED,
        ("torch", "Size"): torch.Size,
    }
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


_ALLOWED = _allowed()
_HINTS = {
    "rebuild_storage_fd": "a CPU tensor sent by file descriptor (torch's default sharing strategy) can only be "
                          "opened by the sender's own children; the sender must use the file_system route",
    "DupFd": "a CPU tensor sent by file descriptor (torch's default sharing strategy) can only be opened by the "
             "sender's own children; the sender must use the file_system route",
}


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the allowlist above; anything else is refused before it can run."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            hint = _HINTS.get(name)
            raise RefusedPayload(f"refused global {module}.{name}: not a torch tensor rebuild function"
                                 + (f" ({hint})" if hint else "")) from None

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPayload(f"refused persistent id {pid!r}")


def decode_named_tensors(serialized: str) -> list[tuple[str, torch.Tensor]]:
    """One ``serialized_named_tensors`` entry back to ``[(name, tensor), ...]`` (tensors share the sender's memory)."""
    if not isinstance(serialized, str):
        raise RefusedPayload(f"a serialized_named_tensors entry must be a base64 str, got {type(serialized).__name__}")
    try:
        raw = base64.b64decode(serialized, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RefusedPayload(f"serialized_named_tensors entry is not base64: {exc}") from None
    named = RestrictedUnpickler(io.BytesIO(raw)).load()
    if not isinstance(named, list):
        raise RefusedPayload(f"payload holds a {type(named).__name__}, expected a list of (name, tensor) pairs")
    for position, item in enumerate(named):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise RefusedPayload(f"payload item {position} is not a (name, tensor) pair")
    return named


def summarize(named: Sequence[tuple[str, torch.Tensor]]) -> dict:
    """What the double records per push: tensor count, float64 sum of |values|, names, shapes, dtypes, devices."""
    total = torch.zeros((), dtype=torch.float64)
    for _, tensor in named:
        total += tensor.detach().double().abs().sum().cpu()
    return {
        "tensors": len(named),
        "abs_sum": float(total),
        "names": [name for name, _ in named],
        "shapes": [list(tensor.shape) for _, tensor in named],
        "dtypes": [str(tensor.dtype).removeprefix("torch.") for _, tensor in named],
        "devices": [str(tensor.device) for _, tensor in named],
    }
