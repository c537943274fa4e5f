"""The test control plane is a real one: RBAC, CRD schema + CEL, garbage collection, scheduling, KubeRay."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.manager import GPU_PRODUCT, PROJECT_CRDS_DIR, REPO_ROOT

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "forgereplay.io", "v1alpha1", "forgereplayjobs"
CRD_NAME = f"{PLURAL}.{GROUP}"


def wait_for(what: str, check, timeout: float = 60, interval: float = 0.5):
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last seen: {value!r}")


def kubectl_json(control_plane, *args: str) -> dict:
    return json.loads(control_plane.kubectl(*args, "-o", "json").stdout)


@pytest.fixture
def project_crd(control_plane) -> str:
    if control_plane.project_crd_error:
        pytest.fail(control_plane.project_crd_error)
    if CRD_NAME not in control_plane.installed_crds:
        pytest.skip(f"the project CRD is not in {PROJECT_CRDS_DIR}, so it was not installed")
    return CRD_NAME


def minimal_job(name: str) -> dict:
    """A small valid forge-mode ForgeReplayJob (per docs/api contract), the base every invalid case mutates."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ForgeReplayJob", "metadata": {"name": name},
        "spec": {
            "replay": {"mode": "forge", "numRollouts": 2,
                       "dumps": {"claimName": "rollout-dumps", "path": "run-1/rollout_{rollout_id}.pt"}},
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}},
            "trainer": {"nodes": 1, "gpusPerNode": 8},
            "rollout": {"numGpus": 8, "numGpusPerEngine": 2},
        },
    }


# ---- the API server itself ---------------------------------------------------------------------------------

def test_api_server_ready_versioned_and_rbac_enforced(control_plane, namespace):
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = json.loads(control_plane.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"].startswith("v1.") and version["gitVersion"] != "v0.0.0-master+$Format:%H$"
    # RBAC is the authorizer: a fresh service account may do nothing until bound.
    control_plane.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    subject = f"--as=system:serviceaccount:{namespace}:nobody"
    denied = control_plane.kubectl("auth", "can-i", "list", "configmaps", "-n", namespace, subject, check=False)
    assert denied.stdout.strip() == "no", denied.stdout + denied.stderr
    control_plane.kubectl("create", "role", "read-cm", "--verb=list", "--resource=configmaps", "-n", namespace)
    control_plane.kubectl("create", "rolebinding", "read-cm", "--role=read-cm",
                          f"--serviceaccount={namespace}:nobody", "-n", namespace)
    allowed = control_plane.kubectl("auth", "can-i", "list", "configmaps", "-n", namespace, subject, check=False)
    assert allowed.stdout.strip() == "yes", allowed.stdout + allowed.stderr


def test_kubernetes_python_client_works_with_the_admin_kubeconfig(control_plane, namespace):
    from kubernetes import client

    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "hello"}, "data": {"k": "v"}})
        assert core.read_namespaced_config_map("hello", namespace).data == {"k": "v"}


# ---- the project's CRD: schema and CEL enforced by the API server --------------------------------------------

def test_project_crd_installed_server_side(control_plane, project_crd):
    crd = kubectl_json(control_plane, "get", "crd", project_crd, "--show-managed-fields")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established.get("Established") == "True"
    managers = {entry["manager"] for entry in crd["metadata"]["managedFields"]}
    assert "forge-replay-tests" in managers  # applied server-side under our field manager
    assert crd["spec"]["names"]["kind"] == "ForgeReplayJob"


def example_documents() -> list[Path]:
    return sorted((REPO_ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", example_documents(), ids=lambda p: p.name)
def test_repository_examples_are_accepted(control_plane, project_crd, namespace, example):
    documents = [d for d in yaml.safe_load_all(example.read_text()) if d and d.get("kind") == "ForgeReplayJob"]
    if not documents:
        pytest.skip(f"{example} holds no ForgeReplayJob")
    control_plane.kubectl("apply", "--server-side", "--field-manager=forge-replay-tests", "-n", namespace,
                          "-f", str(example))
    for document in documents:
        stored = kubectl_json(control_plane, "get", PLURAL, document["metadata"]["name"], "-n", namespace)
        assert stored["spec"]["replay"]["mode"] == document["spec"]["replay"]["mode"]


def _set(document: dict, dotted: str, value) -> dict:
    changed = copy.deepcopy(document)
    *parents, leaf = dotted.split(".")
    node = changed
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return changed


_DELETE = object()

# (what is wrong, path to change, new value, the field the API server's refusal must name)
INVALID_CASES = [
    ("unknown mode", "spec.replay.mode", "replay", "spec.replay.mode"),
    ("forge without rollout", "spec.rollout", _DELETE, "spec.rollout"),
    ("debug with rollout", "spec.replay.mode", "debug", "spec.rollout"),
    ("tensor weight sync without colocate", "spec.rollout.weightSync", "tensor", "spec.rollout.weightSync"),
    ("engine size does not divide GPUs", "spec.rollout.numGpusPerEngine", 3, "spec.rollout.numGpusPerEngine"),
    ("dump path escapes the claim", "spec.replay.dumps.path", "../rollout_{rollout_id}.pt", "spec.replay.dumps.path"),
    ("no rollouts", "spec.replay.numRollouts", 0, "spec.replay.numRollouts"),
    ("eval before training with eval off", "spec.replay.evalBeforeTrain", True, "spec.replay.evalBeforeTrain"),
    ("FT components while disabled", "spec.faultTolerance", {"enabled": False, "components": ["train"]},
     "spec.faultTolerance.components"),
    ("name longer than a RayJob allows", "metadata.name", "x" * 48, "metadata.name"),
    ("typo'd field", "spec.trainer.gpusPerNod", 8, "spec.trainer.gpusPerNod"),
]


def test_minimal_valid_job_is_accepted(control_plane, project_crd, namespace):
    from kubernetes import client

    with control_plane.api_client() as api:
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, minimal_job("minimal"), field_validation="Strict")
    assert created["metadata"]["uid"]


@pytest.mark.parametrize("problem, dotted, value, field", INVALID_CASES, ids=[c[0] for c in INVALID_CASES])
def test_invalid_job_is_refused_by_the_api_server_naming_the_field(control_plane, project_crd, namespace,
                                                                   problem, dotted, value, field):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    document = _set(minimal_job("bad"), dotted, value)
    with control_plane.api_client() as api, pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, document, field_validation="Strict")
    # 422 Invalid for schema and CEL rules, 400 BadRequest for an unknown field under strict field validation
    assert refused.value.status in (400, 422), refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert field in message, f"{problem}: refusal does not name {field}: {message}"


