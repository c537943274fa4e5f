"""The images a job's Ray pods ran, by digest (issue 35, item 1): read from the pods' status as the kubelet writes it,
recorded by the operator into the progress ConfigMap, copied by the runtime into report.json's environment, and named
by a regression message when they changed.

Pod status dicts follow the Kubernetes API (core/v1 PodStatus, ContainerStatus:
kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus): ``containerStatuses[]`` and
``initContainerStatuses[]`` each with ``name``, ``image``, ``imageID`` ("the image ID of the container's image ... may
have been resolved by the runtime"; empty until the container was created) and ``state``. The imageID forms are the
ones the runtimes write: containerd ``<repository>@sha256:<hex>`` (pulled) or ``sha256:<hex>`` (imported without a
registry, e.g. ``k3s ctr images import``), dockershim ``docker-pullable://<repository>@sha256:<hex>``."""

from __future__ import annotations

import json

import pytest

from forge_replay.api.images import IMAGES_KEY, read_images
from forge_replay.controller.images import image_digest, ray_pod_images
from tests.unit.test_gate_history import RESERVED_2PC, content, expect, run, verdict
from tests.unit.test_verdict_gate import ENV

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
C = "sha256:" + "c" * 64
RUNTIME = "ghcr.io/forge-replay/runtime:0.1.0"


def container_status(name: str, image_id: str, image: str = RUNTIME, running: bool = True) -> dict:
    state = {"running": {"startedAt": "2026-12-01T10:00:00Z"}} if running else {
        "waiting": {"reason": "ContainerCreating"}}
    return {"name": name, "image": image, "imageID": image_id, "ready": running, "restartCount": 0,
            "started": running, "state": state}


