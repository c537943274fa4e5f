"""Weights handed to colocated sglang engines as tensors (``POST /update_weights_from_tensor``).

When the engines share the trainer's GPUs, sglang takes the weights as CUDA IPC handles: no copy and
no disk. The request body is ``{"serialized_named_tensors": [one str per engine TP rank],
"load_format": null, "flush_cache": bool, "weight_version": str|null}`` (:func:`update_request_body`);
each str is the base64 of a ``ForkingPickler`` dump of ``[(name, tensor), ...]``
(:func:`serialize_named_tensors`).

- **Device UUID.** A trainer rank sees its one GPU as ``cuda:0``; the colocated engine sees every GPU
  of the node. torch's CUDA reduction writes the device *index*, which would name the wrong GPU on the
  engine's side, so our reduction writes the device's UUID in that slot instead. sglang's receiver
  (its patched ``rebuild_cuda_tensor``) maps a UUID back to its own index; the stream names only
  torch's own rebuild functions, which sglang's restricted unpickler allows.
- **Who feeds whom.** Engine TP rank ``j`` must open handles made by the trainer rank on the same
  physical GPU: :func:`.tensor.engine_feeders` works that out from where Ray put the ranks.
- **Lifetime.** The tensors must stay alive on the trainer until the POST has returned.
- **Buckets** of parameters by bytes are :func:`.distributed.plan_buckets`'s,
  shared with the distributed path.
- **CPU tensors** (tests only: colocation needs GPUs) travel through torch's ``file_system`` route:
  a named shared-memory file that any process on the node can open. torch's default CPU route
  (``file_descriptor``) passes a file descriptor through the sender's ``multiprocessing`` resource
  sharer, which only processes holding the sender's authkey (its own children) can reach; an sglang
  server is not one of them. The route is chosen per stream here, so the process-wide torch sharing
  strategy is left alone. The file lives as long as the sender's tensor and the receivers' mappings:
  an engine that refused a request leaves nothing behind in /dev/shm.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from typing import Any

_DEVICE_SLOT = 6
"""Index of the device in the argument tuple of torch's ``rebuild_cuda_tensor`` (stable for years;
sglang's patch relies on the same slot)."""


class TensorSyncError(RuntimeError):
    """Weights cannot be handed to the engines as tensors; the message names the engine, GPU or tensor."""


# ---------------------------------------------------------------------------------------- wire format


def device_uuid(index: int) -> str:
    """The UUID of CUDA device ``index`` as this process numbers it (what sglang compares)."""
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


def with_device_uuid(rebuild_args: tuple, uuid_of: Callable[[int], str]) -> tuple:
    """``rebuild_cuda_tensor``'s arguments with the device index replaced by ``uuid_of(index)``.

    An argument that already is a UUID (a sender with sglang's own patch loaded) is left as it is."""
    if len(rebuild_args) <= _DEVICE_SLOT:
        raise TensorSyncError(f"unexpected CUDA reduction: {len(rebuild_args)} arguments, the device is argument "
                              f"{_DEVICE_SLOT}")
    device = rebuild_args[_DEVICE_SLOT]
    if isinstance(device, str):
        return rebuild_args
    return (*rebuild_args[:_DEVICE_SLOT], uuid_of(int(device)), *rebuild_args[_DEVICE_SLOT + 1:])


def _reduce_tensor(tensor):
    import torch
    from torch.multiprocessing import reductions

    if tensor.layout != torch.strided or tensor.device.type not in ("cpu", "cuda"):
        raise TensorSyncError(f"only dense CPU or CUDA tensors can be sent, not a {tensor.layout} tensor on "
                              f"{tensor.device}")
    # sglang's patch, when loaded in this process, keeps torch's original here.
    torch_reduce = getattr(reductions, "_reduce_tensor_original", reductions.reduce_tensor)
    rebuild, args = torch_reduce(tensor)
    if tensor.device.type == "cuda":
        args = with_device_uuid(args, device_uuid)
    return rebuild, args


def _reduce_cpu_storage(storage):
    """torch's ``file_system`` route for one CPU storage: a shared-memory file any local process can open."""
    from torch.multiprocessing import reductions

    if storage.device.type != "cpu":
        raise TensorSyncError(f"a bare {storage.device} storage cannot be sent; send the tensor")
    if storage.size() == 0:
        return reductions.rebuild_storage_empty, (type(storage),)
    manager, handle, size = storage._share_filename_cpu_()
    # Unlike torch's own route, no reference is handed to the receiver (torch adds one that the receiver
    # drops on opening): the sender keeps the tensor alive until the POST has returned anyway, and a
    # reference handed to a receiver that never opens the file (an engine that refused the request)
    # would leave the file in /dev/shm for good.
    return reductions.rebuild_storage_filename, (type(storage), manager, handle, size)


def _weight_pickler(buffer: io.BytesIO):
    from multiprocessing.reduction import ForkingPickler

    import torch
    from torch.multiprocessing import reductions  # noqa: F401 - registers torch's reducers with ForkingPickler

    pickler = ForkingPickler(buffer)
    pickler.dispatch_table[torch.Tensor] = _reduce_tensor
    pickler.dispatch_table[torch.nn.Parameter] = _reduce_tensor
    pickler.dispatch_table[torch.UntypedStorage] = _reduce_cpu_storage
    return pickler


def serialize_named_tensors(named: Sequence[tuple[str, Any]]) -> str:
    """One engine TP rank's entry of ``serialized_named_tensors``: base64 of ``[(name, tensor), ...]``.

    CUDA tensors travel as IPC handles carrying their device's UUID, CPU tensors as shared-memory
    files. Nothing is copied: keep ``named`` alive until the engine has answered."""
    import torch

    pairs: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for position, item in enumerate(named):
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"named tensor {position} is {type(item).__name__}, expected a (name, tensor) pair")
        name, tensor = item
        if not isinstance(name, str) or not name:
            raise TypeError(f"named tensor {position}: the name must be a non-empty str, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"named tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice in one payload")
        seen.add(name)
        pairs.append((name, tensor.detach()))  # a plain tensor, never a Parameter with autograd state
    buffer = io.BytesIO()
    _weight_pickler(buffer).dump(pairs)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def update_request_body(serialized: Sequence[str], *, flush_cache: bool, weight_version: str | None) -> dict:
    """The ``/update_weights_from_tensor`` request: ``serialized[j]`` is for the engine's TP rank ``j``."""
    if not serialized or not all(isinstance(s, str) and s for s in serialized):
        raise ValueError("serialized_named_tensors needs one non-empty str per engine TP rank")
    return {
        "serialized_named_tensors": list(serialized),
        "load_format": None,
        "flush_cache": flush_cache,
        "weight_version": weight_version,
    }