# ---- controllers: garbage collection and namespaces ------------------------------------------------------

def _owner_reference(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


@pytest.mark.parametrize("owner_kind", ["ConfigMap", "ForgeReplayJob"])
def test_owned_configmap_is_garbage_collected_after_owner_deletion(control_plane, namespace, owner_kind, request):
    if owner_kind == "ForgeReplayJob":
        request.getfixturevalue("project_crd")
        owner_doc = minimal_job("owner")
    else:
        owner_doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    owner = json.loads(control_plane.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                                             input=json.dumps(owner_doc)).stdout)
    child = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "owner-progress", "ownerReferences": [_owner_reference(owner)]},
             "data": {"progress.json": "{}"}}
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(child))
    # An unowned sibling proves the collector deletes by ownership, not by wiping the namespace.
    control_plane.kubectl("create", "configmap", "bystander", "-n", namespace)
    control_plane.kubectl("delete", owner_doc["kind"].lower() if owner_kind == "ConfigMap" else PLURAL, "owner",
                          "-n", namespace)

    def child_gone() -> bool:
        result = control_plane.kubectl("get", "configmap", "owner-progress", "-n", namespace, check=False)
        return result.returncode != 0 and "NotFound" in result.stderr

    wait_for("the garbage collector to delete the owned ConfigMap", child_gone, timeout=60)
    control_plane.kubectl("get", "configmap", "bystander", "-n", namespace)


def test_deleted_namespace_is_emptied_and_removed(control_plane):
    control_plane.kubectl("create", "namespace", "doomed-ns")
    control_plane.kubectl("create", "configmap", "content", "-n", "doomed-ns")
    control_plane.kubectl("delete", "namespace", "doomed-ns", "--wait=false")
    wait_for("namespace doomed-ns to disappear",
             lambda: control_plane.kubectl("get", "namespace", "doomed-ns", check=False).returncode != 0, timeout=60)


# ---- scheduling onto KWOK's fake GPU nodes, and KubeRay ----------------------------------------------------

def test_fake_gpu_nodes_advertise_h200_pool(control_plane):
    nodes = kubectl_json(control_plane, "get", "nodes", "-l", f"nvidia.com/gpu.product={GPU_PRODUCT}")["items"]
    assert len(nodes) >= 1
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_pod_needing_more_gpus_than_any_node_stays_pending(control_plane, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big"},
           "spec": {"containers": [{"name": "c", "image": "busybox",
                                    "resources": {"limits": {"nvidia.com/gpu": "16"}}}]}}
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def unschedulable() -> str | None:
        status = kubectl_json(control_plane, "get", "pod", "too-big", "-n", namespace)["status"]
        for condition in status.get("conditions", []):
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return condition.get("message", "")
        return None

    message = wait_for("the scheduler to refuse the pod", unschedulable, timeout=60)
    assert "nvidia.com/gpu" in message


def test_kuberay_turns_a_raycluster_into_running_pods_on_fake_nodes(control_plane, namespace):
    container = {"name": "ray", "image": "rayproject/ray:2.60.0",
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}}
    gpu_container = {**container, "resources": {"limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "8"},
                                                "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "8"}}}
    raycluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "tiny"},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}},
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1, "rayStartParams": {},
                "template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": GPU_PRODUCT},
                                      "containers": [gpu_container]}},
            }],
        },
    }
    control_plane.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(raycluster))

    def running_pods() -> list[dict] | None:
        pods = kubectl_json(control_plane, "get", "pods", "-n", namespace, "-l", "ray.io/cluster=tiny")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 2 else None

    pods = wait_for("KubeRay's head and worker pods to run on fake nodes", running_pods, timeout=90)
    by_type = {p["metadata"]["labels"]["ray.io/node-type"]: p for p in pods}
    assert set(by_type) == {"head", "worker"}
    worker_node = kubectl_json(control_plane, "get", "node", by_type["worker"]["spec"]["nodeName"])
    assert worker_node["metadata"]["labels"]["nvidia.com/gpu.product"] == GPU_PRODUCT
    assert by_type["head"]["spec"]["nodeName"] in control_plane.fake_nodes
