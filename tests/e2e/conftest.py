"""Fixtures of the end-to-end tests: the test control plane with one real node (tests/cluster/node.py).

Collected only with FORGE_REPLAY_E2E=1 (scripts/e2e sets it; tests/conftest.py). Nothing here skips: a
missing build or package is an error that says what to run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster import build, images
from tests.cluster.manager import ControlPlane, Options
from tests.cluster.node import RealNode

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "forge-replay-operator"
OPERATOR_NAMESPACE = "forge-system"
RELEASE = "forge"
DUMPS_UID = 2000  # the dumps are written by another user than the runtime's 10001
TTL_SECONDS = 15  # ttlSecondsAfterFinished of the e2e jobs
# Small enough for the 2-core real node: operator 100m + head + KubeRay's submitter (500m) + CPU worker pods: the
# trainer, and in forge mode (scenario 4) two engine pods of the same size. Requests only: no CPU limit is set, and
# Ray counts each pod as 1 CPU (KubeRay rounds up).
SMALL_RUNTIME_RESOURCES = {"head": {"cpu": "250m", "memory": "3Gi"}, "cpuWorker": {"cpu": "250m", "memory": "6Gi"},
                           "shmSize": "1Gi"}
SMALL_VERIFY_RESOURCES = {"cpus": 1, "memoryGiB": 1}
STUCK_IMAGE_PULL_SECONDS = 30  # the operator's --image-pull-seconds in these tests  # spec.replay.verifyResources: the verify pod is sized per job

_STATE: dict[str, object] = {"plane": None, "failed": False}


@pytest.fixture(scope="session")
def real_cluster() -> ControlPlane:
    """The whole control plane plus one real node (``real_cluster.node``), started once per session.

    Stopping it must leave nothing behind (processes, cgroups, mounts, namespaces): checked at teardown."""
    plane = ControlPlane(Options(real_node=True, gpu_nodes=1, cpu_nodes=0)).start()
    _STATE["plane"] = plane
    yield plane
    _STATE["plane"] = None
    node: RealNode = plane.node
    plane.stop(keep_logs=bool(_STATE["failed"]))
    assert not plane.left_behind, f"the real node left {plane.left_behind}"
    assert not node.cgroup_pids()


@pytest.fixture
def e2e_namespace(real_cluster: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test; deleted (without waiting) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", name)
    real_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    plane = _STATE["plane"]
    if report.failed and plane is not None:
        _STATE["failed"] = True
        plane.keep_workdir = True
        dead = ", ".join(c.name for c in plane.dead_components())
        header = f"cluster folder {plane.workdir}" + (f"; EXITED: {dead}" if dead else "")
        report.sections.append(("cluster logs", f"{header}\n{plane.log_tails(25)}"))
    return report


@dataclass(frozen=True)
class ProductImages:
    operator: images.Image
    runtime: images.Image


@pytest.fixture(scope="session")
def product_images(real_cluster: ControlPlane) -> ProductImages:
    """The operator and runtime images (built by scripts/e2e, or here if missing) in the node's containerd."""
    operator, runtime = images.build_images(("operator", "runtime"))
    for image in (operator, runtime):
        real_cluster.node.import_image(image.archive, name=image.reference)
    return ProductImages(operator, runtime)


def helm(*args: str, plane: ControlPlane, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([str(build.binary_path("helm")), f"--kubeconfig={plane.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def operator_release(real_cluster: ControlPlane, product_images: ProductImages) -> dict:
    """`helm install` of the chart with the local images, as a platform team would (the control plane installed
    the CRD already, so crds.install=false). Returns the values used."""
    repository, tag = product_images.operator.reference.rsplit(":", 1)
    runtime_repository, runtime_tag = product_images.runtime.reference.rsplit(":", 1)
    values = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
              "runtimeImage": {"repository": runtime_repository, "tag": runtime_tag},
              "crds": {"install": False}, "runtimeResources": SMALL_RUNTIME_RESOURCES,
              # short bounds, so that scenario 11's stuck jobs end within minutes (the defaults: 300 s, 3 restarts,
              # a resync every 60 s, which is also how late a bound can be noticed: pods are not watched)
              "operator": {"imagePullSeconds": STUCK_IMAGE_PULL_SECONDS, "crashLoopRestarts": 2,
                           "resyncSeconds": 15}}
    path = real_cluster.workdir / "operator-values.json"
    path.write_text(json.dumps(values))
    real_cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE)
    helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--values", str(path), "--wait",
         "--timeout=300s", plane=real_cluster)
    return values


