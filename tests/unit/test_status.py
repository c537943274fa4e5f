"""status_from: the table from observed children to phase + conditions (kstatus-readable)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import yaml

from forge_replay.api import ForgeReplayJobStatus, Problem, parse_job
from forge_replay.api.progress_report import ProgressReport
from forge_replay.controller.status import (
    Refusal,
    same_status,
    status_for_invalid_spec,
    status_from,
    verify_state,
)

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
LATER = datetime(2026, 11, 29, 12, 5, 0, tzinfo=timezone.utc)

JOB = yaml.safe_load(
    """
apiVersion: forgereplay.io/v1alpha1
kind: ForgeReplayJob
metadata: {name: memtest, namespace: ml, uid: u-1, generation: 3}
spec:
  replay:
    mode: forge
    dumps: {claimName: dumps, path: "run/rollout_{rollout_id}.pt"}
    numRollouts: 8
  model: {config: {hidden_size: 64}}
  rollout: {numGpus: 8, numGpusPerEngine: 2}
"""
)


def job(previous: dict | None = None, **spec_changes):
    doc = yaml.safe_load(yaml.safe_dump(JOB))
    for dotted, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    parsed = parse_job(doc)
    if previous:
        parsed = parsed.model_copy(update={"status": ForgeReplayJobStatus.model_validate(previous)})
    return parsed


def verify(state: str, message: str = "") -> dict:
    if state == "running":
        return {"metadata": {"name": "memtest-verify"}, "status": {"active": 1}}
    kind = {"succeeded": "Complete", "failed": "Failed"}[state]
    cond = {"type": kind, "status": "True", "reason": "BackoffLimitExceeded" if kind == "Failed" else "",
            "message": message, "lastTransitionTime": "2026-11-29T11:59:00Z"}
    return {"metadata": {"name": "memtest-verify"},
            "status": {"conditions": [cond], "completionTime": "2026-11-29T11:59:00Z"}}


def rayjob(deployment: str = "", job_status: str = "", suspend: bool = False, **status) -> dict:
    body = {"metadata": {"name": "memtest", "creationTimestamp": "2026-11-29T11:58:00Z"},
            "spec": {"suspend": suspend}, "status": {}}
    if deployment:
        body["status"]["jobDeploymentStatus"] = deployment
    if job_status:
        body["status"]["jobStatus"] = job_status
    body["status"].update(status)
    return body


def cond(status: dict, kind: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == kind)


def kstatus_view(status: dict) -> tuple[str, str, str]:
    return tuple(cond(status, k)["status"] for k in ("Ready", "Reconciling", "Stalled"))


CASES = [
    # (name, job kwargs, rayjob, verify job, verify message, phase, (Ready, Reconciling, Stalled), extra checks)
    ("nothing yet", {}, None, None, "Pending", ("False", "True", "False"),
     {"DumpsVerified": ("Unknown", "Pending"), "ClusterReady": ("False", "WaitingForVerification")}),
    ("verifying", {}, None, verify("running"), "Verifying", ("False", "True", "False"),
     {"DumpsVerified": ("Unknown", "Verifying")}),
    ("verified, rayjob not created yet", {}, None, verify("succeeded"), "Launching", ("False", "True", "False"),
     {"DumpsVerified": ("True", "Verified"), "ClusterReady": ("False", "NotCreated")}),
    ("verify disabled", {"replay__verify": False}, None, None, "Launching", ("False", "True", "False"),
     {"DumpsVerified": ("True", "NotRequested")}),
    ("rayjob new", {}, rayjob(), verify("succeeded"), "Launching", ("False", "True", "False"),
     {"ClusterReady": ("False", "Provisioning")}),
    ("rayjob initializing", {}, rayjob("Initializing", rayClusterName="memtest-raycluster-x"), verify("succeeded"),
     "Launching", ("False", "True", "False"), {"ClusterReady": ("False", "Provisioning")}),
    ("rayjob running", {}, rayjob("Running", "RUNNING", rayClusterName="memtest-raycluster-x"),
     verify("succeeded"), "Running", ("False", "True", "False"), {"ClusterReady": ("True", "ClusterReady")}),
    ("rayjob succeeded", {}, rayjob("Complete", "SUCCEEDED", endTime="2026-11-29T13:00:00Z"), None,
     "Succeeded", ("True", "False", "False"), {"ClusterReady": ("False", "JobFinished")}),
    ("complete but failed", {}, rayjob("Complete", "FAILED", message="driver exited 1"), None,
     "Failed", ("False", "False", "True"), {}),
    ("complete but stopped", {}, rayjob("Complete", "STOPPED"), None, "Failed", ("False", "False", "True"), {}),
    ("deployment failed", {}, rayjob("Failed", "FAILED", reason="AppFailed", message="boom"), None,
     "Failed", ("False", "False", "True"), {}),
    ("validation failed", {}, rayjob("ValidationFailed", message="bad spec"), None,
     "Failed", ("False", "False", "True"), {}),
    ("suspended", {"suspend": True}, rayjob("Suspended", suspend=True), None, "Suspended",
     ("False", "False", "False"), {"ClusterReady": ("False", "Suspended")}),
    ("created suspended", {"suspend": True}, rayjob("", suspend=True), None, "Suspended",
     ("False", "False", "False"), {}),
    ("queued for kueue", {"scheduling__queueName": "q"}, rayjob("Suspended", suspend=True), None, "Pending",
     ("False", "True", "False"), {"ClusterReady": ("False", "Queued")}),
    ("retrying", {}, rayjob("Retrying", "FAILED"), None, "Launching", ("False", "True", "False"), {}),
]


@pytest.mark.parametrize(("name", "changes", "rj", "vj", "phase", "kstatus", "extra"), CASES,
                         ids=[c[0] for c in CASES])
def test_status_table(name, changes, rj, vj, phase, kstatus, extra) -> None:
    status = status_from(job(**changes), rj, vj, None, now=NOW)
    assert status["phase"] == phase
    assert kstatus_view(status) == kstatus
    assert status["observedGeneration"] == 3
    assert [c["type"] for c in status["conditions"]] == [
        "Ready", "Reconciling", "Stalled", "SpecValid", "DumpsVerified", "ClusterReady",
    ]  # fmt: skip
    for c in status["conditions"]:
        assert c["observedGeneration"] == 3
        assert c["lastTransitionTime"] == "2026-11-29T12:00:00Z"
        assert c["reason"] and c["reason"][0].isalpha() and c["reason"].replace("_", "").isalnum()
    assert cond(status, "SpecValid")["status"] == "True"
    for kind, (want_status, want_reason) in extra.items():
        assert (cond(status, kind)["status"], cond(status, kind)["reason"]) == (want_status, want_reason), kind
    if phase in ("Succeeded", "Failed"):
        assert status["completionTime"]
    else:
        assert status["completionTime"] is None


def test_complete_with_failed_job_status_is_a_failure_with_the_rayjob_message() -> None:
    status = status_from(job(), rayjob("Complete", "FAILED", message="driver exited 1"), None, None, now=NOW)
    assert status["phase"] == "Failed"
    stalled = cond(status, "Stalled")
    assert stalled["reason"] == "RayJobFailed"
    assert "jobStatus FAILED" in stalled["message"] and "driver exited 1" in stalled["message"]
    assert cond(status, "Ready")["status"] == "False"


def test_verify_failure_carries_what_verify_printed() -> None:
    printed = "rollout 3: run/rollout_3.pt: missing and fallbackToFirst is false\n1 of 8 dumps unusable"
    vj = verify("failed", message="Job has reached the specified backoff limit")
    status = status_from(job(), None, vj, None, verify_message=printed, now=NOW)
    assert status["phase"] == "Failed"
    dumps = cond(status, "DumpsVerified")
    assert (dumps["status"], dumps["reason"]) == ("False", "VerifyFailed")
    assert printed in dumps["message"]
    assert printed in status["message"] and "memtest-verify" in status["message"]
    assert cond(status, "ClusterReady")["reason"] == "NotRequested"
    assert status["rayJobName"] is None
    assert status["completionTime"] == "2026-11-29T11:59:00Z"


def test_verify_failure_without_pod_output_uses_the_job_condition() -> None:
    vj = verify("failed", message="Job was active longer than specified deadline")
    status = status_from(job(), None, vj, None, now=NOW)
    assert "deadline" in cond(status, "DumpsVerified")["message"]


def test_running_status_carries_names_times_and_progress() -> None:
    rj = rayjob("Running", "RUNNING", rayClusterName="memtest-raycluster-abcde", startTime="2026-11-29T11:58:30Z")
    progress = ProgressReport.model_validate(
        {"completed": 3, "total": 8, "fallbacks": 1,
         "memory": {"peakAllocatedGiB": 71.3, "peakReservedGiB": 75.0, "rank": 3}}
    )
    status = status_from(job(), rj, verify("succeeded"), progress, now=NOW)
    assert status["rayJobName"] == "memtest"
    assert status["rayClusterName"] == "memtest-raycluster-abcde"
    assert status["startTime"] == "2026-11-29T11:58:30Z"
    assert status["rollouts"] == {"completed": 3, "total": 8}
    assert status["memory"] == {"peakAllocatedGiB": 71.3, "peakReservedGiB": 75.0, "rank": 3}
    assert status["fallbacks"] == 1


def test_rollouts_total_known_before_progress() -> None:
    status = status_from(job(), None, None, None, now=NOW)
    assert status["rollouts"] == {"completed": 0, "total": 8}


def test_transition_time_kept_while_status_holds_and_moves_when_it_flips() -> None:
    first = status_from(job(), rayjob("Initializing"), verify("succeeded"), None, now=NOW)
    second = status_from(job(previous=first), rayjob("Running", "RUNNING"), verify("succeeded"), None, now=LATER)
    assert cond(second, "Reconciling")["lastTransitionTime"] == "2026-11-29T12:00:00Z"  # True -> True
    assert cond(second, "ClusterReady")["lastTransitionTime"] == "2026-11-29T12:05:00Z"  # False -> True
    assert second["startTime"] == first["startTime"]


def test_refused_change_keeps_the_phase_and_stalls() -> None:
    refusal = Refusal("SpecChangeRefused", "spec changed after launch (spec.trainer.nodes); ...")
    status = status_from(job(), rayjob("Running", "RUNNING"), None, None, refusal=refusal, now=NOW)
    assert status["phase"] == "Running"
    assert kstatus_view(status) == ("False", "False", "True")
    spec_valid = cond(status, "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "SpecChangeRefused")
    assert "spec.trainer.nodes" in status["message"]


def test_rayjob_deleted_before_the_end_is_a_failure() -> None:
    previous = status_from(job(), rayjob("Running", "RUNNING"), None, None, now=NOW)
    status = status_from(job(previous=previous), None, None, None, now=LATER)
    assert status["phase"] == "Failed"
    assert cond(status, "Stalled")["reason"] == "RayJobDeleted"
    assert "delete and re-create" in status["message"]


def test_finished_job_keeps_its_result_when_the_rayjob_is_gone() -> None:
    previous = status_from(job(), rayjob("Complete", "SUCCEEDED", endTime="2026-11-29T13:00:00Z"), None, None, now=NOW)
    status = status_from(job(previous=previous), None, None, None, now=LATER)
    assert status["phase"] == "Succeeded"
    assert status["completionTime"] == "2026-11-29T13:00:00Z"
    assert kstatus_view(status) == ("True", "False", "False")


def test_invalid_spec_status_uses_the_validate_message() -> None:
    problems = [Problem("spec.rollout.numGpusPerEngine", "must divide spec.rollout.numGpus (8 is not divisible by 3)")]
    status = status_for_invalid_spec(2, problems, now=NOW)
    assert status["phase"] == "Failed"
    spec_valid = cond(status, "SpecValid")
    assert spec_valid["status"] == "False"
    assert spec_valid["message"] == "spec.rollout.numGpusPerEngine: must divide spec.rollout.numGpus (8 is not divisible by 3)"
    assert kstatus_view(status) == ("False", "False", "True")
    assert status["observedGeneration"] == 2


def test_verify_state_reads_batch_job_conditions() -> None:
    assert verify_state(None).state == "absent"
    assert verify_state(verify("running")).state == "running"
    assert verify_state(verify("succeeded")).state == "succeeded"
    failed = verify_state(verify("failed", "limit"), "printed")
    assert (failed.state, failed.message) == ("failed", "printed")


def test_same_status_ignores_cleared_fields_and_sees_changes() -> None:
    status = status_from(job(), None, None, None, now=NOW)
    stored = {k: v for k, v in status.items() if v is not None}  # what the API server keeps after a merge patch
    assert same_status(stored, status)
    moved = dict(status, phase="Verifying")
    assert not same_status(stored, moved)


KSTATUS_EXPECTED = {
    "Pending": "InProgress",
    "Verifying": "InProgress",
    "Launching": "InProgress",
    "Running": "InProgress",
    "Succeeded": "Current",
    "Failed": "Failed",
    "Suspended": "InProgress",  # Ready=False: kstatus waits; Argo CD shows it as Suspended
}


def test_kstatus_library_reads_every_phase_as_intended() -> None:
    """Run Flux's own kstatus library (tests/cluster/go/kstatus) over one status per table row."""
    import json
    import subprocess

    from tests.cluster import build

    tool = build.bin_dir() / "kstatus"
    if not tool.exists():
        pytest.skip(f"kstatus tool not built ({tool}); build it with python -m tests.cluster build")
    objects, wanted = [], []
    for index, (_, changes, rj, vj, phase, _, _) in enumerate(CASES):
        status = status_from(job(**changes), rj, vj, None, now=NOW)
        objects.append({
            "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": f"case-{index}", "namespace": "ml", "generation": 3},
            "status": {k: v for k, v in status.items() if v is not None},
        })
        wanted.append(KSTATUS_EXPECTED[phase])
    refused = status_from(job(), rayjob("Running", "RUNNING"), None, None, refusal=Refusal("SpecChangeRefused", "x"),
                          now=NOW)
    objects.append({"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
                    "metadata": {"name": "refused", "namespace": "ml", "generation": 3}, "status": refused})
    wanted.append("Failed")
    stale = dict(objects[6], metadata={"name": "stale", "namespace": "ml", "generation": 4})
    objects.append(stale)  # a newer generation than observed: kstatus must not call it Current
    wanted.append("InProgress")
    out = subprocess.run([str(tool)], input=json.dumps(objects), capture_output=True, text=True, check=True)
    got = [json.loads(line)["status"] for line in out.stdout.splitlines()]
    assert got == wanted


