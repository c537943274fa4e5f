"""How a job's run ended, as a memory test reads it (``status.outcome``), and its out-of-memory
(``status.outOfMemory``).

Where each comes from, best first:

- the runtime's own record, published with its result in the progress ConfigMap (``ProgressReport.result``:
  ``outcome`` and ``out_of_memory``): the builtin trainer's ranks and engines, Ray's memory monitor or the kernel's
  OOM killer as the runtime saw them in a pod, the slime / miles publish step (backends/publish.py);
- what the status already holds (KubeRay deletes the Ray pods after the job, and with them what they said);
- where the runtime reported no out-of-memory itself: a Ray pod whose container the kubelet reports terminated with
  reason ``OOMKilled``, in ``state`` or, once it restarted, in ``lastState`` (k8s.io/api v0.37.2 core/v1 types.go:
  ContainerStateTerminated 3496-3517, ContainerStatus.lastState 3547; the reason is containerd's ``oomExitReason``,
  set on the container when its cgroup reports an OOM event, containerd 1.6 pkg/cri/server/events.go ``TaskOOM``).
  The pods are the ones the operator lists once when the RayJob fails (reconcile._ray_pods_at_failure, the list
  head_pod.head_pod_loss reads). On a cgroup v1 node the kubelet kills a single process, so the reason shows only
  once that container exits (kubelet.go:775-787): the runtime's record is then the one there is.

An out-of-memory fails the job with reason ``OutOfMemory`` (its message the record's one line), unless
``spec.expect.outcome`` is ``outOfMemory``: then the job succeeds, and a run that fits fails that check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge_replay.api.outcome import OutOfMemory, OutOfMemoryHowMuch, OutOfMemoryWhen, OutOfMemoryWhere
from forge_replay.api.progress_report import ProgressReport
from forge_replay.controller import naming
from forge_replay.controller.render import ROLLOUT_GROUP, quantity_bytes
from forge_replay.verdict.outcome import OUTCOME_CHECK, outcome_check

OUT_OF_MEMORY = "OutOfMemory"
"""The reason of Ready and Stalled (and the Warning event) of a job that ran out of memory."""
OOM_KILLED = "OOMKilled"
"""The container reason containerd gives an OOM event in the container's cgroup (the kubelet reports it)."""
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Finding:
    """The run's outcome (None while it runs), its out-of-memory as ``status.outOfMemory`` holds it (camelCase),
    and when the run ended as far as that record tells."""

    outcome: str | None = None
    record: dict[str, Any] | None = None
    ended_at: str | None = None


@dataclass(frozen=True)
class Kill:
    """One container the kubelet reports OOMKilled."""

    pod: str
    node: str | None
    container: str
    role: str | None
    exit_code: int | None
    finished_at: str | None
    restarts: int
    limit: str | None


def oom_killed(pods: list[dict[str, Any]]) -> list[Kill]:
    """Every container of ``pods`` whose current or last termination was OOMKilled, the first killed first."""
    kills = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        limits = {c.get("name"): ((c.get("resources") or {}).get("limits") or {}).get("memory")
                  for c in spec.get("containers") or []}
        for container in status.get("containerStatuses") or []:
            for state in ("state", "lastState"):
                terminated = (container.get(state) or {}).get("terminated") or {}
                if terminated.get("reason") != OOM_KILLED:
                    continue
                name = container.get("name") or ""
                kills.append(Kill(
                    pod=meta.get("name") or "", node=spec.get("nodeName"), container=name,
                    role=(meta.get("labels") or {}).get(naming.LABEL_ROLE), exit_code=terminated.get("exitCode"),
                    finished_at=terminated.get("finishedAt"), restarts=int(container.get("restartCount") or 0),
                    limit=limits.get(name)))
    return sorted(kills, key=lambda kill: kill.finished_at or "~")


def pod_record(kill: Kill, rollout: int | None) -> OutOfMemory:
    """The out-of-memory record of one OOMKilled container (signal ``containerOOMKilled``): its pod, node and
    memory limit; ``rollout`` the one being trained (the one after those the runtime published as done)."""
    component = {"head": "head", ROLLOUT_GROUP: "engine"}.get(kill.role or "", "trainer")
    limit = None
    if kill.limit:
        try:
            limit = int(quantity_bytes(kill.limit))
        except ValueError:
            limit = None
    words = (f"container {kill.container}: terminated {OOM_KILLED}, exit code {kill.exit_code}"
             + (f", at {kill.finished_at}" if kill.finished_at else "")
             + (f"; restarted {kill.restarts} time(s)" if kill.restarts else ""))
    return OutOfMemory(
        signal="containerOOMKilled", where=OutOfMemoryWhere(component=component, pod=kill.pod, node=kill.node),
        when=OutOfMemoryWhen(rollout=rollout, at=kill.finished_at),
        how_much=OutOfMemoryHowMuch(limit_bytes=limit), message=words[:2000])


