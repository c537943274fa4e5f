"""The sglang double's stand-in GPU: how much memory an sglang 0.5.23 engine would take on a device of a given size,
and its out-of-memory refusals, at start-up and while serving (TEST DOUBLE: the CPU machines here have no GPU).

The double is given a device size (``--double-gpu-memory-gib G``, or ``$SGLANG_DOUBLE_GPU_MEMORY_GIB``); without one
it models no memory and refuses nothing. With one, it takes the model's real weight bytes and KV cell size from
its config, and sglang's own budget (paths under ``python/sglang/srt/``, 0.5.23):

- ``mem_cache/kv_cache_configurator.py:2990-3060`` ``_profile_available_bytes``: the KV budget is the memory free
  after the weights, less ``pre_model_load_memory * (1 - mem_fraction_static)``; with the stand-in device nothing
  else is on it, so free before loading is ``G`` and free after is ``G - weights``. A budget of zero or less raises
  ``ValueError("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=...")``
  (:3043-3058);
- ``model_executor/pool_configurator.py:637-647`` ``calculate_pool_sizes``: ``tokens = budget // cell_size //
  page_size * page_size``, then ``MemoryPoolConfig(max_total_num_tokens=tokens)`` whose ``__post_init__``
  (:94-99) raises ``RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")`` when
  ``tokens <= 0``. Where sglang is installed the double constructs sglang's own ``MemoryPoolConfig``, so the
  exception is sglang's own;
- the cell size, ``pool_configurator.py:489-496``: ``kv_heads / tp * (head_dim + v_head_dim) * layers *
  kv dtype bytes``; the dtype as ``configs/model_config.py:2284`` ``_get_and_verify_dtype`` resolves ``auto``
  (a float32 or absent config dtype serves as float16).

While serving, what stays free is ``G - weights - KV pool``. A forward pass that needs more dies: sglang does not
catch an exception of its scheduler's event loop (``managers/scheduler.py:6370-6373`` logs "Scheduler hit an
exception:" with the traceback, ``utils.py:119-122``, and SIGQUITs its parent; the HTTP server's handler,
``managers/tokenizer_manager.py:4072-4081``, logs "SIGQUIT received ... It usually means one child failed." and
``kill_process_tree`` SIGKILLs the server itself, ``utils/common.py:2551-2554``): the request stays open and its
connection drops. At start-up the launcher's handler (``entrypoints/engine.py:1976-1982``) logs "Received sigquit
from a child process. It usually means the child failed." and does the same. The forward pass's need is the
double's own estimate (nothing in sglang computes it ahead): per token of the batch ``(4 * hidden + 2 *
intermediate) * dtype bytes`` of activations, and per sequence its float32 logits, ``vocab * 4``. The
allocator's message is torch's (``c10/cuda/CUDACachingAllocator.cpp``, torch 2.15: "CUDA out of memory. Tried to
allocate ...").

A weight update over ``/update_weights_from_distributed`` allocates every tensor of its bucket on the device before
receiving them (``model_executor/model_runner_components/weight_updater.py:281-297``); an allocation that fails
there is caught (``managers/scheduler_components/weight_updater.py:201-211``) and answered ``success: false``,
"Failed to receive weights: CUDA out of memory. ...": the engine lives on.

This file is loaded by path by ``sglang_double.py`` (a script); it imports sglang (slow) only to refuse.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

GPU_MEMORY_ENV = "SGLANG_DOUBLE_GPU_MEMORY_GIB"
"""The stand-in device size in GiB, when ``--double-gpu-memory-gib`` is not given."""

DEFAULT_MEM_FRACTION_STATIC = 0.95
"""What sglang takes when ``--mem-fraction-static`` is not given and it knows no GPU memory size
(``arg_groups/memory_hook.py:324-328``, 0.5.23); with a GPU it subtracts a reserve of GiBs, which a stand-in device
of a few KiB would never hold."""

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
"""Bytes per element of the dtypes ``--dtype`` and ``--kv-cache-dtype`` name."""


@dataclass
class DeviceMemory:
    """What the double decided at start: the figures of sglang's budget and the refusal, if any (recorded in
    ``start-<port>.json`` as ``memory``)."""

    device_bytes: int
    weights_bytes: int
    cell_size: int
    page_size: int
    mem_fraction_static: float
    dtype: str
    kv_budget_bytes: int
    max_total_num_tokens: int
    kv_pool_bytes: int
    free_bytes: int
    """What stays free while serving: device - weights - KV pool."""
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    refusal: str | None = None
    """The exception line sglang's scheduler would die with, or None."""

    def record(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- the model's figures


def model_config(model_path: str):
    """The model's transformers config, read as sglang reads it (``AutoConfig.from_pretrained``)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)


def served_dtype(config, dtype: str) -> str:
    """``--dtype`` as sglang resolves it (``configs/model_config.py:2284-2330``): ``auto`` serves the config's
    dtype, except float32 (or none), which serves as float16."""
    if dtype and dtype != "auto":
        return str(dtype)
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(declared).removeprefix("torch.") if declared is not None else "float32"
    return "float16" if name in ("float32", "float") else name


def weight_count(config, model_path: str) -> int:
    """The model's parameters: its safetensors checkpoint's tensors when there is one (their headers), else the
    model built from its config on the meta device (no memory) and counted."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if files:
        total = 0
        for file in files:
            with open(file, "rb") as stream:
                header = json.loads(stream.read(int.from_bytes(stream.read(8), "little")))
            for name, entry in header.items():
                if name != "__metadata__":
                    count = 1
                    for size in entry["shape"]:
                        count *= size
                    total += count
        return total
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())


