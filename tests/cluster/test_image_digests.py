"""The Ray pods' image digests on the control plane (issue 35, item 1): the operator, with the chart's ServiceAccount
token under the real RBAC authorizer (pods: list; configmaps: patch; its log must show no refused request), records
them into the progress ConfigMap once every Ray container reports its image,
where the runtime reads them with its one right (get on that ConfigMap).

KubeRay and KWOK run the RayJob's cluster on fake nodes, whose pods report no image; the kubelet's part is written
as it writes it (core/v1 ContainerStatus ``imageID``, containerd's ``<repository>@sha256:<hex>``), as the
out-of-memory test writes a container's last state."""

from __future__ import annotations

import json

import pytest

from forge_replay.api.images import IMAGES_KEY
from tests.cluster.operator_harness import apply, job_doc, wait_for
from tests.cluster.test_operator import _bound_claim, api  # noqa: F401
from tests.cluster.test_rbac import operator, operator_kubeconfig  # noqa: F401  (the chart's rules)

pytestmark = pytest.mark.cluster

DIGEST = "sha256:" + "3f1c2a9e" * 8


def _ray_pods_running(api, namespace: str, cluster: str):
    pods = [p for p in api.kube.list("v1", "Pod", namespace, f"ray.io/cluster={cluster}")
            if (p["metadata"].get("labels") or {}).get("forgereplay.io/role") in ("head", "trainer")]
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return running if len(running) == 2 and len(pods) == 2 else None


def test_the_operator_records_the_ray_pods_image_digests_for_the_runtime(control_plane, operator, api,
                                                                          namespace) -> None:
    _bound_claim(control_plane, namespace, "rollout-dumps")
    apply(control_plane, job_doc("images", namespace), claims=False)
    rayjob = wait_for("KubeRay's RayCluster for the RayJob", lambda: (r := api.rayjob(namespace, "images"))
                      and (r.get("status") or {}).get("rayClusterName") and r, timeout=120)
    cluster = rayjob["status"]["rayClusterName"]
    pods = wait_for("the head and trainer pods running on KWOK nodes",
                    lambda: _ray_pods_running(api, namespace, cluster), timeout=180)
    for pod in pods:
        container = pod["spec"]["containers"][0]
        api.kube.merge_patch("v1", "Pod", namespace, pod["metadata"]["name"], {"status": {"containerStatuses": [{
            "name": container["name"], "image": container["image"], "imageID": f"registry.local/runtime@{DIGEST}",
            "ready": True, "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}}}]}}, status=True)
    api.patch_rayjob_status(namespace, "images", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                  "rayClusterName": cluster})
    control_plane.kubectl("patch", "configmap", "images-progress", "-n", namespace, "--type=merge",
                          "-p", json.dumps({"data": {"progress.json": json.dumps({"completed": 0, "total": 4})}}))

    recorded = wait_for("images.json in the progress ConfigMap", lambda: (
        api.get("v1", "ConfigMap", namespace, "images-progress").get("data") or {}).get(IMAGES_KEY))
    assert json.loads(recorded) == {"runtime": DIGEST}
    data = api.get("v1", "ConfigMap", namespace, "images-progress")["data"]
    assert json.loads(data["progress.json"])["completed"] == 0  # the runtime's key untouched
