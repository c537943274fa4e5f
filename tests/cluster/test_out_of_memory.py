"""A Ray pod OOMKilled, on the control plane (issue 31): the job ends Failed / OutOfMemory naming the pod, with a
Warning event carrying the record's line, its RayCluster deleted at once by KubeRay (the operator sets the RayJob's
TTL to 0), and kstatus and the Argo CD health Lua read it Failed / Degraded.

KubeRay and KWOK run the RayJob's cluster on fake nodes; what a real kubelet and driver would add is written as they
write it, as the HeadPodLost test does (tests/cluster/test_operator.py): the trainer pod's container status once
the kernel killed it for memory and the kubelet restarted it (``lastState.terminated`` reason ``OOMKilled``, exit
code 137: k8s.io/api core/v1 ContainerStateTerminated), the runtime's result (a rank's actor died: nothing about
memory), and the RayJob failed as KubeRay v1.5.0 leaves it (``AppFailed``)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from forge_replay.api.outcome import OutOfMemory
from forge_replay.controller.render import quantity_bytes
from tests.cluster.operator_harness import apply, job_doc, wait_for
from tests.cluster.test_kstatus import kstatus
from tests.cluster.test_operator import _bound_claim, api, operator, operator_kubeconfig  # noqa: F401
from tests.unit.test_argocd_health import run_health

pytestmark = pytest.mark.cluster


def _trainer_pod(api, namespace: str, cluster: str):
    pods = api.kube.list("v1", "Pod", namespace, f"ray.io/cluster={cluster},forgereplay.io/role=trainer")
    return next((p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                 and (p.get("spec") or {}).get("nodeName")), None)


def test_a_ray_pod_oomkilled_fails_the_job_out_of_memory_and_tears_its_cluster_down(control_plane, operator, api,
                                                                                     namespace) -> None:
    _bound_claim(control_plane, namespace, "rollout-dumps")
    # A TTL of an hour: only the operator's teardown can delete the cluster within this test.
    apply(control_plane, job_doc("oom", namespace, ttlSecondsAfterFinished=3600), claims=False)
    rayjob = wait_for("KubeRay's RayCluster for the RayJob", lambda: (r := api.rayjob(namespace, "oom"))
                      and (r.get("status") or {}).get("rayClusterName") and r, timeout=120)
    cluster = rayjob["status"]["rayClusterName"]
    pod = wait_for("the trainer pod running on a KWOK node", lambda: _trainer_pod(api, namespace, cluster),
                   timeout=180)
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    container = pod["spec"]["containers"][0]
    killed_at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    oom_killed = {"exitCode": 137, "reason": "OOMKilled", "startedAt": killed_at, "finishedAt": killed_at,
                  "containerID": "containerd://0f3a"}
    api.kube.merge_patch("v1", "Pod", namespace, name, {"status": {"containerStatuses": [{
        "name": container["name"], "image": container["image"], "imageID": "", "ready": True, "started": True,
        "restartCount": 1, "state": {"running": {"startedAt": killed_at}}, "lastState": {"terminated": oom_killed},
    }]}}, status=True)
    # The runtime saw a rank's actor die (Ray's ActorDiedError), after one of four rollouts.
    result = {"phase": "Failed", "outcome": "failed", "finishedAt": killed_at,
              "message": "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."}
    control_plane.kubectl("patch", "configmap", "oom-progress", "-n", namespace, "--type=merge", "-p", json.dumps(
        {"data": {"progress.json": json.dumps({"completed": 1, "total": 4, "result": result})}}))
    api.patch_rayjob_status(namespace, "oom", {
        "jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "rayClusterName": cluster,
        "message": "Job entrypoint command failed with exit code 1", "endTime": killed_at})

    status = wait_for("phase Failed", lambda: (s := api.status(namespace, "oom")).get("phase") == "Failed" and s)
    ready = api.condition(namespace, "oom", "Ready")
    assert (ready["reason"], api.condition(namespace, "oom", "Stalled")["reason"]) == ("OutOfMemory", "OutOfMemory")
    assert status["outcome"] == "outOfMemory"
    record = status["outOfMemory"]
    assert record["signal"] == "containerOOMKilled"
    assert record["where"] == {"component": "trainer", "pod": name, "node": node}
    assert record["when"] == {"rollout": 1, "at": killed_at}
    assert record["howMuch"] == {"limitBytes": int(quantity_bytes(container["resources"]["limits"]["memory"]))}
    line = OutOfMemory.model_validate(record).line()
    assert status["message"].startswith(f"{line}, after 1 of 4 rollouts") and name in line
    events = json.loads(control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                              "involvedObject.name=oom", "-o", "json").stdout)["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "OutOfMemory" and e["message"] == line for e in events)

    # Nothing held: KubeRay deletes the Ray cluster at once (the RayJob's TTL set to 0), not in an hour.
    assert wait_for("the RayJob's TTL set to 0",
                    lambda: api.rayjob(namespace, "oom")["spec"]["ttlSecondsAfterFinished"] == 0)
    wait_for("the RayCluster deleted", lambda: control_plane.kubectl(
        "get", "raycluster", cluster, "-n", namespace, "--ignore-not-found", "-o", "name").stdout.strip() == "",
        timeout=90)
    after = api.status(namespace, "oom")  # the record outlives the pods
    assert (after["phase"], after["outOfMemory"]) == ("Failed", record)

    obj = json.loads(control_plane.kubectl("get", "forgereplayjob", "oom", "-n", namespace, "-o", "json").stdout)
    (verdict,) = kstatus([obj])
    assert verdict["status"] == "Failed"
    health = run_health(obj)
    assert health["status"] == "Degraded" and health["message"].startswith(line)
    columns = control_plane.kubectl("get", "frj", "oom", "-n", namespace, "--no-headers").stdout.split()
    assert "outOfMemory" in columns and "OutOfMemory" in columns  # the Outcome and Reason columns
