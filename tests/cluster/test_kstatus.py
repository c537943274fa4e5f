"""GitOps health of ForgeReplayJobs as the operator really writes it, read by the real kstatus library
(sigs.k8s.io/cli-utils/pkg/kstatus, what Flux and kpt use; our tool in tests/cluster/go/kstatus) and by
the Argo CD health Lua, through a job's life: launching, running, succeeded, failed, a spec change the
operator has not observed yet, suspended. The operator runs under the chart's ServiceAccount token.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.cluster.operator_harness import Api, OperatorProcess, apply, job_doc, wait_for
from tests.cluster.test_rbac import chart_operator_kubeconfig, uninstall_chart_for
from tests.unit.test_argocd_health import run_health


def kstatus_binary():
    from tests.cluster import build

    try:
        return build.binary_path("kstatus")
    except build.GoToolchainMissing as error:
        pytest.skip(f"the kstatus tool is not built and cannot be: {error}")


def kstatus(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    """kstatus of each object (our Go tool around cli-utils' status.Compute)."""
    result = subprocess.run([str(kstatus_binary())], input="\n".join(json.dumps(o) for o in objects),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_kstatus_tool_on_hand_written_objects() -> None:
    """The tool itself, without a cluster: generation mismatch, Reconciling, Stalled, Ready."""
    base = {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": "x", "namespace": "ns", "generation": 2}}

    def with_status(**status: Any) -> dict[str, Any]:
        return {**base, "status": status}

    cond = lambda kind, value: {"type": kind, "status": value, "reason": "R", "message": f"{kind} is {value}"}  # noqa: E731
    verdicts = kstatus([
        with_status(observedGeneration=1, conditions=[cond("Ready", "True")]),
        with_status(observedGeneration=2, conditions=[cond("Reconciling", "True")]),
        with_status(observedGeneration=2, conditions=[cond("Stalled", "True")]),
        with_status(observedGeneration=2, conditions=[cond("Ready", "True")]),
        with_status(observedGeneration=2, conditions=[cond("Ready", "False")]),
    ])
    assert [v["status"] for v in verdicts] == ["InProgress", "InProgress", "Failed", "Current", "InProgress"]
    assert verdicts[0]["message"] == "ForgeReplayJob generation is 2, but latest observed generation is 1"


@pytest.fixture
def chart_operator(control_plane, namespace, tmp_path):
    kubeconfig = chart_operator_kubeconfig(control_plane, namespace)
    process = OperatorProcess(str(kubeconfig), [namespace], tmp_path / "operator.log")
    yield process
    process.stop()
    print(f"--- operator log ---\n{process.log_tail(80)}")
    uninstall_chart_for(control_plane, namespace)


def health(control_plane: Any, namespace: str, name: str) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """(kstatus verdict, Argo CD health, object) of one ForgeReplayJob as stored."""
    obj = json.loads(control_plane.kubectl("get", "forgereplayjob", name, "-n", namespace, "-o", "json").stdout)
    (verdict,) = kstatus([obj])
    return verdict, run_health(obj), obj


def wait_health(control_plane: Any, namespace: str, name: str, kstatus_status: str, argocd_status: str,
                timeout: float = 90) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    def check():
        verdict, argo, obj = health(control_plane, namespace, name)
        return (verdict["status"] == kstatus_status and argo["status"] == argocd_status) and (verdict, argo, obj)

    return wait_for(f"{name}: kstatus {kstatus_status} and Argo CD {argocd_status}", check, timeout=timeout)


@pytest.mark.cluster
def test_kstatus_and_argocd_follow_a_job_to_success(control_plane, namespace, chart_operator) -> None:
    api = Api(str(control_plane.kubeconfig))
    apply(control_plane, job_doc("ok", namespace))
    # Before any operator has seen it: no status. kstatus has nothing to go on and calls it Current
    # (a kstatus limitation, see docs/gitops.md); the Argo CD check waits for the operator.
    verdict, argo, _ = health(control_plane, namespace, "ok")
    assert (verdict["status"], argo["status"]) == ("Current", "Progressing")

    chart_operator.start()
    wait_for("the RayJob", lambda: api.rayjob(namespace, "ok"))
    _, _, obj = wait_health(control_plane, namespace, "ok", "InProgress", "Progressing")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]

    api.patch_rayjob_status(namespace, "ok", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                              "rayClusterName": "ok-raycluster-a"})
    wait_for("phase Running", lambda: api.status(namespace, "ok").get("phase") == "Running")
    wait_health(control_plane, namespace, "ok", "InProgress", "Progressing")

    api.patch_rayjob_status(namespace, "ok", {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED",
                                              "rayClusterName": "ok-raycluster-a",
                                              "startTime": "2026-11-29T11:00:00Z", "endTime": "2026-11-29T12:00:00Z"})
    verdict, argo, obj = wait_health(control_plane, namespace, "ok", "Current", "Healthy")
    assert obj["status"]["phase"] == "Succeeded"


@pytest.mark.cluster
def test_kstatus_and_argocd_see_a_failed_job_as_failed(control_plane, namespace, chart_operator) -> None:
    api = Api(str(control_plane.kubeconfig))
    chart_operator.start()
    apply(control_plane, job_doc("bad", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "bad"))
    api.patch_rayjob_status(namespace, "bad", {"jobDeploymentStatus": "Complete", "jobStatus": "FAILED",
                                               "message": "trainer rank 3 OOM", "rayClusterName": "bad-raycluster-b",
                                               "startTime": "2026-11-29T11:00:00Z", "endTime": "2026-11-29T11:30:00Z"})
    verdict, argo, obj = wait_health(control_plane, namespace, "bad", "Failed", "Degraded")
    assert obj["status"]["phase"] == "Failed"
    assert verdict["message"] and argo["message"]


@pytest.mark.cluster
def test_unobserved_spec_change_is_in_progress_until_the_operator_catches_up(control_plane, namespace,
                                                                             chart_operator) -> None:
    api = Api(str(control_plane.kubeconfig))
    chart_operator.start()
    apply(control_plane, job_doc("later", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "later"))
    wait_health(control_plane, namespace, "later", "InProgress", "Progressing")
    api.patch_rayjob_status(namespace, "later", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                 "rayClusterName": "later-raycluster-c"})
    wait_for("phase Running", lambda: api.status(namespace, "later").get("phase") == "Running")

    chart_operator.stop()  # the operator is down while Git changes the spec
    apply(control_plane, job_doc("later", namespace, suspend=True))
    verdict, argo, obj = health(control_plane, namespace, "later")
    assert obj["status"]["observedGeneration"] < obj["metadata"]["generation"]
    assert verdict["status"] == "InProgress" and "latest observed generation" in verdict["message"]
    assert argo["status"] == "Progressing" and "observe generation" in argo["message"]

    chart_operator.start()
    wait_for("RayJob suspended", lambda: api.rayjob(namespace, "later")["spec"].get("suspend") is True)
    _, argo, obj = wait_health(control_plane, namespace, "later", "InProgress", "Suspended")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["phase"] == "Suspended"


def test_kstatus_build_key_tracks_main_go() -> None:
    """The builder rebuilds when binaries.txt changes; binaries.txt pins main.go's hash, so edits rebuild."""
    import hashlib
    from pathlib import Path

    module = Path(__file__).resolve().parent / "go" / "kstatus"
    digest = hashlib.sha256((module / "main.go").read_bytes()).hexdigest()[:16]
    assert f"# main.go sha256: {digest}" in (module / "binaries.txt").read_text(), (
        f"tests/cluster/go/kstatus/main.go changed: put `# main.go sha256: {digest}` in its binaries.txt "
        "(the build cache would otherwise keep the old binary)")