def provide_volume(plane: ControlPlane, namespace: str, claim: str, access_mode: str) -> Path:
    """A hostPath PersistentVolume pre-bound to a claim of that name (created too), as a cluster admin would
    provide storage; returns the host folder behind it."""
    folder = plane.workdir / "volumes" / namespace / claim
    folder.mkdir(parents=True)
    folder.chmod(0o777 if access_mode == "ReadWriteMany" else 0o755)
    volume = f"{namespace}-{claim}"
    objects = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [access_mode], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain",
                  "hostPath": {"path": str(folder), "type": "Directory"},
                  "claimRef": {"namespace": namespace, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
         "spec": {"accessModes": [access_mode], "storageClassName": "", "volumeName": volume,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]
    plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))
    plane.kubectl("wait", "-n", namespace, f"pvc/{claim}", "--for=jsonpath={.status.phase}=Bound", "--timeout=60s")
    return folder


def write_dumps(folder: Path, num_rollouts: int, prompts: int = 2, response_len: int = 16,
                path: str = "smoke/rollout_{rollout_id}.pt") -> None:
    """Synthetic dumps for examples/smoke-cpu.yaml (``path``: smoke/rollout_{id}.pt), owned by DUMPS_UID, mode
    0644."""
    subprocess.run([sys.executable, "-m", "forge_replay.cli", "dumps", "synth", "--out",
                    str(folder / path), "--num-rollouts", str(num_rollouts),
                    "--prompts", str(prompts), "--samples-per-prompt", "4", "--prompt-len", "16",
                    "--response-len", str(response_len), "--vocab-size", "512"],
                   check=True, capture_output=True, timeout=300)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, DUMPS_UID, DUMPS_UID)
        path.chmod(0o755 if path.is_dir() else 0o644)


def smoke_job(namespace: str, name: str = "smoke-cpu", expect: dict | None = None) -> dict:
    """examples/smoke-cpu.yaml in ``namespace``, reporting to the claim ``results``."""
    job = yaml.safe_load((REPO / "examples" / "smoke-cpu.yaml").read_text())
    job["metadata"].update(name=name, namespace=namespace)
    job["spec"]["results"] = {"claimName": "results"}
    job["spec"]["ttlSecondsAfterFinished"] = TTL_SECONDS
    job["spec"]["replay"]["verifyResources"] = SMALL_VERIFY_RESOURCES
    if expect is not None:
        job["spec"]["expect"] = expect
    return job


def wait_for_phase(plane: ControlPlane, namespace: str, name: str, phases: set[str], timeout: float) -> dict:
    """The ForgeReplayJob once its phase is one of ``phases``; fails with its status after ``timeout``."""
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = json.loads(plane.kubectl("get", "-n", namespace, "forgereplayjob", name, "-o", "json").stdout)
        if job.get("status", {}).get("phase") in phases:
            return job
        time.sleep(3)
    raise AssertionError(f"{name} did not reach {phases} in {timeout:.0f}s; status:\n"
                         f"{json.dumps(job.get('status'), indent=1)}")


@dataclass(frozen=True)
class SmokeRun:
    namespace: str
    status: dict
    folder: Path  # the run's own folder on the results volume (host path)
    finished: float  # time.monotonic() when the job's phase became final


@pytest.fixture(scope="session")
def smoke_run(real_cluster: ControlPlane, operator_release: dict) -> SmokeRun:
    """examples/smoke-cpu.yaml run once to its end in real pods (scenario 2; its report is scenario 6's baseline)."""
    namespace = "e2e-smoke"
    real_cluster.kubectl("create", "namespace", namespace)
    real_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=60s")
    dumps = provide_volume(real_cluster, namespace, "smoke-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, namespace, "results", "ReadWriteMany")
    write_dumps(dumps, 4)
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(smoke_job(namespace)))
    job = wait_for_phase(real_cluster, namespace, "smoke-cpu", {"Succeeded", "Failed", "Stalled"}, 900)
    finished = time.monotonic()
    folders = list((results / namespace / "smoke-cpu").iterdir()) if (results / namespace).exists() else []
    assert len(folders) == 1, f"expected one run folder under {results}, found {folders}"
    return SmokeRun(namespace, job["status"], folders[0], finished)


def run_noting_roles(plane: ControlPlane, namespace: str, name: str, job: dict,
                     timeout: float = 900) -> tuple[dict, dict[str, str]]:
    """Apply ``job`` and wait for its end (Succeeded or Failed), noting the role (``forgereplay.io/role``: head,
    trainer, rollout, ...) of each of its pods by pod name and IP while it ran: (status, roles)."""
    plane.kubectl("apply", "-f", "-", input=json.dumps(job))
    roles: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    status: dict = {}
    while time.monotonic() < deadline:
        pods = json.loads(plane.kubectl("get", "-n", namespace, "pods", "-l", f"forgereplay.io/job={name}",
                                        "-o", "json").stdout)["items"]
        for pod in pods:
            role = pod["metadata"]["labels"].get("forgereplay.io/role", "?")
            roles[pod["metadata"]["name"]] = role
            if (pod.get("status") or {}).get("podIP"):
                roles[pod["status"]["podIP"]] = role
        status = json.loads(plane.kubectl("get", "-n", namespace, "forgereplayjob", name, "-o", "json").stdout
                            ).get("status", {})
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        time.sleep(3)
    return status, roles