def cell_size(config, tp_size: int, kv_dtype_bytes: int) -> int:
    """Bytes of KV cache per token, as ``DefaultPoolConfigurator._compute_cell_size`` counts it for MHA
    (``model_executor/pool_configurator.py:489-496``): ``kv_heads / tp * (head_dim + v_head_dim) * layers *
    kv dtype bytes``."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return max(1, kv_heads // tp_size) * (head_dim + head_dim) * config.num_hidden_layers * kv_dtype_bytes


def plan_memory(args, device_gib: float) -> DeviceMemory:
    """sglang's start-up budget on a device of ``device_gib`` for the server ``args`` (the double's parsed argv):
    the figures, and the refusal sglang would raise (``refusal`` set, not raised)."""
    config = model_config(args.model_path)
    dtype = served_dtype(config, args.dtype)
    dtype_bytes = DTYPE_BYTES[dtype]
    kv_dtype = getattr(args, "kv_cache_dtype", None) or "auto"
    kv_bytes = dtype_bytes if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, dtype_bytes)
    fraction = args.mem_fraction_static if args.mem_fraction_static is not None else DEFAULT_MEM_FRACTION_STATIC
    page_size = args.page_size or 1
    device = int(device_gib * (1 << 30))
    weights = weight_count(config, args.model_path) * dtype_bytes // max(1, args.tp_size)
    cell = cell_size(config, args.tp_size, kv_bytes)
    # _profile_available_bytes works in GiB floats: free after the weights, less the non-static slack
    available_gib = (device - weights) / (1 << 30)
    rest_gib = available_gib - (device / (1 << 30)) * (1 - fraction)
    budget = int(rest_gib * (1 << 30)) if rest_gib > 0 else 0
    tokens = budget // cell // page_size * page_size
    memory = DeviceMemory(
        device_bytes=device, weights_bytes=weights, cell_size=cell, page_size=page_size,
        mem_fraction_static=fraction, dtype=dtype, kv_budget_bytes=budget, max_total_num_tokens=max(tokens, 0),
        kv_pool_bytes=max(tokens, 0) * cell, free_bytes=device - weights - max(tokens, 0) * cell,
        hidden_size=config.hidden_size, intermediate_size=getattr(config, "intermediate_size", 4 * config.hidden_size),
        vocab_size=config.vocab_size,
    )
    if rest_gib <= 0:
        minimum = 1 - available_gib / (device / (1 << 30))
        memory.refusal = "ValueError: " + weights_leave_no_room(fraction, minimum)
    elif tokens <= 0:
        memory.refusal = "RuntimeError: " + str(pool_config_refusal(tokens))
    return memory


def weights_leave_no_room(fraction: float, minimum: float) -> str:
    """The text of sglang's refusal when the weights exceed the static budget
    (``mem_cache/kv_cache_configurator.py:3043-3058``, raised inline there: no function of sglang's to call)."""
    import math

    suggested = math.ceil(minimum * 1000) / 1000
    return (f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={fraction}. "
            f"Raise --mem-fraction-static above {suggested:.3f} (minimum viable = 1 - available/pre = "
            f"{minimum:.4f}). If using speculative decoding, draft weights are now counted.")


def pool_config_refusal(tokens: int) -> RuntimeError:
    """The RuntimeError of ``MemoryPoolConfig(max_total_num_tokens=tokens)``: sglang's own class where sglang is
    installed (its ``__post_init__``, ``model_executor/pool_configurator.py:94-99``), else the same text."""
    try:
        from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig
    except ImportError:
        return RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    try:
        MemoryPoolConfig(max_total_num_tokens=tokens)
    except RuntimeError as exc:
        return exc
    raise AssertionError(f"sglang's MemoryPoolConfig took max_total_num_tokens={tokens}")


# --------------------------------------------------------------------------- serving


def forward_bytes(memory: DeviceMemory, tokens: int, sequences: int) -> int:
    """The double's estimate of a forward pass's transient memory (see the module doc)."""
    dtype_bytes = DTYPE_BYTES[memory.dtype]
    return tokens * (4 * memory.hidden_size + 2 * memory.intermediate_size) * dtype_bytes + sequences * memory.vocab_size * 4


def format_size(size: int) -> str:
    """torch's ``format_size`` (``c10/cuda/CUDACachingAllocator.cpp``): bytes, KiB, MiB or GiB, two decimals."""
    if size <= 1024:
        return f"{size} bytes"
    for unit, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30)):
        if size < (1 << (shift + 10)) or unit == "GiB":
            return f"{size / (1 << shift):.2f} {unit}"
    raise AssertionError("unreachable")


