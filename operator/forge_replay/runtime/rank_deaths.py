"""A trainer rank killed from outside, read after its death by the driver: was it out of memory?

A killed rank cannot say so itself. Ray 2.60 tells its caller one of two things (ray/exceptions.py):

- ``ray.exceptions.OutOfMemoryError`` (exceptions.py:655-667; not a RayActorError): Ray's memory monitor killed the
  worker (the actor's death cause is ``oom_context``; serialization.py:500-502). Its type is the signal
  (``rayMemoryMonitor``); the figures exist only in its message (the raylet's "OOM kill reason: Memory usage NB
  exceeded threshold of NB (P% of NB limit)" line, read for what it says).
- ``ray.exceptions.ActorDiedError`` (exceptions.py:456-528): the worker process died. A kernel OOM kill looks exactly
  like any other SIGKILL here (``WORKER_DIED``, exit type SYSTEM_ERROR). It is the kernel's (``kernelOomKiller``)
  only when the ``oom_kill`` count of the rank's memory cgroup (runtime/memory_signals.py) rose since the baseline
  the rank recorded at its start; the count is read on the rank's node (a small Ray task there, or directly when
  that node is this one).

Anything else, or a death without either sign, is no out-of-memory: the run stays ``failed``. The rank's last rollout
and phase come from the run's PhaseBoard, which the ranks told before each phase.
"""

from __future__ import annotations

import logging

from forge_replay.api.outcome import OutOfMemory, OutOfMemoryHowMuch, OutOfMemoryWhen, OutOfMemoryWhere
from forge_replay.runtime.memory_signals import ray_monitor_figures

log = logging.getLogger(__name__)

PING_WAIT_S = 5.0
"""How long the ranks get to answer after one died: a live rank busy in a collective with the dead one does not
answer, a dead one fails at once."""
READ_WAIT_S = 30.0


def dead_ranks(ranks: list, wait_s: float = PING_WAIT_S) -> dict[int, BaseException]:
    """The ranks (actor handles, in rank order) that are dead now, each with the error a call to it raises."""
    import ray

    pings = {r.alive.remote(): index for index, r in enumerate(ranks)}
    ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=wait_s)
    dead = {}
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayError as exc:
            dead[pings[ref]] = exc
    return dead


def monitor_figures(message: str) -> dict:
    """``max_usage_bytes`` (the node's usage) and ``limit_bytes`` (the threshold it went over) from Ray's memory
    monitor's message, when it says them."""
    said = ray_monitor_figures(message)
    if "threshold_bytes" not in said:
        return {}
    return {"max_usage_bytes": said["usage_bytes"], "limit_bytes": said["threshold_bytes"]}


def oom_kill_rose(before: dict | None, after: dict | None) -> bool:
    """Whether the rank's memory cgroup counted an OOM kill since ``before`` (its start)."""
    if not before or not after or before.get("oom_kills") is None or after.get("oom_kills") is None:
        return False
    return after["oom_kills"] > before["oom_kills"]


def read_cgroup_of(watched: dict, wait_s: float = READ_WAIT_S) -> dict | None:
    """The figures of the memory cgroup a rank recorded at its start, read now on its node; None when there is
    nothing to read (no cgroup recorded, the node gone)."""
    import ray

    from forge_replay.runtime.memory_signals import read_cgroup

    cgroup = watched.get("cgroup")
    if not cgroup:
        return None
    if watched.get("node_id") in (None, ray.get_runtime_context().get_node_id()):
        return read_cgroup(cgroup["version"], cgroup["directory"])
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(read_cgroup).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(watched["node_id"], soft=False))
    try:
        return ray.get(task.remote(cgroup["version"], cgroup["directory"]), timeout=wait_s)
    except Exception as exc:  # noqa: BLE001 - a node that went with its rank: no count to read
        log.warning("cannot read the memory cgroup of trainer rank %s on its node: %s", watched.get("rank"), exc)
        return None


def death_record(rank: int, error: BaseException, watched: dict, phase: dict | None) -> OutOfMemory | None:
    """The out-of-memory record of rank ``rank``'s death by ``error`` (what a call to it raised), or None when the
    death was something else. ``watched``: what the rank recorded at its start; ``phase``: its last on the board."""
    import ray

    if isinstance(error, ray.exceptions.OutOfMemoryError):
        signal, figures = "rayMemoryMonitor", monitor_figures(str(error))
        message = str(error)
    elif isinstance(error, ray.exceptions.RayActorError):
        after = read_cgroup_of(watched)
        if not oom_kill_rose(watched.get("cgroup"), after):
            return None
        signal = "kernelOomKiller"
        figures = {"limit_bytes": after.get("limit_bytes"), "max_usage_bytes": after.get("max_usage_bytes")}
        message = (f"the kernel's OOM killer killed trainer rank {rank} (pid {watched.get('pid')}): oom_kill of "
                   f"memory cgroup {watched['cgroup']['directory']} went from {watched['cgroup']['oom_kills']} to "
                   f"{after['oom_kills']}; Ray said: {_first_line(str(error))}")
    else:
        return None
    from forge_replay.dumps.writing import now_rfc3339

    phase = phase or {}
    return OutOfMemory(
        signal=signal,
        where=OutOfMemoryWhere(component="trainer", rank=rank, node=watched.get("node"), pod=watched.get("pod"),
                               pid=watched.get("pid"), device=watched.get("device")),
        when=OutOfMemoryWhen(rollout=phase.get("rollout"), phase=phase.get("phase"), at=now_rfc3339()),
        how_much=OutOfMemoryHowMuch(**figures), message=" ".join(message.split())[:2000],
    )


def rank_out_of_memory(group, board) -> OutOfMemory | None:
    """After the trainer failed with a Ray error: the record of the first rank that died of an out-of-memory, or
    None (no rank died, or not of that)."""
    import ray

    dead = dead_ranks(group.ranks)
    if not dead:
        return None
    phases = {}
    if board is not None:
        try:
            phases = ray.get(board.read.remote(), timeout=READ_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the record still says which signal, where and how much
            log.warning("cannot read the trainer ranks' last phases: %s", exc)
    watched = {w["rank"]: w for w in group.watched}
    for rank in sorted(dead):
        record = death_record(rank, dead[rank], watched.get(rank, {}), phases.get(rank))
        if record is not None:
            return record
    return None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
