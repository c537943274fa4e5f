"""On a shared pool (issue 33), on the control plane: a job whose Ray pods cannot be scheduled ends at its start
deadline, StartDeadlineExceeded naming the pod and the scheduler's words, and KubeRay deletes its Ray cluster at
once (the operator's patch: activeDeadlineSeconds 1, ttlSecondsAfterFinished 0); the per-job metrics appear with
the job, labelled by namespace and name, and go with it.

KubeRay, the scheduler and KWOK's fake GPU nodes run for real: the pods stay Pending because no node has the label
the job selects, as on a pool without free GPUs of the kind asked for."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.operator_harness import apply, job_doc, wait_for
from tests.cluster.test_kstatus import kstatus
from tests.cluster.test_operator import _bound_claim, api, operator, operator_kubeconfig, phase_is  # noqa: F401
from tests.unit.test_argocd_health import run_health

pytestmark = pytest.mark.cluster

NOWHERE = {"forgereplay.io/test-pool": "no-such-node"}


def test_start_deadline_ends_an_unschedulable_job_and_its_cluster_goes_at_once(control_plane, operator, api,
                                                                              namespace) -> None:
    _bound_claim(control_plane, namespace, "rollout-dumps")
    # A TTL of an hour: only the operator's teardown can delete the cluster within this test.
    apply(control_plane, job_doc("stuck", namespace, ttlSecondsAfterFinished=3600,
                                 scheduling={"nodeSelector": NOWHERE, "startDeadlineSeconds": 20}), claims=False)
    rayjob = wait_for("KubeRay's RayCluster for the RayJob", lambda: (r := api.rayjob(namespace, "stuck"))
                      and (r.get("status") or {}).get("rayClusterName") and r, timeout=120)
    cluster = rayjob["status"]["rayClusterName"]
    wait_for("ClusterReady=False PodsNotReady, the scheduler's words",
             lambda: "cannot be scheduled" in api.condition(namespace, "stuck", "ClusterReady").get("message", ""),
             timeout=60)

    assert api.status(namespace, "stuck")["phase"] == "Launching"
    status = wait_for("phase Failed at the start deadline", phase_is(api, namespace, "stuck", "Failed"), timeout=60)
    ready = api.condition(namespace, "stuck", "Ready")
    assert (ready["reason"], api.condition(namespace, "stuck", "Stalled")["reason"]) == ("StartDeadlineExceeded",) * 2
    assert "startDeadlineSeconds (20 s) of its creation" in status["message"]
    assert "cannot be scheduled" in status["message"] and "What to do:" in status["message"]
    assert status["outcome"] == "failed"
    spec = api.rayjob(namespace, "stuck")["spec"]
    assert (spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (1, 0)
    wait_for("the RayCluster deleted (not in an hour)", lambda: control_plane.kubectl(
        "get", "raycluster", cluster, "-n", namespace, "--ignore-not-found", "-o", "name").stdout.strip() == "",
        timeout=90)
    wait_for("no Ray pod left", lambda: control_plane.kubectl(
        "get", "pods", "-n", namespace, "-l", f"ray.io/cluster={cluster}", "-o", "name").stdout.strip() == "",
        timeout=90)
    after = api.status(namespace, "stuck")  # KubeRay's DeadlineExceeded does not replace the job's own reason
    assert (after["phase"], after["message"]) == ("Failed", status["message"])

    events = json.loads(control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                              "involvedObject.name=stuck", "-o", "json").stdout)["items"]
    assert any(e["type"] == "Normal" and e["reason"] == "PodsNotReady" for e in events)
    assert any(e["type"] == "Warning" and e["reason"] == "StartDeadlineExceeded" for e in events)
    obj = json.loads(control_plane.kubectl("get", "forgereplayjob", "stuck", "-n", namespace, "-o", "json").stdout)
    (verdict,) = kstatus([obj])
    assert verdict["status"] == "Failed"
    assert run_health(obj) == {"status": "Degraded", "message": status["message"]}
    wide = control_plane.kubectl("get", "frj", "stuck", "-n", namespace, "-o", "wide").stdout
    header, row = wide.splitlines()[:2]
    assert "MESSAGE" in header and "CLUSTER" in header and "StartDeadlineExceeded" in row


def _series(text: str, namespace: str, name: str) -> dict[tuple[str, str], float]:
    """The per-job samples of one job in /metrics text: {(metric, its one extra label value or ""): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if sample.name.startswith("forge_replay_job_") and (labels.pop("namespace", None), labels.pop(
                    "name", None)) == (namespace, name):
                assert len(labels) <= 1, sample  # per job: never a rank or a step
                out[(sample.name, next(iter(labels.values()), ""))] = sample.value
    return out


def test_per_job_metrics_come_with_the_job_and_go_with_it(control_plane, operator, api, namespace) -> None:
    _bound_claim(control_plane, namespace, "rollout-dumps")
    apply(control_plane, job_doc("counted", namespace, scheduling={"nodeSelector": NOWHERE}), claims=False)
    wait_for("the job Launching", phase_is(api, namespace, "counted", "Launching"), timeout=120)
    series = wait_for("the job's series", lambda: (s := _series(operator.metrics(), namespace, "counted"))
                      and s.get(("forge_replay_job_phase", "Launching")) == 1.0 and s, timeout=30)
    assert series[("forge_replay_job_phase", "Pending")] == 0.0
    assert series[("forge_replay_job_rollouts_planned", "")] == 4.0
    assert series[("forge_replay_job_admission_wait_seconds", "")] >= 0.0  # no queue: its RayJob's creation

    control_plane.kubectl("delete", "forgereplayjob", "counted", "-n", namespace, "--wait=false")
    wait_for("the job's series gone", lambda: not _series(operator.metrics(), namespace, "counted"), timeout=60)
