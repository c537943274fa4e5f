"""Scenario 11 (issue 33): failures that cannot fix themselves end the job, in real pods.

Each job is broken the way teams break them on a shared pool; each must end Failed within its bound (the operator's
settings of these tests, conftest.operator_release: image pulls 30 s, 2 crash-loop restarts, a resync every 15 s),
with a reason of its own that names the pod, and leave no Ray pod behind (the RayCluster is deleted at once, not
after the TTL):

- an image that cannot be pulled (`spec.image` names a registry the node cannot reach): `ImagePullFailed`;
- a slime job whose `spec.image` (the image the init container copies forge_replay from) has no Python: the init
  container fails, `InitContainerFailed`;
- a job whose image has a shell and Python but no Ray (the operator's image): `ray start` is not found, the head
  container crash-loops, `CrashLoop` (while the workers' init container, KubeRay's `wait-gcs-ready`, keeps waiting
  for a head that never comes; busybox would not do: it has no bash, so that init container would fail first and
  the job end `InitContainerFailed`);
- a job whose node selector no node matches (unschedulable) with `spec.scheduling.startDeadlineSeconds: 45`:
  `StartDeadlineExceeded`.

Dump verification is off (`replay.verify: false`): the verify Job runs the same image and would refuse first.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.node import BUSYBOX_IMAGE
from tests.e2e.conftest import STUCK_IMAGE_PULL_SECONDS, provide_volume, smoke_job, wait_for_phase
from tests.e2e.test_scenario8_out_of_memory import _ray_pods

BOUND = 240  # each case ends within its bound plus the kubelet's back-offs and the operator's resync


def _broken(namespace: str, name: str, case: str, rayless_image: str) -> dict:
    job = smoke_job(namespace, name=name)
    spec = job["spec"]
    spec["replay"]["verify"] = False
    if case == "pull":
        spec["image"] = "registry.invalid/forge-replay/runtime:missing"
    elif case == "init":
        spec["image"] = BUSYBOX_IMAGE
        spec["trainer"] = {"backend": "slime", "image": BUSYBOX_IMAGE, "workingDir": "/",
                           "args": ["--rollout-batch-size", "2"], "gpusPerNode": 0}
    elif case == "crash":
        spec["image"] = rayless_image
    elif case == "deadline":
        spec["scheduling"] = {"startDeadlineSeconds": 45, "nodeSelector": {"forgereplay.io/pool": "none-such"}}
    return job


@pytest.mark.parametrize("case, reason", [("pull", "ImagePullFailed"), ("init", "InitContainerFailed"),
                                          ("crash", "CrashLoop"), ("deadline", "StartDeadlineExceeded")])
def test_a_job_that_cannot_start_ends_with_its_reason_and_holds_nothing(real_cluster, operator_release,
                                                                        product_images, e2e_namespace, case, reason):
    namespace = e2e_namespace
    provide_volume(real_cluster, namespace, "smoke-dumps", "ReadOnlyMany")
    provide_volume(real_cluster, namespace, "results", "ReadWriteMany")
    name = f"stuck-{case}"
    started = time.monotonic()
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(_broken(namespace, name, case,
                                                                             product_images.operator.reference)))
    job = wait_for_phase(real_cluster, namespace, name, {"Succeeded", "Failed"}, BOUND)
    took = time.monotonic() - started
    print(f"scenario 11: {case} ended {job['status']['phase']} in {took:.0f}s")
    status = job["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (status["phase"], ready["reason"]) == ("Failed", reason), json.dumps(status, indent=1)
    assert "What to do:" in ready["message"], ready
    if case != "deadline":  # the pod it names
        assert f"{name}-" in ready["message"] and "pod" in ready["message"], ready
    if case == "pull":
        assert took >= STUCK_IMAGE_PULL_SECONDS
    events = json.loads(real_cluster.kubectl("get", "-n", namespace, "events", "--field-selector",
                                             f"reason={reason}", "-o", "json").stdout)["items"]
    assert events, f"no {reason} event"
    deadline = time.monotonic() + 90  # at once: KubeRay deletes the cluster of a Ray job that never started
    while _ray_pods(real_cluster, namespace) and time.monotonic() < deadline:
        time.sleep(3)
    assert not _ray_pods(real_cluster, namespace), "Ray pods of the stuck job are still there"