def test_refusal_names_every_changed_field_and_ignores_suspend() -> None:
    from forge_replay.controller.reconcile import changed_fields, refusal_for_change

    launched = job()
    assert refusal_for_change(launched, job(suspend=True)) is None
    changed = job(trainer__nodes=2, replay__numRollouts=9, suspend=True)
    refusal = refusal_for_change(launched, changed)
    assert refusal is not None and refusal.reason == "SpecChangeRefused"
    assert "spec.replay.numRollouts" in refusal.message and "spec.trainer.nodes" in refusal.message
    assert "spec.suspend" not in refusal.message.split(")")[0]  # the list of changed fields
    assert changed_fields({"a": {"b": 1, "c": [1]}}, {"a": {"b": 2, "c": [1]}, "d": 0}) == ["spec.a.b", "spec.d"]


def test_verify_pod_notes_say_why_verification_is_stuck_or_what_it_printed() -> None:
    from forge_replay.controller.stuck import verify_pod_note

    unschedulable = {"metadata": {"name": "memtest-verify-x"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": '0/3 nodes are available: persistentvolumeclaim "dumps" not found.'}]}}
    note = verify_pod_note([unschedulable], failed=False)
    assert note == 'pod memtest-verify-x cannot be scheduled: 0/3 nodes are available: persistentvolumeclaim "dumps" not found.'
    status = status_from(job(), None, verify("running"), None, verify_message=note, now=NOW)
    assert status["phase"] == "Verifying" and "persistentvolumeclaim" in status["message"]
    pulling = {"metadata": {"name": "p"}, "status": {"containerStatuses": [
        {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}}
    assert verify_pod_note([pulling], failed=False) == "pod p: ImagePullBackOff: no such image"
    creating = {"metadata": {"name": "p"}, "status": {"containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert verify_pod_note([creating], failed=False) is None
    failed = {"metadata": {"name": "p"}, "status": {"containerStatuses": [
        {"state": {"terminated": {"exitCode": 1, "message": "rollout 3 missing"}}}]}}
    assert verify_pod_note([failed], failed=True) == "rollout 3 missing"
    silent = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 137}}}]}}
    assert verify_pod_note([silent], failed=True) == "exit code 137 (Error), no output"