def cuda_out_of_memory(memory: DeviceMemory, requested: int, device_index: int, in_use: int) -> BaseException:
    """The exception torch's CUDA caching allocator raises (torch 2.15, ``c10/cuda/CUDACachingAllocator.cpp``):
    ``torch.OutOfMemoryError`` (a RuntimeError) with its message, for the stand-in device's figures."""
    free = max(memory.device_bytes - in_use, 0)
    message = (
        f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU {device_index} has a total capacity of "
        f"{format_size(memory.device_bytes)} of which {format_size(free)} is free. Including non-PyTorch memory, "
        f"this process has {format_size(in_use)} memory in use. Of the allocated memory {format_size(in_use)} is "
        f"allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
        f"memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        f"documentation for Memory Management  "
        f"(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )
    try:
        import torch

        return torch.OutOfMemoryError(message)
    except ImportError:
        return RuntimeError(message)


# --------------------------------------------------------------------------- how the process ends


def _stamp() -> str:
    """sglang's log prefix, ``[%(asctime)s]`` with ``%Y-%m-%d %H:%M:%S`` (``utils/common.py:2630-2637``)."""
    return time.strftime("[%Y-%m-%d %H:%M:%S]")


def scheduler_exception_block(exc: BaseException) -> str:
    """What ``run_scheduler_process`` logs for an exception (``managers/scheduler.py:6370-6372``, the traceback
    from ``get_exception_traceback``, ``utils.py:119-122``)."""
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{_stamp()} Scheduler hit an exception: {trace}"


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as it reaches the scheduler's ``except``."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - it is the value wanted
        return caught


def die_like_sglang(exc: BaseException, *, serving: bool) -> None:
    """End the process as sglang's server ends when its scheduler raises ``exc``: the scheduler's log block, the
    parent's SIGQUIT line (the launcher's during start-up, the tokenizer manager's once serving), then SIGKILL of
    the whole server (``kill_process_tree``): returncode -9, open requests dropped."""
    sigquit = (f"{_stamp()} SIGQUIT received. signum=None, frame=None. It usually means one child failed."
               if serving else f"{_stamp()} Received sigquit from a child process. It usually means the child failed.")
    sys.stderr.write(scheduler_exception_block(raised(exc)) + sigquit + "\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # SIGKILL is not deferred; never returns


def refusal_exception(memory: DeviceMemory) -> BaseException:
    """The exception of ``memory.refusal``: sglang's own MemoryPoolConfig RuntimeError, or the ValueError."""
    kind, _, text = memory.refusal.partition(": ")
    if kind == "RuntimeError":
        return pool_config_refusal(memory.max_total_num_tokens)
    return ValueError(text)
