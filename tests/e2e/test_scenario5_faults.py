"""Scenario 5: faults in the middle of a run, in real pods.

- The Ray head pod deleted mid-run: the job ends Failed with reason HeadPodLost and a message saying what happened
  (that head pod deleted mid-run, the rollouts done, how to run it again), never stuck in Running.
- The operator pod killed mid-run: the Deployment replaces it, the new replica takes the Lease and adopts the
  RayJob (exactly one exists), and the job completes.

The runs replay 40 rollouts of 4 prompts x 4 samples x 272 tokens (a few seconds each on this machine), so
that "mid-run" is a window of a minute or more, not a race; it starts when the runtime's progress ConfigMap counts a
trained rollout.
"""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import OPERATOR_NAMESPACE, provide_volume, smoke_job, wait_for_phase, write_dumps

ROLLOUTS = 40


def long_job(plane, namespace: str) -> None:
    write_dumps(provide_volume(plane, namespace, "smoke-dumps", "ReadOnlyMany"), ROLLOUTS, prompts=4,
                response_len=256)
    provide_volume(plane, namespace, "results", "ReadWriteMany")
    job = smoke_job(namespace)
    job["spec"]["replay"]["numRollouts"] = ROLLOUTS
    # KubeRay deletes a finished job's cluster after this TTL: the head pod's loss is told before that (a busy 2-core
    # machine may delay the operator's reconcile by seconds; the default TTL is 300 s).
    job["spec"]["ttlSecondsAfterFinished"] = 60
    plane.kubectl("apply", "-f", "-", input=json.dumps(job))


def wait_until_training(plane, namespace: str, timeout: float = 600) -> None:
    """Until the runtime has patched its first trained rollout into the progress ConfigMap (read directly: the
    job's status follows it only at the operator's next reconcile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = plane.kubectl("get", "-n", namespace, "configmap", "smoke-cpu-progress", "-o", "json", check=False)
        progress = json.loads(found.stdout).get("data", {}).get("progress.json") if found.returncode == 0 else None
        if progress and json.loads(progress).get("completed", 0) >= 1:
            assert json.loads(progress)["completed"] < ROLLOUTS, "the run ended before the fault could be injected"
            return
        time.sleep(0.5)
    raise AssertionError("the runtime never reported a trained rollout")


def pods(plane, namespace: str, selector: str) -> list[dict]:
    return json.loads(plane.kubectl("get", "-n", namespace, "pods", "-l", selector, "-o", "json").stdout)["items"]


def test_the_head_pod_deleted_mid_run_fails_the_job_with_a_message(real_cluster, operator_release, e2e_namespace):
    long_job(real_cluster, e2e_namespace)
    wait_until_training(real_cluster, e2e_namespace)
    (head,) = pods(real_cluster, e2e_namespace, "ray.io/node-type=head")
    # At once, as a crashed node would: a graceful delete gives Ray 30 s, enough to finish the run.
    real_cluster.kubectl("delete", "-n", e2e_namespace, "pod", head["metadata"]["name"], "--grace-period=0",
                         "--force", "--wait=false")
    job = wait_for_phase(real_cluster, e2e_namespace, "smoke-cpu", {"Succeeded", "Failed", "Stalled"}, 600)
    status = job["status"]
    rayjob = real_cluster.kubectl("get", "-n", e2e_namespace, "rayjobs.ray.io", "smoke-cpu", "-o", "json").stdout
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    print(f"the job's Ready message after the head pod was deleted: {ready['message']}")
    completed = status["rollouts"]["completed"]
    assert 1 <= completed < ROLLOUTS, status
    assert ready["reason"] == "HeadPodLost", f"{json.dumps(status, indent=1)}\nthe RayJob: {rayjob}"
    assert ready["message"].startswith(f"the Ray head pod {head['metadata']['name']} was deleted mid-run, after "
                                       f"{completed} of {ROLLOUTS} rollouts"), ready["message"]
    assert "delete and re-create the ForgeReplayJob" in ready["message"]


def test_the_operator_killed_mid_run_is_replaced_and_adopts_the_job(real_cluster, operator_release, e2e_namespace):
    long_job(real_cluster, e2e_namespace)
    wait_until_training(real_cluster, e2e_namespace)
    selector = "app.kubernetes.io/name=forge-replay-operator"
    (old,) = pods(real_cluster, OPERATOR_NAMESPACE, selector)
    real_cluster.kubectl("delete", "-n", OPERATOR_NAMESPACE, "pod", old["metadata"]["name"], "--grace-period=0",
                         "--force", "--wait=false")
    job = wait_for_phase(real_cluster, e2e_namespace, "smoke-cpu", {"Succeeded", "Failed", "Stalled"}, 900)
    assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"], indent=1)
    assert job["status"]["rollouts"]["completed"] == ROLLOUTS
    (new,) = [p for p in pods(real_cluster, OPERATOR_NAMESPACE, selector)
              if not p["metadata"].get("deletionTimestamp")]
    assert new["metadata"]["name"] != old["metadata"]["name"]
    lease = json.loads(real_cluster.kubectl("get", "-n", OPERATOR_NAMESPACE, "lease", "forge-replay-operator",
                                            "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"].startswith(f"{new['metadata']['name']}_")
    rayjobs = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "rayjobs.ray.io", "-o", "json").stdout)
    assert len(rayjobs["items"]) == 1, [r["metadata"]["name"] for r in rayjobs["items"]]