@pytest.mark.parametrize(("deployment", "job_status", "kuberay_reason"), [
    ("Failed", "RUNNING", "DeadlineExceeded"),
    ("Failed", "FAILED", "AppFailed"),
    ("Failed", "", "SubmissionFailed"),
    ("Complete", "FAILED", "AppFailed"),
])
def test_kuberay_reason_reaches_the_condition_with_what_to_do(deployment, job_status, kuberay_reason):
    observed = rayjob(deployment, job_status, reason=kuberay_reason, message="ray said so")
    status = status_from(job(), observed, None, None, now=NOW)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Failed"
    assert conditions["Stalled"]["reason"] == kuberay_reason
    assert conditions["Ready"]["reason"] == kuberay_reason
    assert "ray said so" in status["message"] and "What to do:" in status["message"]


def test_a_failed_ray_job_is_failed_during_kuberays_grace_period():
    status = status_from(job(), rayjob("Running", "FAILED"), None, None, now=NOW)
    assert status["phase"] == "Failed"
    assert {c["type"]: c for c in status["conditions"]}["Stalled"]["reason"] == "AppFailed"
    assert status_from(job(), rayjob("Running", "RUNNING"), None, None, now=NOW)["phase"] == "Running"
    assert status_from(job(), rayjob("Retrying", "FAILED"), None, None, now=NOW)["phase"] == "Launching"


