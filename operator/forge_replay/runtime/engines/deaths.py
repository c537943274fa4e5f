"""How the fleet learns that an engine ran out of memory, across Ray: from the engine's own log (read by its actor,
on the engine's node), from its answer to a weight update, or from Ray's memory monitor having killed its actor.

Ray's memory monitor is a type of its own, ``ray.exceptions.OutOfMemoryError`` (Ray 2.60, ``ray/exceptions.py:655-667``):
not a ``RayActorError``, so it escapes an ``except RayActorError``; every call to an engine actor the fleet makes
goes through these functions, which turn it into :class:`RanOutOfMemory`. sglang's own words are in :mod:`.oom`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from forge_replay.api.outcome import OutOfMemory, RanOutOfMemory
from forge_replay.runtime.engines.oom import EngineAt, engine_record, ray_monitor_record, read_answer
from forge_replay.runtime.engines.process import EngineStartError
from forge_replay.runtime.weights.calls import WeightSyncError


def gather(refs: list, indices: Sequence[int], phase: str, rollout: int | None = None) -> list:
    """ray.get of the engines ``indices``' calls, raising the first engine error as soon as it comes, without Ray's
    wrapping: EngineStartError with its log tail, :class:`RanOutOfMemory` (the engine's own, or Ray's memory
    monitor killing its actor)."""
    import ray

    index_of = {ref.hex(): index for ref, index in zip(refs, indices, strict=True)}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RanOutOfMemory):
                raise RanOutOfMemory(cause.record) from None
            if isinstance(cause, EngineStartError):
                raise EngineStartError(str(cause)) from None
            raise
        except ray.exceptions.OutOfMemoryError as exc:
            at = EngineAt(engine=index_of[done[0].hex()], phase=phase, rollout=rollout)
            raise RanOutOfMemory(ray_monitor_record(str(exc), at)) from None
    return ray.get(refs)


def engine_alive(actor, at: EngineAt) -> tuple[bool, str]:
    """Whether the engine of ``actor`` runs, and why not (its exit code, or its actor's death); Ray's memory
    monitor having killed the actor raises :class:`RanOutOfMemory`."""
    import ray

    try:
        running = ray.get(actor.is_alive.remote())
        code = ray.get(actor.exit_code.remote())
        return running, f"exit code {code}"
    except ray.exceptions.RayActorError as exc:
        return False, f"its Ray actor died ({exc.__class__.__name__})"
    except ray.exceptions.OutOfMemoryError as exc:
        raise RanOutOfMemory(ray_monitor_record(str(exc), at)) from None


def out_of_memory(actor, at: EngineAt) -> OutOfMemory | None:
    """Why the engine of ``actor`` is dead, when it ran out of memory: sglang's own refusal in its log (the actor's
    :meth:`~forge_replay.runtime.engines.actor.EngineActor.out_of_memory`), or Ray's memory monitor having killed
    the actor; None while it runs, or when it died of something else (a SIGKILL from outside, a failed health check,
    its actor gone with its log unread)."""
    import ray

    try:
        return ray.get(actor.out_of_memory.remote(at.phase, at.rollout))
    except ray.exceptions.OutOfMemoryError as exc:
        return ray_monitor_record(str(exc), at)
    except ray.exceptions.RayActorError:
        return None


def refused_for_memory(at: EngineAt | None, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, a weight update to one engine (``at``); its ``success: false`` answer saying it ran
    out of memory (:func:`~forge_replay.runtime.engines.oom.read_answer`) raises :class:`RanOutOfMemory`."""
    try:
        return call(*args, **kwargs)
    except WeightSyncError as exc:
        refusal = read_answer(str(exc))
        if refusal is None or at is None:
            raise
        raise RanOutOfMemory(engine_record(refusal, at)) from None
