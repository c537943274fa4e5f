"""status_from(job, rayjob, verify_job, progress) -> the ForgeReplayJob status: phase and conditions.

Pure functions: observed objects (plain dicts as the API server returns them) in, a camelCase
status dict out, ready to be sent as a JSON merge patch (a ``None`` value removes a field).

Conditions are written for kstatus (Flux) and Argo CD health checks:
- ``Ready``: True once the job succeeded.
- ``Reconciling``: True while work is in progress (pending, verifying, launching, running).
- ``Stalled``: True when the job failed or a change cannot be applied (the desired state is unreachable).
- ``SpecValid``, ``DumpsVerified``, ``ClusterReady``: what stands between the spec and a running job.
- ``ExpectationsMet`` (with ``spec.expect``): the verdict the runtime recorded (``status.expectations``); False fails
  the job with reason ``ExpectationsNotMet`` and the first failure (``controller.shadow``: not with enforce false).
- ``status.outcome`` / ``status.outOfMemory`` (``controller.out_of_memory``): an out-of-memory fails the job with
  reason ``OutOfMemory`` (it succeeds when spec.expect.outcome is outOfMemory).

A launch that cannot fix itself (``controller.stuck``: ImagePullFailed, InitContainerFailed, CrashLoop,
StartDeadlineExceeded) fails the job with that reason. A KubeRay ``Complete`` with a ``jobStatus`` other than
``SUCCEEDED`` is a failure. A failure because the Ray head
pod went away mid-run (``head_pod_loss``) says so, with reason ``HeadPodLost``, instead of KubeRay's words about the
submitter it took down.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from forge_replay.api import ForgeReplayJob, Problem
from forge_replay.api.progress_report import ProgressReport
from forge_replay.controller import out_of_memory, stuck
from forge_replay.controller.head_pod import head_pod_loss
from forge_replay.controller.out_of_memory import Finding
from forge_replay.controller.naming import results_folder
from forge_replay.controller.shadow import EXPECTATIONS_NOT_MET, fails_the_job, shadowed
from forge_replay.verdict.checks import missing_verdict

TERMINAL_PHASES = ("Succeeded", "Failed")
IN_PROGRESS_PHASES = ("Pending", "Verifying", "Launching", "Running")
CONDITION_TYPES = ("Ready", "Reconciling", "Stalled", "SpecValid", "DumpsVerified", "ClusterReady")
MAX_MESSAGE = 4000  # condition messages stay readable in `kubectl describe`; the tail is kept


@dataclass(frozen=True)
class Refusal:
    """A spec the operator will not apply (changed after launch, or invalid after launch)."""

    reason: str
    message: str


@dataclass(frozen=True)
class VerifyState:
    """What the verify Job says: ``absent``, ``running``, ``succeeded`` or ``failed``."""

    state: str
    reason: str = ""
    message: str = ""
    finished_at: str | None = None


@dataclass(frozen=True)
class _Cond:
    status: str
    reason: str
    message: str = ""


def rfc3339(moment: datetime) -> str:
    """Kubernetes' timestamp format (UTC, seconds)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def verify_state(verify_job: dict[str, Any] | None, verify_message: str | None = None) -> VerifyState:
    """Read a batch Job's outcome; ``verify_message`` is the verify pod's termination message, if any."""
    if verify_job is None:
        return VerifyState("absent")
    status = verify_job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Failed":
            detail = (verify_message or "").strip() or cond.get("message") or cond.get("reason") or "no output"
            return VerifyState(
                "failed",
                cond.get("reason") or "Failed",
                _tail(detail),
                cond.get("lastTransitionTime") or status.get("completionTime"),
            )
        if cond.get("type") == "Complete":
            return VerifyState("succeeded", "Complete", "", status.get("completionTime") or cond.get("lastTransitionTime"))
    if (status.get("succeeded") or 0) >= 1 and not status.get("active"):
        return VerifyState("succeeded", "Complete", "", status.get("completionTime"))
    return VerifyState("running")