def _launched_running() -> dict:
    return status_from(job(), rayjob("Running", "RUNNING", rayClusterName="c"), None, None, now=NOW)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_rayjob_gone_before_the_end_was_seen_uses_the_runtimes_result(phase):
    from forge_replay.api.progress_report import RunResult

    progress = ProgressReport(completed=8, total=8, result=RunResult(phase=phase, message="m", finished_at="2026-11-29T12:03:00Z"))
    status = status_from(job(_launched_running()), None, None, progress, now=LATER)
    assert status["phase"] == phase
    assert status["completionTime"] == "2026-11-29T12:03:00Z"
    assert status["rollouts"] == {"completed": 8, "total": 8}
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == ("True" if phase == "Succeeded" else "False")


def test_rayjob_gone_without_a_runtime_result_is_failed_rayjob_deleted():
    status = status_from(job(_launched_running()), None, None, ProgressReport(completed=3, total=8), now=LATER)
    assert status["phase"] == "Failed"
    assert {c["type"]: c for c in status["conditions"]}["Stalled"]["reason"] == "RayJobDeleted"


def test_status_results_names_the_runs_folder_on_the_claim():
    status = status_from(job(results={"claimName": "forge-results"}), None, None, None, now=NOW)
    assert status["results"] == {"claimName": "forge-results", "path": "ml/memtest/u1"}
    assert status_from(job(), None, None, None, now=NOW)["results"] is None


