"""spec.expect on the control plane (issue 17): a missing baseline ConfigMap stops the job before anything is
created; the verdict the runtime records in the progress ConfigMap reaches status.expectations, ExpectationsMet,
the phase and a Warning event, and the real kstatus and Argo CD health Lua read a failed gate as failed.

As in test_operator_platform.py, a run's end is reached by writing what the runtime writes (the progress
ConfigMap's result, runtime/progress.record_result) and patching the RayJob's status as KubeRay would."""

from __future__ import annotations

import json

import pytest

from tests.cluster.operator_harness import apply, job_doc, wait_for
from tests.cluster.test_kstatus import kstatus
from tests.cluster.test_operator import api, operator, operator_kubeconfig  # noqa: F401
from tests.unit.test_argocd_health import run_health

pytestmark = pytest.mark.cluster

REPORT = {"job": "release", "partial": False, "rollouts": [{"rollout_id": 0, "loss": 0.5, "grad_norm": 1.0}]}
MISS = {"name": "baseline.loss", "passed": False, "observed": 0.505, "limit": 0.5, "rollout": 0, "metric": "loss",
        "message": "rollout 0: loss 0.505 vs baseline 0.5 (differs beyond rtol 1e-06 / atol 1e-08)"}
MET = {"name": "maxFallbacks", "passed": True, "observed": 0, "limit": 0, "message": "rollouts trained on rollout 0's "
       "file 0 <= 0"}


def _finish(control_plane, api, namespace: str, name: str, phase: str, *checks: dict) -> None:
    """What the runtime and KubeRay write when the run ends (exit 3 on an unmet expectation: the Ray job FAILED)."""
    result = {"phase": phase, "finishedAt": "2026-11-30T10:00:00Z", "expectations": list(checks)}
    progress = {"completed": 1, "total": 1, "result": result}
    control_plane.kubectl("patch", "configmap", f"{name}-progress", "-n", namespace, "--type=merge",
                          "-p", json.dumps({"data": {"progress.json": json.dumps(progress)}}))
    api.patch_rayjob_status(namespace, name, {
        "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED" if phase == "Succeeded" else "FAILED",
        "rayClusterName": f"{name}-raycluster-a", "startTime": "2026-11-30T09:00:00Z",
        "endTime": "2026-11-30T10:00:00Z"})


def _readings(control_plane, namespace: str, name: str) -> tuple[str, str, dict]:
    obj = json.loads(control_plane.kubectl("get", "forgereplayjob", name, "-n", namespace, "-o", "json").stdout)
    (verdict,) = kstatus([obj])
    return verdict["status"], run_health(obj)["status"], obj


def test_a_failed_expectation_fails_the_gate(control_plane, operator, api, namespace) -> None:
    expect = {"maxFallbacks": 0, "baseline": {"configMapName": "release-baseline", "metrics": ["loss"], "rtol": 1e-6}}
    apply(control_plane, job_doc("gate", namespace, expect=expect))
    status = wait_for("BaselineNotFound", lambda: (s := api.status(namespace, "gate")).get("phase") == "Pending"
                      and api.condition(namespace, "gate", "ExpectationsMet").get("reason") == "BaselineNotFound"
                      and s)
    assert f"ConfigMap {namespace}/release-baseline (spec.expect.baseline.configMapName) does not exist" in \
        status["message"]
    assert api.rayjob(namespace, "gate") is None  # no GPU requested
    assert _readings(control_plane, namespace, "gate")[:2] == ("Failed", "Degraded")

    baseline = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "release-baseline",
                                                                      "namespace": namespace},
                "data": {"report.json": json.dumps({**REPORT, "partial": True, "error": "interrupted by SIGTERM"})}}
    apply(control_plane, baseline, claims=False)  # issue 25: a killed run's report is no baseline, here either
    status = wait_for("the unusable baseline named", lambda: "interrupted by SIGTERM" in (
        s := api.status(namespace, "gate")).get("message", "") and s, timeout=120)
    assert status["phase"] == "Pending" and api.rayjob(namespace, "gate") is None
    baseline["data"] = {"report.json": json.dumps(REPORT)}
    apply(control_plane, baseline, claims=False)
    rayjob = wait_for("the RayJob once the baseline exists", lambda: api.rayjob(namespace, "gate"), timeout=120)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "baseline", "configMap": {"name": "release-baseline"}} in head["volumes"]

    _finish(control_plane, api, namespace, "gate", "Failed", MET, MISS)
    status = wait_for("phase Failed", lambda: (s := api.status(namespace, "gate")).get("phase") == "Failed" and s)
    met = api.condition(namespace, "gate", "ExpectationsMet")
    assert (met["status"], met["reason"]) == ("False", "ExpectationsNotMet")
    assert met["message"].startswith("baseline.loss: rollout 0: loss")
    assert [(e["name"], e["passed"]) for e in status["expectations"]] == [("maxFallbacks", True),
                                                                          ("baseline.loss", False)]
    assert status["expectations"][1]["rollout"] == 0 and status["expectations"][1]["metric"] == "loss"
    events = json.loads(control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                              "involvedObject.name=gate", "-o", "json").stdout)["items"]
    assert any(e["type"] == "Warning" and "expectation not met: baseline.loss" in e["message"] for e in events)
    assert _readings(control_plane, namespace, "gate")[:2] == ("Failed", "Degraded")


def test_met_expectations_pass_the_gate(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("pass", namespace, expect={"maxFallbacks": 0}))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "pass"))
    _finish(control_plane, api, namespace, "pass", "Succeeded", MET)
    status = wait_for("phase Succeeded", lambda: (s := api.status(namespace, "pass")).get("phase") == "Succeeded"
                      and s)
    assert api.condition(namespace, "pass", "ExpectationsMet")["status"] == "True"
    assert status["expectations"] == [MET]
    assert _readings(control_plane, namespace, "pass")[:2] == ("Current", "Healthy")