def pod(name: str, container: str, image_id: str, *, init: str | None = None, deleting: bool = False,
        running: bool = True) -> dict:
    """A Ray pod of cluster ``c1`` as the API server returns it (the kubelet's status included)."""
    meta = {"name": name, "namespace": "ml", "labels": {"ray.io/cluster": "c1"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:05:00Z"
    spec: dict = {"containers": [{"name": container, "image": RUNTIME}]}
    status: dict = {"phase": "Running" if running else "Pending",
                    "containerStatuses": [container_status(container, image_id if running else "", running=running)]}
    if init is not None:
        spec["initContainers"] = [{"name": "forge-replay-lib", "image": RUNTIME}]
        status["initContainerStatuses"] = [{**container_status("forge-replay-lib", init, running=False),
                                            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
    return {"metadata": meta, "spec": spec, "status": status}


@pytest.mark.parametrize("image_id, digest", [
    (f"ghcr.io/forge-replay/runtime@{A}", A),                 # containerd, pulled from a registry
    (A, A),                                                   # containerd, imported without a registry
    (f"docker-pullable://ghcr.io/forge-replay/runtime@{A}", A),  # dockershim
    (f"docker://{A}", A),                                     # dockershim, a local image
    ("", None),                                               # not created yet
    (None, None),
])
def test_the_digest_of_an_image_id(image_id, digest):
    assert image_digest(image_id) == digest


HEAD, WORKER = "ray-head", "ray-worker"
PODS = [
    # (case, pods, byo, recorded)
    ("builtin: every Ray pod runs the runtime image",
     [pod("h", HEAD, f"ghcr.io/forge-replay/runtime@{A}"), pod("w", WORKER, f"mirror.local/runtime@{A}")], False,
     {"runtime": A}),
    ("a mutable tag pulled twice: both digests",
     [pod("h", HEAD, A), pod("w1", WORKER, B), pod("w2", WORKER, A)], False, {"runtime": [A, B]}),
    ("slime / miles: the team's image, and ours in the init container",
     [pod("h", HEAD, B, init=A), pod("w", WORKER, B, init=A)], True, {"runtime": A, "trainer": B}),
    ("a worker not started yet: asked again later",
     [pod("h", HEAD, A), pod("w", WORKER, A, running=False)], False, None),
    ("an init container not run yet", [pod("h", HEAD, B, init="")], True, None),
    ("a pod being deleted is left out",
     [pod("h", HEAD, A), pod("old", WORKER, C, deleting=True)], False, {"runtime": A}),
    ("the submitter's pod is no Ray pod",
     [pod("h", HEAD, A), pod("submit", "ray-job-submitter", C)], False, {"runtime": A}),
    ("no Ray pod at all", [pod("submit", "ray-job-submitter", C)], False, None),
    ("no pods", [], False, None),
]


@pytest.mark.parametrize("case, pods, byo, recorded", PODS, ids=[p[0] for p in PODS])
def test_the_ray_pods_images_by_role(case, pods, byo, recorded):
    assert ray_pod_images(pods, byo) == recorded
    if recorded is not None:  # what the operator writes is what the runtime reads back
        assert read_images(json.dumps(recorded)) == recorded


@pytest.mark.parametrize("text, images", [
    (None, {}), ("", {}), ("not json", {}), ("[1]", {}),
    (json.dumps({"runtime": A, "other": B, "trainer": ""}), {"runtime": A}),  # unknown roles, empty values dropped
    (json.dumps({"runtime": [B, A], "trainer": [A, 3]}), {"runtime": [A, B]}),
])
def test_the_runtime_reads_what_it_can_and_never_fails(text, images):
    assert read_images(text) == images
    assert IMAGES_KEY == "images.json"


def test_a_local_run_records_no_image():
    from forge_replay.runtime.progress_publish import ProgressPublisher

    assert ProgressPublisher(None, configmap=None).image_digests() == {}


# ------------------------------------------------------------------------------------------ the explanation


def env_with(**digests) -> dict:
    return {**ENV, "image_digests": digests} if digests else dict(ENV)


@pytest.mark.parametrize("mine, theirs, said", [
    (env_with(runtime=B), [env_with(runtime=A)] * 3, "runtime image sha256:aaaaaaaaaaaa.. -> sha256:bbbbbbbbbbbb.."),
    (env_with(runtime=A), [env_with(runtime=A), env_with(runtime=B)], ""),  # one reference ran it: no change
    (env_with(runtime=C), [env_with(runtime=A), env_with(runtime=B)],
     "runtime image {sha256:aaaaaaaaaaaa.., sha256:bbbbbbbbbbbb..} -> sha256:cccccccccccc.."),
    (env_with(runtime=A, trainer=C), [env_with(runtime=A, trainer=B)],
     "trainer image sha256:bbbbbbbbbbbb.. -> sha256:cccccccccccc.."),
    (env_with(runtime=[A, B]), [env_with(runtime=A)], "runtime image sha256:aaaaaaaaaaaa.. -> "
                                                      "sha256:aaaaaaaaaaaa.. sha256:bbbbbbbbbbbb.."),
    (env_with(), [env_with(runtime=A)], ""),  # a run whose digests were not recorded says nothing of its image
    (env_with(runtime=A), [env_with()], ""),  # nor references without them (local runs, older versions)
])
def test_what_changed_names_an_image_by_role_and_short_digest(mine, theirs, said):
    from forge_replay.verdict.explain import what_changed

    assert what_changed(mine, theirs) == said


def test_a_regression_message_names_the_changed_runtime_image():
    history = [run(d, env=env_with(runtime=A), job=f"r{d}") for d in (1, 2, 3)]
    check = verdict(run(4, (80.0, 74.0), env=env_with(runtime=B)), content(*history), expect([RESERVED_2PC]))[
        "baseline.peak_reserved_gib.band"]
    assert not check.passed
    assert "over the band of 3 trusted runs" in check.message
    assert "runtime image sha256:aaaaaaaaaaaa.. -> sha256:bbbbbbbbbbbb.." in check.message, check.message
