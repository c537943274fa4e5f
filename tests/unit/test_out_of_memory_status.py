"""status.outcome and status.outOfMemory (issue 31): from what the runtime publishes (the progress ConfigMap's
result), from a Ray pod the kubelet reports OOMKilled, and spec.expect.outcome's inversion; what Argo CD's health
Lua and kstatus read of it.

The pods are shaped as the kubelet reports a container killed for memory: ``state.terminated`` (or, once restarted,
``lastState.terminated``) with reason ``OOMKilled`` and exit code 137 (k8s.io/api v0.37.2 core/v1 types.go:3496-3517
ContainerStateTerminated, :3547 lastState; the reason is containerd's ``oomExitReason``, pkg/cri/server/events.go
``TaskOOM``). The runtime's reports go through the runtime's own serialization (progress_publish.progress_json).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from forge_replay.api import ForgeReplayJobStatus, parse_job
from forge_replay.api.outcome import OutOfMemory
from forge_replay.api.progress_report import ProgressReport, RunResult
from forge_replay.controller.out_of_memory import needs_teardown, oom_killed
from forge_replay.controller.status import status_from
from forge_replay.runtime.progress_publish import progress_json
from tests.unit.spec_factory import debug_job

CLUSTER = "mem-raycluster-x7k2p"
HEAD = f"{CLUSTER}-head-abcde"
WORKER = f"{CLUSTER}-trainer-worker-q8r9s"
ENGINE = f"{CLUSTER}-rollout-worker-z1z2z"
ENDED = datetime(2026, 12, 2, 12, 0, 0, tzinfo=timezone.utc)
SOON = ENDED + timedelta(seconds=2)
LAUNCHED = {"rayJobName": "mem", "phase": "Running", "rollouts": {"completed": 2, "total": 4}}

CUDA_OOM = OutOfMemory.model_validate({
    "signal": "cudaAllocator", "where": {"component": "trainer", "rank": 3, "device": "cuda:3", "node": "gpu-7"},
    "when": {"rollout": 2, "phase": "backward", "at": "2026-12-02T11:59:40Z"},
    "how_much": {"requested_bytes": 2 * 2**30, "allocated_bytes": 130 * 2**30, "reserved_bytes": 138 * 2**30,
                 "device_total_bytes": 140 * 2**30},
    "message": "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 139.81 GiB of which "
               "1.06 GiB is free."})
RAY_MONITOR_OOM = OutOfMemory.model_validate({
    "signal": "rayMemoryMonitor", "where": {"component": "trainer", "rank": 0, "pod": WORKER, "node": "cpu-2",
                                            "pid": 10883},
    "when": {"rollout": 1, "phase": "forward"},
    # ray.exceptions.OutOfMemoryError's message at Ray 2.60.0 (/tmp/issue31/ray_memmon.out), shortened
    "message": "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP 10.244.0.7, "
               "ID 5f1c) was 15.24GB used / 16.00GB limit (0.952500)"})


def job(expect=None, previous=LAUNCHED, **spec):
    doc = debug_job(metadata={"name": "mem", "namespace": "ml", "uid": "u-1", "generation": 1},
                    spec__replay__numRollouts=4, spec__expect=expect, **spec)
    parsed = parse_job(doc)
    return parsed.model_copy(update={"status": ForgeReplayJobStatus.model_validate(previous) if previous else None})


def rayjob(deployment="Failed", job_status="FAILED", ttl=300, **status):
    """A RayJob as KubeRay v1.5.0 leaves a Ray job whose driver exited non-zero (AppFailed), or one still running."""
    body = {"metadata": {"name": "mem", "namespace": "ml", "creationTimestamp": "2026-12-02T11:50:00Z"},
            "spec": {"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": ttl},
            "status": {"jobDeploymentStatus": deployment, "jobStatus": job_status, "rayClusterName": CLUSTER,
                       "rayClusterStatus": {"head": {"podName": HEAD}, "state": "ready"}, **status}}
    if deployment in ("Failed", "Complete"):
        body["status"].setdefault("endTime", "2026-12-02T12:00:00Z")
    if deployment == "Failed":
        body["status"].setdefault("reason", "AppFailed")
        body["status"].setdefault("message", "Job entrypoint command failed with exit code 1")
    return body


def published(completed=2, total=4, **result) -> ProgressReport:
    """What the runtime publishes (progress_publish.progress_json), as the operator reads it back."""
    report = ProgressReport(completed=completed, total=total,
                            result=RunResult(**{"finished_at": "2026-12-02T11:59:45Z", **result}) if result else None)
    return ProgressReport.model_validate_json(progress_json(report))


def ray_pod(name, role, node, *, state=None, last=None, restarts=0, limit="16Gi", container="ray-worker"):
    """A Ray pod as the API server returns it: the container running, or terminated (``state``), or restarted after
    a termination (``last``)."""
    status = {"name": container, "restartCount": restarts, "state": state or {"running": {}}}
    if last:
        status["lastState"] = last
    return {"metadata": {"name": name, "labels": {"ray.io/cluster": CLUSTER, "forgereplay.io/role": role}},
            "spec": {"nodeName": node, "containers": [{"name": container,
                                                       "resources": {"limits": {"memory": limit}}}]},
            "status": {"phase": "Running", "containerStatuses": [status]}}


HEAD_POD = ray_pod(HEAD, "head", "cpu-1", container="ray-head")


def terminated(reason="OOMKilled", exit_code=137, at="2026-12-02T11:59:50Z"):
    return {"terminated": {"reason": reason, "exitCode": exit_code, "startedAt": "2026-12-02T11:50:30Z",
                           "finishedAt": at, "containerID": "containerd://0f3a"}}


def cond(status, kind):
    return next((c for c in status["conditions"] if c["type"] == kind), None)


# ----------------------------------------------------------------------------- the runtime's outcome


@pytest.mark.parametrize(("rj", "result", "phase", "reason", "outcome"), [
    (rayjob("Complete", "SUCCEEDED"), {"phase": "Succeeded", "outcome": "fits"}, "Succeeded", "Succeeded", "fits"),
    (rayjob(), {"phase": "Failed", "message": "ValueError: boom", "outcome": "failed"}, "Failed", "AppFailed",
     "failed"),
    (rayjob(), {"phase": "Failed", "outcome": "outOfMemory", "out_of_memory": CUDA_OOM}, "Failed", "OutOfMemory",
     "outOfMemory"),
    # Published while KubeRay still says Running (the driver is on its way out): the job fails at once.
    (rayjob("Running", "RUNNING"), {"phase": "Failed", "outcome": "outOfMemory", "out_of_memory": CUDA_OOM},
     "Failed", "OutOfMemory", "outOfMemory"),
    # Ray's memory monitor in a pod, as the runtime recorded it: shown as it is.
    (rayjob(), {"phase": "Failed", "outcome": "outOfMemory", "out_of_memory": RAY_MONITOR_OOM}, "Failed",
     "OutOfMemory", "outOfMemory"),
    # The RayJob is gone (KubeRay's cleanup): the runtime's own record.
    (None, {"phase": "Failed", "outcome": "outOfMemory", "out_of_memory": CUDA_OOM}, "Failed", "OutOfMemory",
     "outOfMemory"),
    # A runtime that says nothing of the outcome: the RayJob's end decides fits or failed.
    (rayjob("Complete", "SUCCEEDED"), None, "Succeeded", "Succeeded", "fits"),
    (rayjob(), None, "Failed", "AppFailed", "failed"),
    (rayjob("Running", "RUNNING"), None, "Running", "Running", None),
], ids=["fits", "failed", "oom", "oom-before-kuberay", "ray-monitor", "rayjob-gone", "fits-unsaid", "failed-unsaid",
        "running"])
def test_the_runtimes_outcome_reaches_the_status(rj, result, phase, reason, outcome) -> None:
    progress = published(**(result or {}))
    status = status_from(job(), rj, None, progress, ray_pods=[HEAD_POD], now=SOON)
    assert (status["phase"], cond(status, "Ready")["reason"], status["outcome"]) == (phase, reason, outcome)
    record = (result or {}).get("out_of_memory")
    if record is None:
        assert status["outOfMemory"] is None
        return
    assert status["outOfMemory"] == record.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert ForgeReplayJobStatus.model_validate(status).out_of_memory == record  # the status schema keeps it all
    assert status["message"].startswith(f"{record.line()}, after 2 of 4 rollouts")
    assert (cond(status, "Stalled")["status"], cond(status, "Stalled")["reason"]) == ("True", "OutOfMemory")
    assert cond(status, "Ready")["status"] == "False"
    assert status["completionTime"]


def test_a_cuda_out_of_memory_says_rank_rollout_phase_and_bytes() -> None:
    status = status_from(job(), rayjob(), None, published(outcome="outOfMemory", phase="Failed",
                                                             out_of_memory=CUDA_OOM), now=SOON)
    assert status["message"].startswith("out of memory (cudaAllocator): rank 3 on gpu-7, rollout 2 backward; "
                                        "requested 2.00 GiB, allocated 130.00 GiB, reserved 138.00 GiB")
    assert status["outOfMemory"]["howMuch"]["requestedBytes"] == 2 * 2**30


# ----------------------------------------------------------------------------- a Ray pod OOMKilled


def test_oomkilled_containers_are_read_from_state_and_last_state_first_killed_first() -> None:
    pods = [ray_pod(HEAD, "head", "cpu-1", container="ray-head", limit="8Gi"),
            ray_pod(WORKER, "trainer", "gpu-7", restarts=1, last=terminated(at="2026-12-02T11:59:50Z")),
            ray_pod(ENGINE, "rollout", "gpu-8", state=terminated(at="2026-12-02T11:59:30Z")),
            ray_pod(f"{CLUSTER}-trainer-worker-aaaaa", "trainer", "gpu-9", restarts=2,
                    last=terminated("Error", 1)),
            ray_pod(f"{CLUSTER}-trainer-worker-bbbbb", "trainer", "gpu-6", state=terminated("Completed", 0))]
    kills = oom_killed(pods)
    assert [(k.pod, k.node, k.container, k.role, k.exit_code, k.restarts) for k in kills] == [
        (ENGINE, "gpu-8", "ray-worker", "rollout", 137, 0), (WORKER, "gpu-7", "ray-worker", "trainer", 137, 1)]


@pytest.mark.parametrize(("pods", "component", "pod", "node", "limit"), [
    ([ray_pod(HEAD, "head", "cpu-1"), ray_pod(WORKER, "trainer", "gpu-7", restarts=1, last=terminated())],
     "trainer", WORKER, "gpu-7", 16 * 2**30),
    ([ray_pod(HEAD, "head", "cpu-1", container="ray-head", limit="8G", state=terminated())], "head", HEAD, "cpu-1",
     8 * 10**9),
    ([ray_pod(HEAD, "head", "cpu-1"), ray_pod(ENGINE, "rollout", "gpu-8", state=terminated())], "engine", ENGINE,
     "gpu-8", 16 * 2**30),
], ids=["trainer-restarted", "head-terminated", "engine-terminated"])
def test_a_ray_pod_oomkilled_fails_the_job_out_of_memory_naming_it(pods, component, pod, node, limit) -> None:
    # What the runtime saw: a rank's actor died (Ray's ActorDiedError), nothing about memory.
    progress = published(phase="Failed", outcome="failed", message="ray.exceptions.ActorDiedError: The actor died "
                         "unexpectedly before finishing this task.")
    status = status_from(job(), rayjob(), None, progress, ray_pods=pods, now=SOON)
    assert (status["phase"], status["outcome"], cond(status, "Ready")["reason"]) == (
        "Failed", "outOfMemory", "OutOfMemory")
    record = status["outOfMemory"]
    assert record["signal"] == "containerOOMKilled"
    assert record["where"] == {"component": component, "pod": pod, "node": node}
    assert record["when"] == {"rollout": 2, "at": "2026-12-02T11:59:50Z"}  # rollouts 0 and 1 done: 2 was training
    assert record["howMuch"] == {"limitBytes": limit}
    assert "terminated OOMKilled, exit code 137, at 2026-12-02T11:59:50Z" in record["message"]
    assert pod in status["message"] and "after 2 of 4 rollouts" in status["message"]
    assert cond(status, "Stalled")["reason"] == "OutOfMemory"
    # Later reconciles (KubeRay deleted the pods) keep what was seen.
    later = status_from(job(previous=status), rayjob(), None, progress, ray_pods=None, now=SOON + timedelta(hours=1))
    assert (later["outOfMemory"], later["message"], later["outcome"]) == (record, status["message"], "outOfMemory")


def test_the_runtimes_own_record_wins_over_a_pods_reason() -> None:
    pods = [ray_pod(WORKER, "trainer", "gpu-7", restarts=1, last=terminated())]
    progress = published(phase="Failed", outcome="outOfMemory", out_of_memory=RAY_MONITOR_OOM)
    status = status_from(job(), rayjob(), None, progress, ray_pods=pods, now=SOON)
    assert status["outOfMemory"]["signal"] == "rayMemoryMonitor"


def test_a_head_pod_oomkilled_is_out_of_memory_not_just_a_lost_head() -> None:
    head = ray_pod(HEAD, "head", "cpu-1", container="ray-head", restarts=1, last=terminated())
    status = status_from(job(), rayjob(), None, published(), ray_pods=[head], now=SOON)
    assert cond(status, "Ready")["reason"] == "OutOfMemory"
    assert status["outOfMemory"]["where"]["component"] == "head"
    assert status["message"].startswith(f"out of memory (containerOOMKilled): the Ray head (pod {HEAD} on cpu-1)")


def test_a_failure_without_an_oomkilled_pod_keeps_its_reason() -> None:
    pods = [ray_pod(HEAD, "head", "cpu-1"), ray_pod(WORKER, "trainer", "gpu-7", restarts=1,
                                                     last=terminated("Error", 1))]
    status = status_from(job(), rayjob(), None, published(phase="Failed", outcome="failed"), ray_pods=pods, now=SOON)
    assert (cond(status, "Ready")["reason"], status["outcome"], status["outOfMemory"]) == (
        "AppFailed", "failed", None)


# ----------------------------------------------------------------------------- spec.expect.outcome


OUTCOME_MET = {"name": "outcome", "passed": True, "message": "the run's outcome is outOfMemory, as expected"}
OUTCOME_MISSED = {"name": "outcome", "passed": False,
                  "message": "the run's outcome is fits; spec.expect.outcome is outOfMemory"}
FALLBACKS_MET = {"name": "maxFallbacks", "passed": True, "observed": 0, "limit": 0, "message": "0 <= 0"}


@pytest.mark.parametrize(("expect", "rj", "progress", "pods", "phase", "met", "names"), [
    # A pod OOMKilled the runtime could not see (no verdict of its own): the operator's check, passed.
    ({"outcome": "outOfMemory"}, rayjob(), published(phase="Failed", outcome="failed"),
     [ray_pod(WORKER, "trainer", "gpu-7", restarts=1, last=terminated())], "Succeeded", ("True", "ExpectationsMet"),
     ["outcome"]),
    # The runtime's own record and verdict (it exits 0 when the expected out-of-memory came).
    ({"outcome": "outOfMemory"}, rayjob("Complete", "SUCCEEDED"),
     published(phase="Succeeded", outcome="outOfMemory", out_of_memory=CUDA_OOM, expectations=[OUTCOME_MET]),
     [HEAD_POD],
     "Succeeded", ("True", "ExpectationsMet"), ["outcome"]),
    # The same, with the Ray job failed (the slime / miles script's own exit status): still met.
    ({"outcome": "outOfMemory"}, rayjob(),
     published(phase="Failed", outcome="outOfMemory", out_of_memory=CUDA_OOM, expectations=[OUTCOME_MET]), [HEAD_POD],
     "Succeeded", ("True", "ExpectationsMet"), ["outcome"]),
    # It fit: the job fails, its verdict says why.
    ({"outcome": "outOfMemory"}, rayjob(),
     published(completed=4, phase="Failed", outcome="fits", expectations=[OUTCOME_MISSED]), [HEAD_POD], "Failed",
     ("False", "ExpectationsNotMet"), ["outcome"]),
    # It fit, and the runtime's verdict lacks the check: the operator adds it.
    ({"outcome": "outOfMemory", "maxFallbacks": 0}, rayjob("Complete", "SUCCEEDED"),
     published(completed=4, phase="Succeeded", outcome="fits", expectations=[FALLBACKS_MET]), [HEAD_POD], "Failed",
     ("False", "ExpectationsNotMet"), ["maxFallbacks", "outcome"]),
    # Expected to fit, ran out of memory: OutOfMemory is the reason, the verdict says not met.
    ({"outcome": "fits"}, rayjob(), published(phase="Failed", outcome="outOfMemory", out_of_memory=CUDA_OOM),
     [HEAD_POD],
     "Failed", ("False", "ExpectationsNotMet"), ["outcome"]),
    # Failed for another reason: not judged, as before.
    ({"outcome": "outOfMemory"}, rayjob(), published(phase="Failed", outcome="failed"), [HEAD_POD], "Failed",
     ("Unknown", "NotChecked"), None),
], ids=["pod-oom-expected", "runtime-oom-expected", "runtime-oom-expected-script-failed", "fits-unexpected",
        "fits-check-added", "oom-expected-fits", "failed-not-judged"])
def test_spec_expect_outcome_inverts_the_verdict(expect, rj, progress, pods, phase, met, names) -> None:
    status = status_from(job(expect=expect), rj, None, progress, ray_pods=pods, now=SOON)
    assert status["phase"] == phase, status["message"]
    assert (cond(status, "ExpectationsMet")["status"], cond(status, "ExpectationsMet")["reason"]) == met
    assert (None if status["expectations"] is None else [e["name"] for e in status["expectations"]]) == names
    if phase == "Succeeded":
        assert status["message"].startswith("the run ran out of memory, as spec.expect.outcome expects: out of memory")
        assert cond(status, "Ready")["status"] == "True" and cond(status, "Stalled")["status"] == "False"
    if expect == {"outcome": "fits"}:
        assert cond(status, "Ready")["reason"] == "OutOfMemory"


def test_an_expected_out_of_memory_waits_for_the_ray_job_to_end() -> None:
    progress = published(phase="Succeeded", outcome="outOfMemory", out_of_memory=CUDA_OOM, expectations=[OUTCOME_MET])
    status = status_from(job(expect={"outcome": "outOfMemory"}), rayjob("Running", "RUNNING"), None, progress,
                         now=SOON)
    assert status["phase"] == "Running"


# ----------------------------------------------------------------------------- the cluster torn down


def test_an_out_of_memory_tears_the_ray_cluster_down_at_once() -> None:
    oom = status_from(job(), rayjob(), None, published(phase="Failed", outcome="outOfMemory",
                                                       out_of_memory=CUDA_OOM), now=SOON)
    assert needs_teardown(oom, rayjob(ttl=300)) and not needs_teardown(oom, rayjob(ttl=0))
    assert not needs_teardown(oom, None)
    failed = status_from(job(), rayjob(), None, published(phase="Failed", outcome="failed"), now=SOON)
    assert not needs_teardown(failed, rayjob(ttl=300))  # the spec's TTL keeps it for its logs, as before


# ----------------------------------------------------------------------------- GitOps health


def as_object(status):
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": "mem", "namespace": "ml", "generation": 1},
            "status": {k: v for k, v in status.items() if v is not None}}


def _oom_and_expected():
    oom = status_from(job(), rayjob(), None, published(phase="Failed", outcome="outOfMemory",
                                                       out_of_memory=CUDA_OOM), now=SOON)
    expected = status_from(job(expect={"outcome": "outOfMemory"}), rayjob(), None,
                           published(phase="Failed", outcome="failed"),
                           ray_pods=[ray_pod(WORKER, "trainer", "gpu-7", restarts=1, last=terminated())], now=SOON)
    return as_object(oom), as_object(expected)


def test_argocd_reads_an_out_of_memory_degraded_and_an_expected_one_healthy() -> None:
    from tests.unit.test_argocd_health import run_health

    oom, expected = _oom_and_expected()
    health = run_health(oom)
    assert health["status"] == "Degraded"
    assert health["message"].startswith("out of memory (cudaAllocator): rank 3 on gpu-7, rollout 2 backward")
    health = run_health(expected)
    assert health["status"] == "Healthy"
    assert health["message"].endswith("(rollouts 2/4), outcome outOfMemory")


def test_kstatus_reads_an_out_of_memory_failed_and_an_expected_one_current() -> None:
    from tests.cluster import build

    tool = build.bin_dir() / "kstatus"
    if not tool.exists():
        pytest.skip(f"kstatus tool not built ({tool}); build it with python -m tests.cluster build")
    out = subprocess.run([str(tool)], input=json.dumps(list(_oom_and_expected())), capture_output=True, text=True,
                         check=True)
    assert [json.loads(line)["status"] for line in out.stdout.splitlines()] == ["Failed", "Current"]
