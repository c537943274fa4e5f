"""An engine that ran out of memory: sglang's own words for it, kept as data in one place, and the record made of them.

sglang gives nothing structured when it runs out of memory: its scheduler process catches any exception, logs it
and has the whole server killed (``managers/scheduler.py:6370-6373``: ``logger.error(f"Scheduler hit an exception:
{traceback}")``, then SIGQUIT to its parent, whose handler, ``entrypoints/engine.py:1976-1982`` during start-up or
``managers/tokenizer_manager.py:4072-4081`` once serving, SIGKILLs the process tree, the server itself included,
``utils/common.py:2551-2554``; paths under ``python/sglang/srt/``, sglang 0.5.23). The server so ends with
returncode -9, as it does for any other exception of its scheduler and as after the kernel's OOM killer: -9 alone
says nothing. An engine's log (``engine-N.log``, its stdout and stderr) is then the only place the cause exists:
the last "Scheduler hit an exception:" block of the process, ending in one of :data:`SGLANG_OUT_OF_MEMORY`.

A weight update that runs out of memory while allocating what it receives is answered, not died of: sglang 0.5.23
catches it and answers ``success: false`` with the allocator's message (:data:`SGLANG_FAILED_UPDATES`).

Ray's memory monitor killing an engine's actor is a type (``ray.exceptions.OutOfMemoryError``, not a
``RayActorError``); its figures exist only in its message (:func:`ray_monitor_record`).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone

from forge_replay.api.outcome import OutOfMemory, OutOfMemoryHowMuch, OutOfMemoryWhen, OutOfMemoryWhere
from forge_replay.runtime.memory_signals import ray_monitor_figures

SGLANG_VERSION = "0.5.23"
"""The sglang version whose sentences these are (the pinned one)."""

SCHEDULER_EXCEPTION = "Scheduler hit an exception:"
"""What sglang's scheduler logs, then the traceback, before the server is killed (``managers/scheduler.py:6372``)."""


@dataclass(frozen=True)
class Sentence:
    """One out-of-memory exception line of sglang's (type and the start of its message) and where it is raised."""

    pattern: str
    """A regular expression matched at the start of an exception line (``Type: message``)."""
    source: str
    """Where sglang (or torch, for the allocator's error) raises it, at :data:`SGLANG_VERSION`."""
    kv_cache: bool = False
    """A refusal to size the KV cache (or the state caches beside it) at ``--mem-fraction-static``."""


SGLANG_OUT_OF_MEMORY: tuple[Sentence, ...] = (
    Sentence(r"RuntimeError: Not enough memory\. Please try to increase --mem-fraction-static\.",
             "python/sglang/srt/model_executor/pool_configurator.py:94-99 (MemoryPoolConfig.__post_init__: no "
             "token fits in the KV budget)", kv_cache=True),
    Sentence(r"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=",
             "python/sglang/srt/mem_cache/kv_cache_configurator.py:3043-3058 (_profile_available_bytes: the weights "
             "exceed the static budget)", kv_cache=True),
    Sentence(r"RuntimeError: (?:The DSV4 )?SWA pool cap \(.*\) leaves no room for the full KV pool",
             "python/sglang/srt/model_executor/pool_configurator.py:1024-1031, 1678-1685 (sliding-window models)",
             kv_cache=True),
    Sentence(r"RuntimeError: Hybrid \(mamba/linear-attention\) state cache is too small to serve any requests\.",
             "python/sglang/srt/mem_cache/kv_cache_configurator.py:3153-3161", kv_cache=True),
    Sentence(r"RuntimeError: Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache\.",
             "python/sglang/srt/mem_cache/kv_cache_configurator.py:3393-3403", kv_cache=True),
    Sentence(r"torch\.(?:cuda\.)?OutOfMemoryError: CUDA out of memory\.",
             "torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp; torch.cuda.OutOfMemoryError before "
             "torch 2.5), uncaught in sglang's scheduler: weights, CUDA graphs, a forward pass"),
    Sentence(r"RuntimeError: Prefill out of memory\. Try to lower your batch size\.",
             "python/sglang/srt/mem_cache/allocation.py:237-246 (the KV pool cannot take a prefill)"),
    Sentence(r"RuntimeError: Decode out of memory\. Try to lower your batch size\.",
             "python/sglang/srt/mem_cache/allocation.py:611-620 (the KV pool cannot take a decode step)"),
    Sentence(r"RuntimeError: alloc_req_slots runs out of memory\.",
             "python/sglang/srt/mem_cache/allocation.py:343-348 (no request slot left)"),
)
"""The last exception line of a "Scheduler hit an exception:" block that says the engine ran out of memory."""