def finding(job: Any, previous: dict[str, Any], progress: ProgressReport | None, pods: list[dict[str, Any]] | None,
            phase: str) -> Finding:
    """The outcome and out-of-memory of a job whose run is in ``phase`` (as KubeRay or the runtime's result says
    it, before spec.expect is applied): the runtime's record first, then the one the status holds, then an
    OOMKilled Ray pod (see the module's docstring)."""
    result = progress.result if progress is not None else None
    if result is not None and result.out_of_memory is not None:
        return Finding("outOfMemory", _camel(result.out_of_memory), result.finished_at)
    if previous.get("outOfMemory"):
        return Finding("outOfMemory", previous["outOfMemory"], previous.get("completionTime"))
    kills = oom_killed(pods or [])
    if kills:
        done, total = rollouts_done(job, previous, progress)
        start = job.spec.replay.start_rollout_id
        record = pod_record(kills[0], start + done if done < total else None)
        return Finding("outOfMemory", _camel(record), kills[0].finished_at)
    if result is not None and result.outcome is not None:
        return Finding(result.outcome)
    if result is None and (phase not in TERMINAL or previous.get("outcome")):  # nothing new: what the status says
        return Finding(previous.get("outcome"))
    failed = {e.name for e in (result.expectations if result is not None else None) or [] if not e.passed}
    if "maxPeakMemoryGiB" in failed:
        return Finding("overBudget")
    succeeded = (result.phase if result is not None else phase) == "Succeeded"
    return Finding("fits" if succeeded else "failed")


def rollouts_done(job: Any, previous: dict[str, Any], progress: ProgressReport | None) -> tuple[int, int]:
    """Rollouts trained and planned, as the runtime last published them (else as the status holds them)."""
    total = job.spec.replay.num_rollouts
    if progress is not None:
        return progress.completed, progress.total or total
    return (previous.get("rollouts") or {}).get("completed", 0), total


def with_outcome_check(expectations: list[dict[str, Any]] | None, expect: Any,
                       outcome: str | None) -> list[dict[str, Any]] | None:
    """status.expectations with spec.expect.outcome's check decided on ``outcome``: added where the runtime's
    verdict lacks it, corrected where the operator knows better (a pod OOMKilled the runtime could not see).
    Only on a verdict the runtime recorded, or an out-of-memory (a run that fails is not judged: no verdict stays
    no verdict, never a silent pass)."""
    wanted = getattr(expect, "outcome", None) if expect is not None else None
    if wanted is None or outcome is None or (expectations is None and outcome != "outOfMemory"):
        return expectations
    check = outcome_check(outcome, wanted).to_status()
    kept = [e for e in expectations or [] if e.get("name") != OUTCOME_CHECK]
    recorded = next((e for e in expectations or [] if e.get("name") == OUTCOME_CHECK), None)
    if recorded is not None and bool(recorded.get("passed")) == check["passed"]:
        check = recorded
    return [*kept, check]


def line(record: dict[str, Any] | None) -> str:
    """The record's one line (``OutOfMemory.line``): where, when and how much (a runtime that said outOfMemory
    without a record: no more than that)."""
    return OutOfMemory.model_validate(record).line() if record else "out of memory"


def failure_message(record: dict[str, Any] | None, done: int, total: int) -> str:
    """The status message of a job that ran out of memory: the record's line, how far it got, the signal's own
    words, and what to do."""
    words = (record or {}).get("message") or ""
    return (f"{line(record)}, after {done} of {total} rollouts" + (f" ({words})" if words else "")
            + ". What to do: this configuration does not fit; make it smaller (spec.trainer.microBatchTokens, the "
            "model; an engine's mem-fraction-static in spec.rollout.engineArgs) or run it on pods with more memory, "
            "then delete and re-create the ForgeReplayJob; a configuration meant not to fit sets "
            "spec.expect.outcome: outOfMemory")


def expected_message(record: dict[str, Any] | None) -> str:
    """The status message of a job that ran out of memory as spec.expect.outcome expects."""
    return f"the run ran out of memory, as spec.expect.outcome expects: {line(record)}"


def needs_teardown(status: dict[str, Any], rayjob: dict[str, Any] | None) -> bool:
    """Whether the RayJob of a job that ran out of memory still keeps its Ray cluster after it ends
    (``ttlSecondsAfterFinished`` above 0): the operator sets it to 0, so that KubeRay deletes the cluster, and
    its GPUs, as soon as the Ray job has ended (kuberay v1.5.0 rayjob_controller.go:1300-1330, every RayJob
    change is reconciled)."""
    if status.get("outcome") != "outOfMemory" or rayjob is None:
        return False
    spec = rayjob.get("spec") or {}
    return bool(spec.get("shutdownAfterJobFinishes")) and bool(spec.get("ttlSecondsAfterFinished"))


def _camel(record: OutOfMemory) -> dict[str, Any]:
    return record.model_dump(mode="json", by_alias=True, exclude_none=True)