def test_a_stuck_launch_is_explained_from_the_ray_pods_own_reasons():
    note = "pod c-head: ImagePullBackOff: pull access denied for registry.example.com/runtime"
    status = status_from(job(), rayjob("Initializing", rayClusterName="c"), None, None, launch_note=note, now=NOW)
    cluster = cond(status, "ClusterReady")
    assert status["phase"] == "Launching" and cluster["reason"] == "PodsNotReady"
    assert note in cluster["message"] and note in status["message"]
    running = status_from(job(), rayjob("Running", "RUNNING", rayClusterName="c"), None, None, launch_note=note, now=NOW)
    assert note not in running["message"]


def test_masked_out_samples_and_rollout_id_mismatches_reach_the_status_and_stay() -> None:
    progress = ProgressReport.model_validate({"completed": 2, "total": 8, "maskedOutSamples": 5,
                                              "rolloutIdMismatches": 1})
    status = status_from(job(), rayjob("Running", "RUNNING"), verify("succeeded"), progress, now=NOW)
    assert (status["maskedOutSamples"], status["rolloutIdMismatches"]) == (5, 1)
    # a reconcile that does not read the progress ConfigMap keeps the counts
    again = status_from(job(previous=status), rayjob("Running", "RUNNING"), verify("succeeded"), None, now=LATER)
    assert (again["maskedOutSamples"], again["rolloutIdMismatches"]) == (5, 1)
    assert same_status(status, again)