SGLANG_FAILED_UPDATES: tuple[Sentence, ...] = (
    Sentence(r"Failed to receive weights: CUDA out of memory\.",
             "python/sglang/srt/managers/scheduler_components/weight_updater.py:201-211 (a bucket of "
             "/update_weights_from_distributed allocated on the device, model_runner_components/weight_updater.py:"
             "281-297)"),
    Sentence(r"Failed to update weights: CUDA out of memory\.",
             "python/sglang/srt/model_executor/model_runner_components/weight_updater.py:228-236 "
             "(/update_weights_from_disk, rolled back)"),
)
"""A weight update's ``success: false`` answer (the ``message``) that says the engine ran out of memory."""

_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
"""The start of a new log record of sglang's (``[%(asctime)s...]``, ``utils/common.py:2630-2637``)."""
MESSAGE_CHARS = 1500
"""How much of sglang's message a record keeps (the record's message holds 2000 characters)."""


@dataclass(frozen=True)
class Refusal:
    """sglang's out-of-memory, as its log or answer says it."""

    message: str
    """The exception line (``Type: message``) and its continuation lines, or the answer's message."""
    source: str
    kv_cache: bool
    requested_bytes: int | None = None
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    held_by_others_bytes: int | None = None


def read_log(text: str) -> Refusal | None:
    """The out-of-memory in an engine's log: the last "Scheduler hit an exception:" block (:data:`SCHEDULER_EXCEPTION`)
    whose traceback holds one of :data:`SGLANG_OUT_OF_MEMORY` (the last such line: a chained traceback ends with
    the exception that reached the scheduler); None when there is no such block. ``text`` is the log of one
    process (from its start), so an earlier process's death is not read as this one's."""
    at = text.rfind(SCHEDULER_EXCEPTION)
    if at < 0:
        return None
    lines = text[at + len(SCHEDULER_EXCEPTION):].splitlines()
    found = None
    for number, line in enumerate(lines):
        for sentence in SGLANG_OUT_OF_MEMORY:
            if re.match(sentence.pattern, line):
                found = (number, sentence)
    if found is None:
        return None
    number, sentence = found
    message = [lines[number]]
    for line in lines[number + 1:]:
        if _LOG_RECORD.match(line) or line.startswith(("Traceback", "  File ", "During handling", "The above")):
            break
        message.append(line)
    return _refusal("\n".join(message).strip(), sentence)


def read_answer(message: str) -> Refusal | None:
    """The out-of-memory in a weight update's ``success: false`` answer (:data:`SGLANG_FAILED_UPDATES`), or None."""
    for sentence in SGLANG_FAILED_UPDATES:
        match = re.search(sentence.pattern, message)
        if match:
            return _refusal(message[match.start():].strip(), sentence)
    return None


