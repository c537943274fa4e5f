"""Scenario 6: a release gate. A job with spec.expect and a baseline ConfigMap (the report.json of scenario 2's
run: debug replay is deterministic) ends Succeeded with ExpectationsMet=True; one whose memory limit is missed
ends Failed / ExpectationsNotMet, which the Argo CD health Lua reads as Degraded."""

from __future__ import annotations

import json

from tests.e2e.conftest import provide_volume, smoke_job, wait_for_phase, write_dumps
from tests.unit.test_argocd_health import run_health


def condition(job: dict, kind: str) -> dict:
    return next((c for c in job["status"].get("conditions", []) if c["type"] == kind), {})


def test_expectations_gate_a_release(real_cluster, smoke_run, e2e_namespace):
    namespace = e2e_namespace
    write_dumps(provide_volume(real_cluster, namespace, "smoke-dumps", "ReadOnlyMany"), 4)
    provide_volume(real_cluster, namespace, "results", "ReadWriteMany")
    baseline = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "baseline", "namespace": namespace},
                "data": {"report.json": (smoke_run.folder / "report.json").read_text()}}
    met = smoke_job(namespace, "gate-met", expect={
        "maxFallbacks": 0, "maxPeakMemoryGiB": 16, "baseline": {"configMapName": "baseline", "metrics": ["loss"]}})
    missed = smoke_job(namespace, "gate-missed", expect={"maxPeakMemoryGiB": 0.01})
    # One after the other: two Ray clusters at once leave no CPU on the 2-core node for either submitter.
    real_cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in (baseline, met)))
    finals = {"Succeeded", "Failed", "Stalled"}
    passed = wait_for_phase(real_cluster, namespace, "gate-met", finals, 900)
    assert passed["status"]["phase"] == "Succeeded", json.dumps(passed["status"], indent=1)
    assert condition(passed, "ExpectationsMet")["status"] == "True", passed["status"]["conditions"]
    assert run_health(passed)["status"] == "Healthy"

    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(missed))
    failed = wait_for_phase(real_cluster, namespace, "gate-missed", finals, 900)
    assert failed["status"]["phase"] == "Failed", json.dumps(failed["status"], indent=1)
    verdict = condition(failed, "ExpectationsMet")
    assert verdict["status"] == "False" and verdict["reason"] == "ExpectationsNotMet", verdict
    assert "maxPeakMemoryGiB" in verdict["message"], verdict
    assert run_health(failed)["status"] == "Degraded"