def status_from(
    job: ForgeReplayJob,
    rayjob: dict[str, Any] | None,
    verify_job: dict[str, Any] | None,
    progress: ProgressReport | None,
    *,
    verify_message: str | None = None,
    refusal: Refusal | None = None,
    launch_note: str | None = None,
    ray_pods: list[dict[str, Any]] | None = None,
    launch_pods: list[dict[str, Any]] | None = None,
    bounds: stuck.Bounds | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The status of ``job`` given its observed children (``job.status`` is the previous status).

    ``launch_note`` is why a Ray pod of a launching RayJob is stuck (its own reason: unschedulable, image
    pull, ...); it goes into ClusterReady and the message. ``ray_pods`` are the pods of the RayJob's Ray cluster
    as read when it failed: whether its head pod was lost mid-run (``head_pod_loss``). ``launch_pods`` are its pods
    as read while it launches: a failure that cannot fix itself, past its ``bounds``, ends the job (``stuck``)."""
    now = now or datetime.now(timezone.utc)
    now_text = rfc3339(now)
    previous = _previous(job)
    verify = verify_state(verify_job, verify_message)
    launched_before = bool(previous.get("rayJobName"))
    if rayjob is not None:
        run = _run_of_rayjob(job, previous, rayjob, progress, launch_note, ray_pods, now)
    elif launched_before:
        run = _run_without_rayjob(previous, progress)
    else:
        run = _run_before_launch(job, verify, verify_message)
    stop = stuck.stopped(job, previous, run.phase, launch_pods, now, bounds, launch_note)
    if stop is not None:  # it could not start, and will not: it ends (docs/operator.md "Why a job ended")
        run = _Run("Failed", stop.reason, stop.message, _Cond("False", stop.reason, stop.cluster), now_text)

    launched = rayjob is not None or launched_before
    found = out_of_memory.finding(job, previous, progress, ray_pods, run.phase) if launched else Finding()
    expectations = out_of_memory.with_outcome_check(_expectations(progress, previous), job.spec.expect, found.outcome)
    unmet = _unmet(job.spec, expectations, run.phase)
    if fails_the_job(job.spec.expect, unmet):  # the run ended, spec.expect not met (or never checked): it fails
        run = replace(run, phase="Failed", reason=EXPECTATIONS_NOT_MET, message=f"expectation not met: {unmet}")
    run = _out_of_memory(job, run, found, unmet, previous, progress)
    if run.phase in TERMINAL_PHASES:
        run = replace(run, completion=previous.get("completionTime") or run.completion or now_text)

    conditions, message = _health(run, refusal)
    conditions["DumpsVerified"] = _dumps_verified(job, verify, verify_message, rayjob is not None or launched_before)
    conditions["ClusterReady"] = run.cluster
    if job.spec.expect is not None:
        conditions[EXPECTATIONS_MET] = shadowed(_expectations_met(expectations, unmet, run.phase), job.spec.expect)

    rj_status = (rayjob or {}).get("status") or {}
    # Once the job's objects exist its spec is frozen, in the API server too (the CRD's transition rules).
    has_children = rayjob is not None or verify_job is not None or launched_before
    launched_generation = previous.get("launchedGeneration") or (job.metadata.generation if has_children else None)
    return {
        "phase": run.phase,
        "observedGeneration": job.metadata.generation,
        "launchedGeneration": launched_generation,
        "conditions": _conditions(conditions, previous, job.metadata.generation, now_text),
        "rayJobName": (rayjob or {}).get("metadata", {}).get("name") or previous.get("rayJobName"),
        # A suspended RayJob has no Ray cluster (KubeRay names one while initializing, then deletes it).
        "rayClusterName": None if run.phase == "Suspended" else rj_status.get("rayClusterName") or previous.get(
            "rayClusterName"),
        **_reported(job, previous, progress, expectations),
        "outcome": found.outcome,
        "outOfMemory": found.record,
        "startTime": _start_time(previous, rayjob),
        "admissionTime": stuck.admission_time(job, previous, rayjob, run.phase, now_text),
        "firstStepTime": stuck.first_step_time(previous, progress, now_text),
        "completionTime": run.completion if run.phase in TERMINAL_PHASES else None,
        "message": _tail(message),
        "results": results_location(job),
    }


@dataclass(frozen=True)
class _Run:
    """Where a job stands: its phase, the reason and message of its conditions, ClusterReady, and when it ended."""

    phase: str
    reason: str
    message: str
    cluster: _Cond
    completion: str | None = None


def _run_of_rayjob(
    job: ForgeReplayJob, previous: dict[str, Any], rayjob: dict[str, Any], progress: ProgressReport | None,
    launch_note: str | None, ray_pods: list[dict[str, Any]] | None, now: datetime,
) -> _Run:
    """A job whose RayJob exists: what KubeRay says, with why a Ray pod is stuck while it launches, and a failure
    because the head pod went away named as such."""
    phase, reason, message, cluster = _from_rayjob(job, rayjob)
    if launch_note and phase == "Launching":
        cluster = _Cond("False", "PodsNotReady", f"{cluster.message}; {launch_note}")
        message = f"{message}; {launch_note}"
    if phase == "Failed":
        reason, message, cluster = _head_pod_lost(job, previous, rayjob, ray_pods, progress, now) or (
            reason, message, cluster)
    completion = (rayjob.get("status") or {}).get("endTime") if phase in TERMINAL_PHASES else None
    return _Run(phase, reason, message, cluster, completion)


def _out_of_memory(job: ForgeReplayJob, run: _Run, found: Finding, unmet: str | None, previous: dict[str, Any],
                   progress: ProgressReport | None) -> _Run:
    """A run that ran out of memory (``controller.out_of_memory``) fails with reason OutOfMemory, once it has
    ended (its RayJob, or the runtime's result, says so); as spec.expect.outcome expects, it succeeds."""
    ended = run.phase in TERMINAL_PHASES or (progress is not None and progress.result is not None)
    if found.outcome != "outOfMemory" or not ended:
        return run
    completion = run.completion or found.ended_at
    if job.spec.expect is not None and job.spec.expect.outcome == "outOfMemory":
        if unmet is not None or run.phase not in TERMINAL_PHASES:  # another check failed; or it has not ended yet
            return run
        return replace(run, phase="Succeeded", reason="Succeeded", completion=completion,
                       message=out_of_memory.expected_message(found.record))
    done, total = out_of_memory.rollouts_done(job, previous, progress)
    return replace(run, phase="Failed", reason=out_of_memory.OUT_OF_MEMORY, completion=completion,
                   message=out_of_memory.failure_message(found.record, done, total))


def _run_without_rayjob(previous: dict[str, Any], progress: ProgressReport | None) -> _Run:
    """A launched job whose RayJob is gone: the runtime's own record, else the result already in the status, else
    Failed (deleted before the job finished)."""
    released = _Cond("False", "JobFinished", "the Ray cluster was released after the job finished")
    if progress is not None and progress.result is not None:
        # The RayJob is gone (KubeRay's cleanup, a short TTL, operator downtime): the runtime's own record wins.
        result = progress.result
        reason = "Succeeded" if result.phase == "Succeeded" else "RuntimeFailed"
        message = f"the runtime reported {result.phase.lower()}" + (f": {result.message}" if result.message else "")
        return _Run(result.phase, reason, message, released, result.finished_at)
    if previous.get("phase") in TERMINAL_PHASES:
        # The RayJob is gone after the job finished (deleted, or cleaned up): the result stays.
        phase = previous["phase"]
        reason, message = _condition_of(previous, "Stalled" if phase == "Failed" else "Ready")
        return _Run(phase, reason, message, released)
    message = (
        f"RayJob {previous['rayJobName']} was deleted before the job finished and the runtime recorded no "
        "result; delete and re-create the ForgeReplayJob to run it again"
    )
    return _Run("Failed", "RayJobDeleted", message, _Cond("False", "RayJobDeleted", message))


def _run_before_launch(job: ForgeReplayJob, verify: VerifyState, verify_message: str | None) -> _Run:
    """A job with no RayJob yet: its dumps being verified (or failed to), or its RayJob about to be created."""
    name = job.metadata.name
    waiting = _Cond("False", "WaitingForVerification", "the RayJob is created once the dumps are verified")
    if verify.state == "failed":
        message = f"dump verification failed (verify Job {name}-verify): {verify.message}"
        cluster = _Cond("False", "NotRequested", "no GPUs were requested: dump verification failed")
        return _Run("Failed", "VerifyFailed", message, cluster, verify.finished_at)
    if job.spec.replay.verify and verify.state == "absent":
        return _Run("Pending", "Pending", "creating the verify Job", waiting)
    if job.spec.replay.verify and verify.state == "running":
        return _Run("Verifying", "Verifying", _verifying_message(name, verify_message), waiting)
    return _Run("Launching", "CreatingRayJob", f"creating RayJob {name}",
                _Cond("False", "NotCreated", f"RayJob {name} is being created"))


def _dumps_verified(job: ForgeReplayJob, verify: VerifyState, verify_message: str | None, launched: bool) -> _Cond:
    """DumpsVerified: what the verify Job says (a job that launched passed it)."""
    if job.spec.replay.verify:
        dumps = {
            "absent": _Cond("Unknown", "Pending", "the verify Job is about to be created"),
            "running": _Cond("Unknown", "Verifying", _verifying_message(job.metadata.name, verify_message)),
            "succeeded": _Cond("True", "Verified", "every dump the job needs exists and loads"),
            "failed": _Cond("False", "VerifyFailed", verify.message),
        }[verify.state]
    else:
        dumps = _Cond("True", "NotRequested", "spec.replay.verify is false: the dumps were not checked in advance")
    if launched and dumps.status == "Unknown":
        return _Cond("True", "Verified", "verified before launch")
    return dumps


def _health(run: _Run, refusal: Refusal | None) -> tuple[dict[str, _Cond], str]:
    """Ready, Reconciling, Stalled and SpecValid of ``run``, and the status message: a refused spec change stalls
    the job, whatever its phase, and its message is the refusal's."""
    message = run.message
    if refusal is not None:
        spec_valid = _Cond("False", refusal.reason, refusal.message)
        stalled = _Cond("True", refusal.reason, refusal.message)
        reconciling = _Cond("False", refusal.reason, "the change is refused; nothing is being applied")
        message = refusal.message
    else:
        spec_valid = _Cond("True", "Valid", "the spec passed validation")
        stalled = _Cond("True", run.reason, message) if run.phase == "Failed" else _Cond("False", "NotStalled", "")
        reconciling = (
            _Cond("True", run.reason, message) if run.phase in IN_PROGRESS_PHASES
            else _Cond("False", run.reason, message)
        )
    ready = _Cond("True", "Succeeded", message) if run.phase == "Succeeded" else _Cond("False", run.reason, message)
    return {"Ready": ready, "Reconciling": reconciling, "Stalled": stalled, "SpecValid": spec_valid}, message


def _reported(
    job: ForgeReplayJob, previous: dict[str, Any], progress: ProgressReport | None,
    expectations: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """What the runtime reported, as the status carries it (the previous status's without a progress report):
    rollouts done, peak memory, fallbacks, the verdict on spec.expect, and data slime accepts but a user should
    see, as the runtime counted it (runtime/progress_publish.py)."""
    total = job.spec.replay.num_rollouts
    rollouts = {"completed": 0, "total": total}
    if progress is not None:
        rollouts = {"completed": progress.completed, "total": progress.total or total}
    elif previous.get("rollouts"):
        rollouts = previous["rollouts"]
    memory = previous.get("memory")
    if progress is not None and progress.memory is not None:
        memory = progress.memory.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {
        "rollouts": rollouts,
        "memory": memory,
        "fallbacks": progress.fallbacks if progress is not None else previous.get("fallbacks"),
        "expectations": expectations,
        "maskedOutSamples": progress.masked_out_samples if progress is not None else previous.get("maskedOutSamples"),
        "rolloutIdMismatches": (
            progress.rollout_id_mismatches if progress is not None else previous.get("rolloutIdMismatches")),
        "sweep": progress.sweep.model_dump(mode="json", by_alias=True, exclude_none=True)
        if progress is not None and progress.sweep is not None else previous.get("sweep"),
    }


def _start_time(previous: dict[str, Any], rayjob: dict[str, Any] | None) -> str | None:
    """When the run started: as first recorded, else KubeRay's, else when the RayJob was created."""
    start = previous.get("startTime") or ((rayjob or {}).get("status") or {}).get("startTime")
    if start is None and rayjob is not None:
        start = (rayjob.get("metadata") or {}).get("creationTimestamp")
    return start


def results_location(job: ForgeReplayJob) -> dict[str, str] | None:
    """``status.results``: the run's folder on its results claim (None without a claim)."""
    claim = job.spec.results.claim_name
    if not claim or not job.metadata.name:
        return None
    return {"claimName": claim, "path": results_folder(job.metadata.namespace, job.metadata.name, job.metadata.uid)}


def status_for_invalid_spec(
    generation: int | None,
    problems: list[Problem],
    previous: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Status of a job whose spec breaks the API rules and that has no children: Failed, SpecValid=False.

    The message is what `forge-replay validate` prints for the same spec (one ``path: message`` a line).
    """
    now_text = rfc3339(now or datetime.now(timezone.utc))
    previous = previous or {}
    message = invalid_spec_message(problems)
    waiting = "nothing is created until the spec is valid"
    conditions = {
        "Ready": _Cond("False", "SpecInvalid", message),
        "Reconciling": _Cond("False", "SpecInvalid", waiting),
        "Stalled": _Cond("True", "SpecInvalid", message),
        "SpecValid": _Cond("False", "SpecInvalid", message),
        "DumpsVerified": _Cond("Unknown", "SpecInvalid", waiting),
        "ClusterReady": _Cond("False", "SpecInvalid", waiting),
    }
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": _conditions(conditions, previous, generation, now_text),
        "rayJobName": None,
        "rayClusterName": None,
        "rollouts": None,
        "memory": None,
        "fallbacks": None,
        "maskedOutSamples": None,
        "rolloutIdMismatches": None,
        "startTime": None,
        "completionTime": None,
        "message": _tail(f"spec invalid: {message}"),
    }


def status_for_claims(
    job: ForgeReplayJob, problems: list[Any], previous: dict[str, Any] | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """Status of a job stopped before launch by its claims (``controller.claims.ClaimProblem``): Pending,
    Stalled=True (a Warning event), nothing created until every claim it names can be mounted."""
    reason = problems[0].reason
    message = "; ".join(p.message for p in problems)
    waiting = "nothing is created until the job's claims can be mounted"
    status = _held_before_launch(job, reason, message, waiting, message, {}, previous, now)
    return {**status, "results": results_location(job)}


def _held_before_launch(
    job: ForgeReplayJob, reason: str, message: str, waiting: str, cluster_message: str,
    extra: dict[str, _Cond], previous: dict[str, Any] | None, now: datetime | None,
) -> dict[str, Any]:
    """Pending and Stalled=True for a valid spec that cannot launch yet: nothing is created, no GPU requested."""
    conditions = {
        "Ready": _Cond("False", reason, message),
        "Reconciling": _Cond("False", reason, waiting),
        "Stalled": _Cond("True", reason, message),
        "SpecValid": _Cond("True", "Valid", "the spec passed validation"),
        "DumpsVerified": _Cond("Unknown", reason, waiting),
        "ClusterReady": _Cond("False", reason, cluster_message),
        **extra,
    }
    generation = job.metadata.generation
    now_text = rfc3339(now or datetime.now(timezone.utc))
    return {
        "phase": "Pending",
        "observedGeneration": generation,
        "conditions": _conditions(conditions, previous or {}, generation, now_text),
        "message": _tail(message),
    }

PERMANENT_API_ERRORS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 422: "Invalid"}
"""API answers a retry cannot fix (RBAC, a missing CRD, a webhook's refusal), by HTTP status -> reason."""

API_ERROR_HINTS = {
    403: "grant the operator's ServiceAccount what it lacks (the chart's RBAC, docs/operator.md \"API access\")",
    404: "install what is missing (KubeRay's CRDs: helm install kuberay-operator, or kubectl apply --server-side)",
    422: "an admission webhook or the API refused the object: fix what the message names",
    400: "the API refused the request: fix what the message names",
}


def status_for_api_error(
    generation: int | None, code: int, error: str, previous: dict[str, Any] | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The previous status with Stalled=True: a permanent API error (``code``) stops the job until fixed.

    The phase is kept (the children already made stay); Reconciling=False because nothing is retried
    until the resync or a change, and the message says what to do.
    """
    now_text = rfc3339(now or datetime.now(timezone.utc))
    previous = previous or {}
    reason = PERMANENT_API_ERRORS.get(code, f"HTTP{code}")
    message = f"{error}. What to do: {API_ERROR_HINTS.get(code, 'fix what the message names')}"
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    wanted = {
        kind: _Cond(c.get("status", "Unknown"), c.get("reason", kind), c.get("message", ""))
        for kind, c in before.items() if kind in (*CONDITION_TYPES, EXPECTATIONS_MET)  # all it wrote, kept
    }
    for kind in CONDITION_TYPES:
        wanted.setdefault(kind, _Cond("Unknown", "APIError", message))
    wanted["Stalled"] = _Cond("True", reason, message)
    wanted["Reconciling"] = _Cond("False", reason, "stopped until the API error is fixed (retried every resync)")
    wanted["Ready"] = _Cond("False", reason, message)
    return {
        "phase": previous.get("phase") or "Pending",
        "observedGeneration": generation,
        "conditions": _conditions(wanted, previous, generation, now_text),
        "message": _tail(message),
    }


def new_warning(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """True when ``new`` stalls for a reason, message or generation it did not before (a refusal of each new
    spec, an API error): one Warning event each time, not one per resync."""
    def stalled(status: dict[str, Any] | None) -> tuple[str, str, int | None] | None:
        cond = next((c for c in (status or {}).get("conditions") or [] if c.get("type") == "Stalled"), None)
        if not cond or cond.get("status") != "True":
            return None
        return cond.get("reason", ""), cond.get("message", ""), cond.get("observedGeneration")

    now_stalled = stalled(new)
    return now_stalled is not None and now_stalled != stalled(old)


def invalid_spec_message(problems: list[Problem]) -> str:
    """The problems as `forge-replay validate` prints them: ``path: message``, one a line."""
    return "\n".join(str(p) for p in problems)


def phase_changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """True when the phase differs from the previous status (an event is due)."""
    return (old or {}).get("phase") != new.get("phase")


def same_status(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """True when patching ``new`` over ``old`` would change nothing (so no patch is sent)."""
    old = old or {}
    return all(_norm(old.get(key)) == _norm(value) for key, value in new.items())


# --------------------------------------------------------------------------------------- helpers


def _from_rayjob(job: ForgeReplayJob, rayjob: dict[str, Any]) -> tuple[str, str, str, _Cond]:
    """Phase, reason, message and ClusterReady from a RayJob's status."""
    name = rayjob.get("metadata", {}).get("name", job.metadata.name)
    status = rayjob.get("status") or {}
    deployment = status.get("jobDeploymentStatus") or ""
    job_status = status.get("jobStatus") or ""
    cluster_name = status.get("rayClusterName") or "(not created yet)"
    rj_message = (status.get("message") or status.get("reason") or "").strip()
    suspended_spec = bool((rayjob.get("spec") or {}).get("suspend"))
    cluster_state = ((status.get("rayClusterStatus") or {}).get("state") or "").lower()
    finished = _Cond("False", "JobFinished", "the Ray cluster is released after the job finished")

    kuberay_reason = status.get("reason") or ""
    detail = f": {rj_message}" if rj_message else ""
    if deployment == "Complete":
        if job_status == "SUCCEEDED":
            return "Succeeded", "Succeeded", f"RayJob {name} succeeded", finished
        reason = kuberay_reason or f"RayJob{(job_status or 'Unknown').title()}"
        text = f"RayJob {name} completed with jobStatus {job_status or 'unset'}{detail}"
        return "Failed", reason, _with_hint(text, reason), finished
    if deployment in ("Failed", "ValidationFailed"):
        reason = kuberay_reason or f"RayJob{deployment}"
        return "Failed", reason, _with_hint(f"RayJob {name} {deployment}{detail}", reason), finished
    if job_status in ("FAILED", "STOPPED") and deployment not in ("Retrying", "Suspending", "Suspended"):
        # The Ray job ended; KubeRay keeps the deployment Running for a grace period before it says so.
        reason = kuberay_reason or "AppFailed"
        text = f"RayJob {name}: the Ray job is {job_status}{detail}"
        return "Failed", reason, _with_hint(text, reason), finished
    # KubeRay takes a RayJob created suspended through Initializing to Suspending (updateStatusToSuspendingIfNeeded):
    # it is suspended all along, not launching (which cost a status patch and two phase events per job).
    if deployment in ("Suspending", "Suspended") or (suspended_spec and deployment in ("", "New", "Initializing")):
        queue = job.spec.scheduling.queue_name
        if queue and not job.spec.suspend:
            return (
                "Pending",
                "QueuedForAdmission",
                f"RayJob {name} waits for Kueue to admit it from queue {queue}",
                _Cond("False", "Queued", "the Ray cluster is created once Kueue admits the RayJob"),
            )
        return "Suspended", "Suspended", f"RayJob {name} is suspended (spec.suspend)", _Cond(
            "False", "Suspended", "the Ray cluster is deleted while the job is suspended"
        )
    if deployment == "Running":
        return "Running", "Running", f"RayJob {name} is running on RayCluster {cluster_name}", _Cond(
            "True", "ClusterReady", f"RayCluster {cluster_name} is ready"
        )
    if deployment == "Retrying":
        return "Launching", "Retrying", f"RayJob {name} is retrying{': ' + rj_message if rj_message else ''}", _Cond(
            "False", "Retrying", "KubeRay is re-creating the Ray cluster"
        )
    cluster = (
        _Cond("True", "ClusterReady", f"RayCluster {cluster_name} is ready")
        if cluster_state == "ready"
        else _Cond("False", "Provisioning", f"RayCluster {cluster_name} is being provisioned")
    )
    label = deployment or "New"
    return "Launching", "Launching", f"RayJob {name} is {label.lower()}: waiting for its Ray cluster", cluster


HEAD_POD_LOST = "HeadPodLost"


def _head_pod_lost(
    job: ForgeReplayJob, previous: dict[str, Any], rayjob: dict[str, Any], pods: list[dict[str, Any]] | None,
    progress: ProgressReport | None, now: datetime,
) -> tuple[str, str, _Cond] | None:
    """Reason, message and ClusterReady of a job that failed because its Ray head went away (kept once written:
    KubeRay deletes the pods later, after which the loss can no longer be seen)."""
    if previous.get("phase") == "Failed" and _condition_of(previous, "Ready")[0] == HEAD_POD_LOST:
        message = _condition_of(previous, "Ready")[1]
        return HEAD_POD_LOST, message, _Cond("False", HEAD_POD_LOST, _condition_of(previous, "ClusterReady")[1])
    loss = head_pod_loss(rayjob, pods or [], now)
    if loss is None:
        return None
    if progress is not None:
        done, total = progress.completed, progress.total or job.spec.replay.num_rollouts
    else:
        done = (previous.get("rollouts") or {}).get("completed", 0)
        total = job.spec.replay.num_rollouts
    said = ((rayjob.get("status") or {}).get("message") or "").strip()
    kuberay = f" (KubeRay: {said})" if said else ""
    message = (
        f"{loss}, after {done} of {total} rollouts: the Ray job and the trainer died with it{kuberay}. "
        f"What to do: nothing of the run is resumed; delete and re-create the ForgeReplayJob (kubectl delete "
        f"forgereplayjob {job.metadata.name}, then kubectl apply the same file) to run it again; if nobody deleted "
        "the pod, its node or a memory limit did: see kubectl get events"
    )
    return HEAD_POD_LOST, message, _Cond("False", HEAD_POD_LOST, f"{loss}; the Ray cluster has no head")


HINTS = {
    "DeadlineExceeded": "the job ran past spec.activeDeadlineSeconds: raise it, or find what was slow in the Ray "
    "head's logs (kubectl logs -l forgereplay.io/role=head)",
    "AppFailed": "the runtime failed: its last lines are in the submitter's and the Ray head's logs "
    "(kubectl logs -l forgereplay.io/role=submitter)",
    "SubmissionFailed": "KubeRay could not submit the entrypoint to the Ray head: check the head pod's events and "
    "logs, and that the runtime image matches spec.image",
}


def _with_hint(text: str, reason: str) -> str:
    """A failure message with what the user should do next, when the reason says it."""
    hint = HINTS.get(reason)
    return f"{text}. What to do: {hint}" if hint else text


def _verifying_message(name: str | None, note: str | None) -> str:
    base = f"verify Job {name}-verify is checking the dumps"
    return f"{base}; {note}" if note else base


def _previous(job: ForgeReplayJob) -> dict[str, Any]:
    if job.status is None:
        return {}
    return job.status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _condition_of(previous: dict[str, Any], kind: str) -> tuple[str, str]:
    for cond in previous.get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("reason") or previous.get("phase", ""), cond.get("message") or ""
    return previous.get("phase", ""), previous.get("message") or ""


def _conditions(
    wanted: dict[str, _Cond], previous: dict[str, Any], generation: int | None, now_text: str
) -> list[dict[str, Any]]:
    """metav1.Conditions, keeping lastTransitionTime when a condition's status did not change."""
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    out = []
    for kind in (*CONDITION_TYPES, *(k for k in wanted if k not in CONDITION_TYPES)):  # then ExpectationsMet
        cond = wanted[kind]
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == cond.status else None
        out.append(
            {
                "type": kind,
                "status": cond.status,
                "reason": cond.reason or kind,
                "message": _tail(cond.message),
                "lastTransitionTime": since or now_text,
                "observedGeneration": generation,
            }
        )
    return out


# ----------------------------------------------------------------------------- spec.expect (issue 17)

EXPECTATIONS_MET = "ExpectationsMet"


def _expectations(progress: ProgressReport | None, previous: dict[str, Any]) -> list[dict[str, Any]] | None:
    """status.expectations: the verdict the runtime recorded with its result, else the one already in the status."""
    result = progress.result if progress is not None else None
    if result is not None and result.expectations is not None:
        return [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in result.expectations]
    return previous.get("expectations")


def _unmet(spec: Any, expectations: list[dict[str, Any]] | None, phase: str) -> str | None:
    """The first failed expectation (``name: message``) of a run that ended; a run that succeeded without
    recording a verdict on spec.expect is not met either (never a silent pass). None otherwise."""
    if spec.expect is None or phase not in ("Running", *TERMINAL_PHASES):
        return None
    failed = next((e for e in expectations or [] if not e.get("passed")), None)
    if failed is not None:
        return f"{failed['name']}: {failed.get('message', '')}"
    return missing_verdict(spec.expect is not None, expectations, phase == "Succeeded",
                           " on spec.expect (its progress ConfigMap holds no result)")


def _expectations_met(expectations: list[dict[str, Any]] | None, unmet: str | None, phase: str) -> _Cond:
    if unmet is not None:
        return _Cond("False", EXPECTATIONS_NOT_MET, unmet)
    if expectations is not None:
        return _Cond("True", EXPECTATIONS_MET, f"all {len(expectations)} checks of spec.expect passed")
    if phase == "Failed":
        return _Cond("Unknown", "NotChecked", "the run did not finish: spec.expect was not checked")
    return _Cond("Unknown", "Pending", "spec.expect is checked when the run ends")


def status_for_baseline(job: ForgeReplayJob, problem: str, previous: dict[str, Any] | None = None,
                        now: datetime | None = None) -> dict[str, Any]:
    """Status of a job whose spec.expect.baseline cannot be read before launch (a missing ConfigMap): Pending,
    Stalled=True (a Warning event), ExpectationsMet=False; nothing is created, no GPU requested, until it can."""
    waiting = "nothing is created until the baseline of spec.expect can be read"
    expectations = {EXPECTATIONS_MET: _Cond("False", "BaselineNotFound", problem)}
    return _held_before_launch(job, "BaselineNotFound", problem, waiting, waiting, expectations, previous, now)

def _tail(text: str) -> str:
    text = text or ""
    return text if len(text) <= MAX_MESSAGE else "..." + text[-(MAX_MESSAGE - 3):]


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value