def _refusal(message: str, sentence: Sentence) -> Refusal:
    """The figures torch's allocator message gives (torch 2.15, ``c10/cuda/CUDACachingAllocator.cpp``: "Tried to
    allocate X. GPU N has a total capacity of X of which X is free. [Process P has X memory in use. ...] Of the
    allocated memory X is allocated by PyTorch, and X is reserved by PyTorch but unallocated.")."""
    allocated = _size(rf"Of the allocated memory {_SIZE} is allocated by PyTorch", message)
    unallocated = _size(rf"and {_SIZE} is reserved by PyTorch but unallocated", message)
    others = [_bytes(value, unit) for value, unit in re.findall(rf"Process \d+ has {_SIZE} memory in use", message)]
    return Refusal(
        message=message[:MESSAGE_CHARS], source=sentence.source, kv_cache=sentence.kv_cache,
        requested_bytes=_size(rf"Tried to allocate {_SIZE}", message),
        device_total_bytes=_size(rf"has a total capacity of {_SIZE}", message),
        device_free_bytes=_size(rf"of which {_SIZE} is free", message),
        allocated_bytes=allocated,
        reserved_bytes=None if allocated is None or unallocated is None else allocated + unallocated,
        held_by_others_bytes=sum(others) if others else None,
    )


def _bytes(value: str, unit: str) -> int:
    return int(float(value) * _UNITS[unit])


def _size(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text)
    return None if match is None else _bytes(match.group(1), match.group(2))


@dataclass(frozen=True)
class EngineAt:
    """Which engine, and when: what the record says besides sglang's words."""

    engine: int
    phase: str
    """``engineStart`` or ``engineServing``."""
    rollout: int | None = None
    pid: int | None = None
    node: str | None = None
    mem_fraction_static: str | None = None
    """The engine's ``--mem-fraction-static`` (spec.rollout.engineArgs), None for sglang's default."""


def pod_name() -> str | None:
    """This process's pod in Kubernetes (its host name there), None elsewhere."""
    return socket.gethostname() if os.environ.get("KUBERNETES_SERVICE_HOST") else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def engine_record(refusal: Refusal, at: EngineAt) -> OutOfMemory:
    """The out-of-memory record of sglang's refusal (signal ``sglangRefusal``)."""
    fraction = (f"mem-fraction-static {at.mem_fraction_static}" if at.mem_fraction_static is not None
                else "mem-fraction-static not set (sglang's default for the GPU)")
    what = "could not size its KV cache" if refusal.kv_cache else "ran out of memory"
    message = (f"engine {at.engine} {what} ({fraction}): {refusal.message} [sglang {SGLANG_VERSION}, "
               f"{refusal.source}]")
    return OutOfMemory(
        signal="sglangRefusal",
        where=OutOfMemoryWhere(component="engine", engine=at.engine, pod=pod_name(), node=at.node, pid=at.pid),
        when=OutOfMemoryWhen(rollout=at.rollout, phase=at.phase, at=_now()),
        how_much=OutOfMemoryHowMuch(
            requested_bytes=refusal.requested_bytes, allocated_bytes=refusal.allocated_bytes,
            reserved_bytes=refusal.reserved_bytes, device_total_bytes=refusal.device_total_bytes,
            device_free_bytes=refusal.device_free_bytes, held_by_others_bytes=refusal.held_by_others_bytes,
        ),
        message=_shorten(message),
    )


def ray_monitor_record(message: str, at: EngineAt) -> OutOfMemory:
    """The record of Ray's memory monitor killing an engine's actor (``ray.exceptions.OutOfMemoryError``, whose only
    attribute is its message, read by :func:`~forge_replay.runtime.memory_signals.ray_monitor_figures`): the node, its
    limit and the killed worker's pid (the engine's actor; its engine process died with it, PDEATHSIG)."""
    figures = ray_monitor_figures(message)
    lines = message.strip().splitlines()
    said = [line for number, line in enumerate(lines) if number < 2 or line.startswith("Selected to kill")]
    return OutOfMemory(
        signal="rayMemoryMonitor",
        where=OutOfMemoryWhere(component="engine", engine=at.engine, node=figures.get("node", at.node),
                               pid=figures.get("pid", at.pid)),
        when=OutOfMemoryWhen(rollout=at.rollout, phase=at.phase, at=_now()),
        how_much=OutOfMemoryHowMuch(limit_bytes=figures.get("limit_bytes")),
        message=_shorten(f"Ray's memory monitor killed engine {at.engine}'s actor (its engine process died with "
                         f"it): " + " ".join(said)),
    )


def _shorten(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
