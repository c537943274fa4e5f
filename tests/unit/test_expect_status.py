"""spec.expect in the operator (issue 17): the verdict the runtime recorded reaches status.expectations and
ExpectationsMet; a failed expectation fails the job, which Argo CD's health Lua reads Degraded and kstatus Failed;
the baseline reaches the runtime's pods read-only."""

from __future__ import annotations

import json
import subprocess

import pytest

from forge_replay.api import parse_job
from forge_replay.api.paths import BASELINE_MOUNT
from forge_replay.api.progress_report import ProgressReport
from forge_replay.controller.render import render
from forge_replay.controller.status import status_for_baseline, status_from
from tests.unit.spec_factory import debug_job

EXPECT = {"maxPeakMemoryGiB": 0.01, "baseline": {"configMapName": "release-baseline", "metrics": ["loss"]}}
LAUNCHED = {"rayJobName": "gate", "phase": "Running"}
MEMORY_MISS = {"name": "maxPeakMemoryGiB", "passed": False, "observed": 0.8, "limit": 0.01,
               "message": "peak memory (GiB, RSS) 0.8 > 0.01"}
LOSS_OK = {"name": "baseline.loss", "passed": True, "observed": 0.25, "limit": 0.25, "metric": "loss",
           "message": "loss within rtol 1e-05 / atol 1e-08 of the baseline on all 4 rollouts"}


def gate(expect=EXPECT, previous=LAUNCHED):
    doc = debug_job(metadata={"name": "gate", "namespace": "ml", "uid": "u-1", "generation": 1}, spec__expect=expect)
    job = parse_job({**doc, "status": previous})
    return job


def rayjob(job_status):
    return {"metadata": {"name": "gate"}, "status": {"jobDeploymentStatus": "Complete", "jobStatus": job_status}}


def progress(phase, *checks):
    result = {"phase": phase, "finishedAt": "2026-11-30T10:00:00Z", "expectations": list(checks)}
    return ProgressReport.model_validate({"completed": 4, "total": 4, "result": result})


def cond(status, kind):
    return next((c for c in status["conditions"] if c["type"] == kind), None)


@pytest.mark.parametrize("rj, prog, phase, met, reason", [
    (rayjob("FAILED"), progress("Failed", MEMORY_MISS, LOSS_OK), "Failed", "False", "ExpectationsNotMet"),
    (None, progress("Failed", MEMORY_MISS, LOSS_OK), "Failed", "False", "ExpectationsNotMet"),  # RayJob gone
    (rayjob("SUCCEEDED"), progress("Succeeded", LOSS_OK), "Succeeded", "True", "ExpectationsMet"),
    (rayjob("SUCCEEDED"), None, "Failed", "False", "ExpectationsNotMet"),  # no verdict recorded: no silent pass
    (rayjob("FAILED"), None, "Failed", "Unknown", "NotChecked"),  # the run failed before any verdict
    ({"metadata": {"name": "gate"}, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, None,
     "Running", "Unknown", "Pending"),
])
def test_the_verdict_reaches_the_status(rj, prog, phase, met, reason):
    status = status_from(gate(), rj, None, prog)
    assert status["phase"] == phase
    assert (cond(status, "ExpectationsMet")["status"], cond(status, "ExpectationsMet")["reason"]) == (met, reason)
    if met == "False":
        assert cond(status, "Stalled")["reason"] == "ExpectationsNotMet"
        assert status["message"].startswith("expectation not met: ")
    if prog is not None:
        assert status["expectations"] == [c for c in prog.model_dump(mode="json", by_alias=True,
                                                                      exclude_none=True)["result"]["expectations"]]


def test_the_first_failure_is_in_the_condition_message():
    status = status_from(gate(), rayjob("FAILED"), None, progress("Failed", LOSS_OK, MEMORY_MISS))
    assert cond(status, "ExpectationsMet")["message"] == "maxPeakMemoryGiB: peak memory (GiB, RSS) 0.8 > 0.01"


def test_no_expect_no_condition():
    status = status_from(gate(expect=None), rayjob("SUCCEEDED"), None, None)
    assert status["phase"] == "Succeeded" and cond(status, "ExpectationsMet") is None
    assert status["expectations"] is None


def test_a_missing_baseline_stalls_before_launch():
    status = status_for_baseline(gate(previous={}), "ConfigMap ml/release-baseline does not exist")
    assert (status["phase"], cond(status, "Stalled")["status"]) == ("Pending", "True")
    assert cond(status, "ExpectationsMet")["reason"] == "BaselineNotFound"


def as_object(status, generation=1):
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": "gate", "namespace": "ml", "generation": generation},
            "status": {k: v for k, v in status.items() if v is not None}}


def test_argocd_health_lua_reads_a_failed_expectation_degraded():
    from tests.unit.test_argocd_health import run_health

    failed = status_from(gate(), rayjob("FAILED"), None, progress("Failed", MEMORY_MISS))
    health = run_health(as_object(failed))
    assert health["status"] == "Degraded" and "maxPeakMemoryGiB" in health["message"]
    passed = status_from(gate(), rayjob("SUCCEEDED"), None, progress("Succeeded", LOSS_OK))
    assert run_health(as_object(passed))["status"] == "Healthy"
    missing = status_for_baseline(gate(previous={}), "ConfigMap ml/release-baseline does not exist")
    assert run_health(as_object(missing))["status"] == "Degraded"


def test_kstatus_reads_a_failed_expectation_failed():
    from tests.cluster import build

    tool = build.bin_dir() / "kstatus"
    if not tool.exists():
        pytest.skip(f"kstatus tool not built ({tool}); build it with python -m tests.cluster build")
    objects = [as_object(status_from(gate(), rayjob("FAILED"), None, progress("Failed", MEMORY_MISS))),
               as_object(status_from(gate(), rayjob("SUCCEEDED"), None, progress("Succeeded", LOSS_OK)))]
    out = subprocess.run([str(tool)], input=json.dumps(objects), capture_output=True, text=True, check=True)
    assert [json.loads(line)["status"] for line in out.stdout.splitlines()] == ["Failed", "Current"]


@pytest.mark.parametrize("baseline, volume, path", [
    ({"configMapName": "release-baseline"}, {"configMap": {"name": "release-baseline"}},
     f"{BASELINE_MOUNT}/report.json"),
    ({"claimName": "results", "path": "r1/report.json"},
     {"persistentVolumeClaim": {"claimName": "results", "readOnly": True}}, f"{BASELINE_MOUNT}/r1/report.json"),
])
def test_the_baseline_reaches_the_runtime_read_only(baseline, volume, path):
    import yaml

    objects = render(gate(expect={"baseline": baseline}, previous=None))
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}))
    assert yaml.safe_load(config["data"]["config.yaml"])["baselinePath"] == path
    rayjob_obj = objects[-1]
    head = rayjob_obj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "baseline", **volume} in head["volumes"]
    mounts = [m for c in head["containers"] for m in c.get("volumeMounts", [])]
    assert {"name": "baseline", "mountPath": BASELINE_MOUNT, "readOnly": True} in mounts
    plain = render(gate(expect=None, previous=None))
    assert "baselinePath" not in next(o for o in plain if o["kind"] == "ConfigMap")["data"]["config.yaml"]


def test_an_api_error_keeps_the_verdict():
    from forge_replay.controller.status import status_for_api_error

    failed = status_from(gate(), rayjob("FAILED"), None, progress("Failed", MEMORY_MISS))
    stalled = status_for_api_error(1, 403, "forbidden", failed)
    assert cond(stalled, "ExpectationsMet") == cond(failed, "ExpectationsMet")