def test_launched_generation_is_set_with_the_first_child_and_kept() -> None:
    assert status_from(job(), None, None, None, now=NOW)["launchedGeneration"] is None
    verifying = status_from(job(), None, verify("running"), None, now=NOW)
    assert verifying["launchedGeneration"] == 3
    later = job(previous=verifying).model_copy(deep=True)
    later.metadata.generation = 5  # e.g. suspend toggled twice since
    assert status_from(later, rayjob("Running", "RUNNING"), None, None, now=LATER)["launchedGeneration"] == 3


def test_a_rayjob_created_suspended_is_suspended_through_kuberays_initializing() -> None:
    """KubeRay 1.5 moves a RayJob created suspended New -> Initializing (naming a cluster) -> Suspending ->
    Suspended: one status all along (no Launching in between: a patch and two phase events per job)."""
    created = status_from(job(suspend=True), rayjob(suspend=True), None, None, now=NOW)
    statuses = [created]
    for deployment, extra in (("Initializing", {"jobStatus": "NEW", "rayClusterName": "memtest-abc"}),
                              ("Suspending", {"rayClusterName": "memtest-abc"}), ("Suspended", {})):
        statuses.append(status_from(job(previous=statuses[-1], suspend=True),
                                    rayjob(deployment, suspend=True, **extra), None, None, now=LATER))
    assert [s["phase"] for s in statuses] == ["Suspended"] * 4
    assert all(same_status(statuses[0], s) for s in statuses[1:])
    assert created["rayClusterName"] is None  # no Ray cluster exists while suspended


# --------------------------------------------------------------- the Ray head pod lost mid-run (issue 23, scenario 5)

HEAD = "memtest-raycluster-x7k2p-head-abcde"
ENDED = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)


def failed_rayjob(ttl: int = 300, **status) -> dict:
    """A RayJob as KubeRay v1.5.0 leaves it when its submitter died with the head (K8sJobMode)."""
    status = {"rayClusterStatus": {"head": {"podName": HEAD, "podIP": "10.245.0.7"}, "state": "ready"}, **status}
    body = rayjob("Failed", "RUNNING", reason="SubmissionFailed", rayClusterName="memtest-raycluster-x7k2p",
                  message="Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has reached the "
                  "specified backoff limit", endTime="2026-11-29T12:00:00Z", **status)
    body["spec"].update(shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=ttl)
    return body


def pod(name: str, *, deleting: bool = False, restarts: int = 0, last: dict | None = None, **status) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "2026-11-29T11:59:58Z"} if deleting else {})}
    container = {"name": "ray-head", "restartCount": restarts, "state": {"running": {}},
                 **({"lastState": {"terminated": last}} if last else {})}
    return {"metadata": meta, "spec": {"containers": [{"name": "ray-head"}]},
            "status": {"containerStatuses": [container], **status}}


WORKER = pod("memtest-raycluster-x7k2p-trainer-worker-q8r9s")


