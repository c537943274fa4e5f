"""Failures that cannot fix themselves end the job (issue 33): the reasons, from pods shaped as the kubelet reports
them, the start deadline, what status_from makes of them, and the teardown (controller/stuck.py).

The pod status shapes, as the kubelet writes them (k8s.io/api v0.37 core/v1 types.go):
- a failed pull: ``containerStatuses[i].state.waiting`` with reason ``ErrImagePull`` right after a pull failed, then
  ``ImagePullBackOff`` while the kubelet waits to retry (pkg/kubelet/images/types.go ErrImagePull /
  ErrImagePullBackOff), the pod Pending since ``status.startTime`` (PodStatus.StartTime: "acknowledged by the
  Kubelet ... before the Kubelet pulled the container image(s)");
- a failed init container: ``initContainerStatuses[i].state.terminated`` with ``exitCode`` 1 and reason ``Error``
  (kubectl prints ``Init:Error``, pkg/printers/internalversion/printers.go printPod), then once restarted
  ``state.waiting.reason: CrashLoopBackOff`` with the failure in ``lastState.terminated`` (``Init:CrashLoopBackOff``);
  the pod's containers wait with reason ``PodInitializing``;
- a crash loop: ``containerStatuses[i].state.waiting.reason: CrashLoopBackOff`` (pkg/kubelet/container/sync_result.go
  ErrCrashLoopBackOff), ``restartCount`` N, the last run in ``lastState.terminated``;
- unschedulable: condition ``PodScheduled`` False, reason ``Unschedulable`` (core/v1 PodReasonUnschedulable), no
  startTime.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from forge_replay.api import ForgeReplayJobStatus
from forge_replay.controller import stuck
from forge_replay.controller.status import status_from
from tests.unit.test_argocd_health import run_health
from tests.unit.test_status import cond, job, rayjob

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=timezone.utc)
BOUNDS = stuck.Bounds(image_pull_seconds=300, crash_loop_restarts=3)
CLUSTER = "memtest-raycluster-x7k2p"
HEAD = f"{CLUSTER}-head-abcde"
WORKER = f"{CLUSTER}-trainer-worker-q8r9s"


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name=HEAD, started=600, containers=(), init=(), conditions=(), phase="Pending"):
    status = {"phase": phase, "conditions": list(conditions), "containerStatuses": list(containers)}
    if started is not None:
        status["startTime"] = ago(started)
    if init:
        status["initContainerStatuses"] = list(init)
    return {"metadata": {"name": name, "creationTimestamp": ago((started or 0) + 1)}, "status": status}


def waiting(reason, message="", name="ray-head", restarts=0, last=None, image="registry.example.com/runtime:9.9"):
    body = {"name": name, "image": image, "ready": False, "restartCount": restarts,
            "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last is not None:
        body["lastState"] = {"terminated": last}
    return body


def terminated(exit_code, reason="Error", name="forge-lib", message=""):
    return {"name": name, "image": "ghcr.io/forge-replay/runtime:0.1.0", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message,
                                     "startedAt": ago(20), "finishedAt": ago(19)}}}


PULL = "rpc error: code = NotFound desc = failed to pull and unpack image \"registry.example.com/runtime:9.9\": not found"
CRASH = {"exitCode": 127, "reason": "Error", "startedAt": ago(40), "finishedAt": ago(39)}
UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}

CASES = [
    # (case, pods, reason or None, words the message must hold)
    ("ImagePullBackOff past the bound", [pod(started=301, containers=[waiting("ImagePullBackOff", PULL)])],
     "ImagePullFailed", [HEAD, "registry.example.com/runtime:9.9", "ImagePullBackOff", "spec.image"]),
    ("ErrImagePull past the bound", [pod(started=900, containers=[waiting("ErrImagePull", PULL)])],
     "ImagePullFailed", [HEAD, "ErrImagePull", "imagePullSecrets"]),
    ("ImagePullBackOff within the bound", [pod(started=299, containers=[waiting("ImagePullBackOff", PULL)])],
     None, []),
    ("an init container's image", [pod(started=400, init=[waiting("ImagePullBackOff", PULL, name="forge-lib")],
                                       containers=[waiting("PodInitializing")])],
     "ImagePullFailed", ["forge-lib", HEAD]),
    ("a slow pull is no failure", [pod(started=3600, containers=[waiting("ContainerCreating")])], None, []),
    ("Init:Error", [pod(name=WORKER, started=30, init=[terminated(1, message="python3: not found")],
                        containers=[waiting("PodInitializing", name="ray-worker")])],
     "InitContainerFailed", [WORKER, "forge-lib", "exit code 1", "python3: not found", "kubectl logs"]),
    ("Init:CrashLoopBackOff", [pod(name=WORKER, started=60, init=[
        waiting("CrashLoopBackOff", name="wait-gcs-ready", restarts=2,
                last={"exitCode": 128, "reason": "StartError", "message": "exec: \"/bin/bash\": not found"})])],
     "InitContainerFailed", ["wait-gcs-ready", "exit code 128", "StartError", "/bin/bash"]),
    ("an init container done", [pod(started=30, init=[terminated(0, reason="Completed")],
                                    containers=[waiting("ContainerCreating")])], None, []),
    ("CrashLoopBackOff at the bound", [pod(started=200, containers=[waiting("CrashLoopBackOff", restarts=3, last=CRASH)],
                                           phase="Running")],
     "CrashLoop", [HEAD, "3 restarts", "exit code 127", "--previous"]),
    ("CrashLoopBackOff before the bound", [pod(started=200, phase="Running",
                                               containers=[waiting("CrashLoopBackOff", restarts=2, last=CRASH)])],
     None, []),
    ("unschedulable: the start deadline's", [pod(started=None, conditions=[UNSCHEDULABLE])], None, []),
    ("a pod being deleted", [{**pod(started=900, containers=[waiting("ImagePullBackOff")]),
                              "metadata": {"name": HEAD, "deletionTimestamp": ago(1)}}], None, []),
]


@pytest.mark.parametrize(("case", "pods", "reason", "words"), CASES, ids=[c[0] for c in CASES])
def test_each_failure_that_cannot_fix_itself_has_its_reason_naming_the_pod(case, pods, reason, words) -> None:
    found = stuck.pod_failure(pods, NOW, BOUNDS)
    assert (found.reason if found else None) == reason, case
    for word in words:
        assert word in found.message, (word, found.message)
    if found is not None:
        assert "What to do:" in found.message and found.cluster in found.message


def test_the_bounds_are_the_operators_settings() -> None:
    slow = [pod(started=120, containers=[waiting("ImagePullBackOff")])]
    assert stuck.pod_failure(slow, NOW, stuck.Bounds(image_pull_seconds=60)).reason == "ImagePullFailed"
    assert stuck.pod_failure(slow, NOW, stuck.Bounds(image_pull_seconds=600)) is None
    looping = [pod(containers=[waiting("CrashLoopBackOff", restarts=1, last=CRASH)], phase="Running")]
    assert stuck.pod_failure(looping, NOW, stuck.Bounds(crash_loop_restarts=1)).reason == "CrashLoop"


PULLING = [pod(started=400, containers=[waiting("ImagePullBackOff", PULL)])]


def launching(previous=None, **spec):
    return job(previous, **spec)


def test_a_launch_that_cannot_pull_fails_the_job_then_stays_failed_without_its_rayjob() -> None:
    initializing = rayjob("Initializing", rayClusterName=CLUSTER)
    status = status_from(launching(), initializing, None, None, launch_pods=PULLING, bounds=BOUNDS, now=NOW)
    assert status["phase"] == "Failed" and status["completionTime"] == "2026-11-29T12:00:00Z"
    for kind in ("Ready", "Stalled", "ClusterReady"):
        assert cond(status, kind)["reason"] == "ImagePullFailed", kind
    assert (cond(status, "Stalled")["status"], cond(status, "Reconciling")["status"]) == ("True", "False")
    assert HEAD in status["message"] and status["outcome"] == "failed"
    # KubeRay ends the Ray job that never started (DeadlineExceeded) and deletes its cluster at once
    initializing["spec"].update(shutdownAfterJobFinishes=True, ttlSecondsAfterFinished=300)
    assert stuck.teardown(status, initializing) == {"activeDeadlineSeconds": 1, "ttlSecondsAfterFinished": 0}
    patched = {**initializing, "spec": {**initializing["spec"], **stuck.END_AT_ONCE}}
    assert stuck.teardown(status, patched) is None  # patched once, not on every reconcile
    assert stuck.teardown(status, {**initializing, "metadata": {"deletionTimestamp": ago(1)}}) is None

    # KubeRay fails the RayJob (DeadlineExceeded), deletes its pods; the RayJob may go too: the reason and message stay.
    previous = {**status, "rayJobName": "memtest"}
    later = NOW + timedelta(minutes=1)
    deadline = rayjob("Failed", reason="DeadlineExceeded", rayClusterName=CLUSTER, endTime=ago(-30),
                      message="The RayJob has passed the activeDeadlineSeconds.")
    for rj in (initializing, deadline, None):
        again = status_from(launching(previous), rj, None, None, launch_pods=[], bounds=BOUNDS, now=later)
        assert (again["phase"], cond(again, "Ready")["reason"]) == ("Failed", "ImagePullFailed")
        assert again["message"] == status["message"] and again["completionTime"] == status["completionTime"]
    assert stuck.ended(ForgeReplayJobStatus.model_validate(previous).model_dump(by_alias=True, exclude_none=True))


def test_within_its_bound_the_pod_only_explains_the_wait() -> None:
    young = [pod(started=10, containers=[waiting("ImagePullBackOff", PULL)])]
    note = stuck.verify_pod_note(young, failed=False)
    status = status_from(launching(), rayjob("Initializing", rayClusterName=CLUSTER), None, None, launch_note=note,
                         launch_pods=young, bounds=BOUNDS, now=NOW)
    assert status["phase"] == "Launching" and cond(status, "ClusterReady")["reason"] == "PodsNotReady"
    assert stuck.teardown(status, {**rayjob("Initializing"), "spec": {"ttlSecondsAfterFinished": 300}}) is None
    assert stuck.waiting_event({}, status) == ("PodsNotReady", note)
    # ErrImagePull and ImagePullBackOff alternate as the kubelet backs off: one cause, one event
    flip = status_from(launching(), rayjob("Initializing", rayClusterName=CLUSTER), None, None,
                       launch_note=note.replace("ImagePullBackOff", "ErrImagePull"), now=NOW)
    assert stuck.waiting_event(status, flip) is None


CREATED = {"creationTimestamp": ago(700)}


def deadline_job(seconds=600, previous=None, **spec):
    parsed = job(previous, scheduling={"startDeadlineSeconds": seconds, **spec.pop("scheduling", {})}, **spec)
    meta = parsed.metadata.model_copy(update=CREATED)
    return parsed.model_copy(update={"metadata": meta})


@pytest.mark.parametrize(("seconds", "phase"), [(600, "Failed"), (800, "Launching")])
def test_start_deadline_from_creation_without_a_queue_with_the_unschedulable_pods_words(seconds, phase) -> None:
    pods = [pod(started=None, conditions=[UNSCHEDULABLE])]
    note = stuck.verify_pod_note(pods, failed=False)
    status = status_from(deadline_job(seconds), rayjob("Initializing", rayClusterName=CLUSTER), None, None,
                         launch_note=note, launch_pods=pods, bounds=BOUNDS, now=NOW)
    assert status["phase"] == phase
    if phase == "Failed":
        assert cond(status, "Ready")["reason"] == "StartDeadlineExceeded"
        assert "startDeadlineSeconds (600 s) of its creation" in status["message"]
        assert "Insufficient nvidia.com/gpu" in status["message"] and HEAD in status["message"]


def test_start_deadline_counts_the_verify_job_and_stops_a_launch_after_it() -> None:
    running = {"metadata": {"name": "memtest-verify"}, "status": {"active": 1}}
    status = status_from(deadline_job(replay__verify=True), None, running, None, now=NOW)
    assert (status["phase"], cond(status, "Ready")["reason"]) == ("Failed", "StartDeadlineExceeded")
    assert "it is Verifying" in status["message"]
    assert stuck.ended(status) and stuck.teardown(status, None) is None  # nothing launched, nothing to end


def test_with_a_queue_the_deadline_counts_from_admission_not_from_the_wait_in_the_queue() -> None:
    queued = rayjob("Suspended", suspend=True)
    spec = {"scheduling": {"queueName": "h200"}}
    status = status_from(deadline_job(**spec), queued, None, None, now=NOW)
    assert status["phase"] == "Pending" and status["admissionTime"] is None  # 700 s in the queue: no deadline
    admitted = rayjob("Initializing", rayClusterName=CLUSTER)
    status = status_from(deadline_job(**spec), admitted, None, None, now=NOW)
    assert status["phase"] == "Launching" and status["admissionTime"] == "2026-11-29T12:00:00Z"
    previous = {"rayJobName": "memtest", "phase": "Launching", "admissionTime": status["admissionTime"]}
    later = status_from(deadline_job(previous=previous, **spec), admitted, None, None, now=NOW + timedelta(seconds=599))
    assert later["phase"] == "Launching" and later["admissionTime"] == status["admissionTime"]
    late = status_from(deadline_job(previous=previous, **spec), admitted, None, None, now=NOW + timedelta(seconds=600))
    assert cond(late, "Ready")["reason"] == "StartDeadlineExceeded" and "admission by Kueue" in late["message"]
    # Kueue preempts it back into the queue: the wait there does not count, the next admission starts the clock
    requeued = status_from(deadline_job(previous=previous, **spec), queued, None, None, now=NOW + timedelta(hours=1))
    assert requeued["phase"] == "Pending" and requeued["admissionTime"] is None


def test_a_running_job_has_no_start_deadline_and_its_first_step_is_recorded() -> None:
    from forge_replay.api.progress_report import ProgressReport

    progress = ProgressReport(completed=1, total=8, updated_at="2026-11-29T11:59:30Z")
    status = status_from(deadline_job(1), rayjob("Running", "RUNNING", rayClusterName=CLUSTER), None, progress, now=NOW)
    assert status["phase"] == "Running" and status["firstStepTime"] == "2026-11-29T11:59:30Z"
    assert status["admissionTime"] == "2026-11-29T11:58:00Z"  # no queue: its RayJob's creation


def test_argocd_reads_each_reason_degraded_with_its_message() -> None:
    status = status_from(launching(), rayjob("Initializing", rayClusterName=CLUSTER), None, None,
                         launch_pods=PULLING, bounds=BOUNDS, now=NOW)
    obj = {"metadata": {"name": "memtest", "generation": 3}, "status": status}
    assert run_health(obj) == {"status": "Degraded", "message": status["message"]}