def test_head_pod_loss_says_how_the_head_the_job_ran_on_went_away() -> None:
    from forge_replay.controller.head_pod import head_pod_loss

    soon = ENDED + timedelta(seconds=2)
    assert head_pod_loss(failed_rayjob(), [WORKER], soon) == f"the Ray head pod {HEAD} was deleted mid-run"
    assert head_pod_loss(failed_rayjob(), [pod(HEAD, deleting=True), WORKER], soon) == (
        f"the Ray head pod {HEAD} was deleted mid-run")
    oom = pod(HEAD, restarts=1, last={"reason": "OOMKilled", "exitCode": 137})
    assert head_pod_loss(failed_rayjob(), [oom], soon) == (
        f"the Ray container ray-head of head pod {HEAD} restarted mid-run (OOMKilled, exit code 137)")
    evicted = pod(HEAD, reason="Evicted", message="The node was low on resource: memory.")
    assert head_pod_loss(failed_rayjob(), [evicted], soon) == (
        f"the Ray head pod {HEAD} was evicted mid-run: The node was low on resource: memory.")
    # The head still there and never restarted: the job failed for another reason.
    assert head_pod_loss(failed_rayjob(), [pod(HEAD), WORKER], soon) is None


def test_head_pod_loss_is_not_claimed_once_kuberay_may_have_torn_the_cluster_down() -> None:
    from forge_replay.controller.head_pod import head_pod_loss

    # endTime + ttlSecondsAfterFinished is when KubeRay deletes the cluster itself (a margin for clock skew).
    assert head_pod_loss(failed_rayjob(ttl=300), [], ENDED + timedelta(seconds=294)) is not None
    assert head_pod_loss(failed_rayjob(ttl=300), [], ENDED + timedelta(seconds=296)) is None
    assert head_pod_loss(failed_rayjob(ttl=0), [], ENDED) is None
    kept = failed_rayjob(ttl=0)
    kept["spec"]["shutdownAfterJobFinishes"] = False  # never torn down by KubeRay
    assert head_pod_loss(kept, [], ENDED + timedelta(days=1)) is not None
    unended = failed_rayjob()
    del unended["status"]["endTime"]
    assert head_pod_loss(unended, [], ENDED) is None
    # No head recorded with the job's status (it never started on one): nothing to say.
    assert head_pod_loss(failed_rayjob(rayClusterStatus={}), [], ENDED) is None


def test_a_head_pod_deleted_mid_run_fails_the_job_saying_so_and_the_message_stays() -> None:
    progress = ProgressReport(completed=3, total=8)
    soon = ENDED + timedelta(seconds=2)
    status = status_from(job(_launched_running()), failed_rayjob(), None, progress, ray_pods=[WORKER], now=soon)
    ready, stalled, cluster = (cond(status, k) for k in ("Ready", "Stalled", "ClusterReady"))
    assert status["phase"] == "Failed"
    assert ready["reason"] == stalled["reason"] == cluster["reason"] == "HeadPodLost"
    message = status["message"]
    assert message.startswith(f"the Ray head pod {HEAD} was deleted mid-run, after 3 of 8 rollouts")
    assert "BackoffLimitExceeded" in message  # KubeRay's own words stay, as the consequence
    assert "delete and re-create the ForgeReplayJob" in message
    assert "submit the entrypoint" not in message  # not the hint about a submission that never worked
    assert ready["message"] == message == stalled["message"]
    # Later reconciles (KubeRay deleted the cluster's pods after the TTL) keep what was seen.
    later = status_from(job(status), failed_rayjob(), None, progress, ray_pods=None, now=LATER)
    assert later["message"] == message and cond(later, "Ready")["reason"] == "HeadPodLost"


def test_a_failed_job_whose_head_is_still_there_keeps_kuberays_reason() -> None:
    soon = ENDED + timedelta(seconds=2)
    status = status_from(job(_launched_running()), failed_rayjob(), None, ProgressReport(completed=3, total=8),
                         ray_pods=[pod(HEAD), WORKER], now=soon)
    assert cond(status, "Ready")["reason"] == "SubmissionFailed"
    assert "BackoffLimitExceeded" in status["message"] and "head pod" not in status["message"].split(".")[0]
