"""The operator against the real control plane (etcd, apiserver, controllers, KWOK, KubeRay).

The operator runs as a real subprocess (`python -m forge_replay.commands.operator --namespace NS`), so tests can
kill and restart it. States that need a real Ray head (running, succeeded, failed) are reached by patching
the RayJob's status, as KubeRay would after talking to the Ray dashboard.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster.operator_harness import (Api, OperatorProcess, apply, change_behind_the_api_servers_back, job_doc,
                                           operator_kubeconfig_for, wait_for)

pytestmark = pytest.mark.cluster


@pytest.fixture
def operator_kubeconfig(control_plane, namespace) -> str:
    """The kubeconfig the operator subprocess uses (admin unless overridden: see operator_harness)."""
    return operator_kubeconfig_for(control_plane, namespace)


@pytest.fixture
def api(control_plane) -> Api:
    return Api(str(control_plane.kubeconfig))


@pytest.fixture
def operator(operator_kubeconfig, namespace, tmp_path):
    process = OperatorProcess(operator_kubeconfig, [namespace], tmp_path / "operator.log").start()
    yield process
    process.stop()
    print(f"--- operator log ---\n{process.log_tail(80)}")


def phase_is(api: Api, namespace: str, name: str, phase: str):
    return lambda: api.status(namespace, name).get("phase") == phase and api.status(namespace, name)


def test_apply_creates_owned_children_and_a_rayjob(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("shape", namespace, scheduling={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                                                               "priorityClassName": ""}))
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "shape"))
    job = api.job(namespace, "shape")
    uid = job["metadata"]["uid"]
    assert job["metadata"].get("finalizers") in (None, [])  # deleting never waits for the operator
    children = api.children(namespace, "shape")
    assert children == {
        "ConfigMap": ["shape-config", "shape-progress"],
        "ServiceAccount": ["shape-runtime"],
        "Role": ["shape-runtime"],
        "RoleBinding": ["shape-runtime"],
        "Job": [],
        "RayJob": ["shape"],
    }
    for api_version, kind, name in (("v1", "ConfigMap", "shape-config"), ("ray.io/v1", "RayJob", "shape")):
        owners = api.get(api_version, kind, namespace, name)["metadata"]["ownerReferences"]
        assert owners == [{"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "name": "shape",
                           "uid": uid, "controller": True, "blockOwnerDeletion": True}]
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "python -m forge_replay.runtime --config /etc/forge-replay/config.yaml"
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 60
    [trainer] = spec["rayClusterSpec"]["workerGroupSpecs"]
    pod = trainer["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    status = wait_for("status with the RayJob name", lambda: api.status(namespace, "shape").get("rayJobName"))
    assert status == "shape"
    full = api.status(namespace, "shape")
    assert full["observedGeneration"] == job["metadata"]["generation"]
    assert full["phase"] in ("Launching", "Running")
    assert {c["type"] for c in full["conditions"]} == {
        "Ready", "Reconciling", "Stalled", "SpecValid", "DumpsVerified", "ClusterReady"}
    events = control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                   "involvedObject.name=shape", "-o", "jsonpath={.items[*].reason}").stdout
    assert "Launching" in events or "Running" in events
    # kopf keeps its bookkeeping in our own annotations, never in status
    wait_for("kopf's annotations under forgereplay.io/", lambda: any(
        key.startswith("forgereplay.io/") for key in api.job(namespace, "shape")["metadata"].get("annotations") or {}))
    assert "kopf" not in api.status(namespace, "shape")


@pytest.mark.parametrize(("job_status", "phase", "ready", "stalled"), [
    ("SUCCEEDED", "Succeeded", "True", "False"),
    ("FAILED", "Failed", "False", "True"),
    ("STOPPED", "Failed", "False", "True"),
])
def test_status_follows_rayjob_completion(control_plane, operator, api, namespace,
                                          job_status, phase, ready, stalled) -> None:
    apply(control_plane, job_doc("done", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "done"))
    progress = ('{"completed": 4, "total": 4, "fallbacks": 1, "maskedOutSamples": 2, "rolloutIdMismatches": 1, '
                '"memory": {"peakAllocatedGiB": 71.3, "peakReservedGiB": 75.0, "rank": 3}}')
    control_plane.kubectl("patch", "configmap", "done-progress", "-n", namespace, "--type=merge",
                          "-p", '{"data": {"progress.json": %s}}' % __import__("json").dumps(progress))
    api.patch_rayjob_status(namespace, "done", {
        "jobDeploymentStatus": "Complete", "jobStatus": job_status, "message": f"ray job ended {job_status}",
        "rayClusterName": "done-raycluster-x", "startTime": "2026-11-29T11:00:00Z", "endTime": "2026-11-29T12:00:00Z",
    })
    status = wait_for(f"phase {phase}", phase_is(api, namespace, "done", phase))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == ready
    assert conditions["Stalled"]["status"] == stalled
    assert conditions["Reconciling"]["status"] == "False"
    assert status["completionTime"] == "2026-11-29T12:00:00Z"
    assert status["rayClusterName"] == "done-raycluster-x"
    status = wait_for("progress in status", lambda: api.status(namespace, "done").get("memory")
                      and api.status(namespace, "done"))
    assert status["rollouts"] == {"completed": 4, "total": 4}
    assert status["memory"] == {"peakAllocatedGiB": 71.3, "peakReservedGiB": 75.0, "rank": 3}
    assert status["fallbacks"] == 1
    assert (status["maskedOutSamples"], status["rolloutIdMismatches"]) == (2, 1)  # kept by the status schema
    if phase == "Failed":
        assert f"jobStatus {job_status}" in status["message"]


def test_status_follows_rayjob_running(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("run", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "run"))
    api.patch_rayjob_status(namespace, "run", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                               "rayClusterName": "run-raycluster-y"})
    status = wait_for("phase Running", phase_is(api, namespace, "run", "Running"))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["ClusterReady"]["status"] == "True"
    assert conditions["Reconciling"]["status"] == "True"


def test_a_head_pod_lost_mid_run_fails_the_job_saying_so(control_plane, operator, api, namespace) -> None:
    """KubeRay v1.5.0 fails the RayJob when the submitter dies with the head (SubmissionFailed, BackoffLimitExceeded);
    the operator, reading the cluster's pods under its own RBAC, says the head pod went away (scenario 5's message
    in real pods: tests/e2e/test_scenario5_faults.py)."""
    from datetime import datetime, timezone

    apply(control_plane, job_doc("lost", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "lost"))
    control_plane.kubectl("patch", "configmap", "lost-progress", "-n", namespace, "--type=merge",
                          "-p", '{"data": {"progress.json": "{\\"completed\\": 2, \\"total\\": 4}"}}')
    head = {"head": {"podName": "lost-raycluster-z-head-abcde", "podIP": "10.245.0.9"}, "state": "ready"}
    api.patch_rayjob_status(namespace, "lost", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                "rayClusterName": "lost-raycluster-z", "rayClusterStatus": head})
    wait_for("phase Running", phase_is(api, namespace, "lost", "Running"))
    ended = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # KubeRay tears down at endTime + TTL (60 s)
    api.patch_rayjob_status(namespace, "lost", {
        "jobDeploymentStatus": "Failed", "reason": "SubmissionFailed", "endTime": ended,
        "message": "Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has reached the specified "
                   "backoff limit"})
    status = wait_for("phase Failed", phase_is(api, namespace, "lost", "Failed"))
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["reason"] == "HeadPodLost", status
    assert ready["message"].startswith(
        "the Ray head pod lost-raycluster-z-head-abcde was deleted mid-run, after 2 of 4 rollouts"), ready["message"]


def _pod_of(api: Api, namespace: str, job_name: str):
    pods = api.kube.list("v1", "Pod", namespace, f"job-name={job_name}")
    return pods[0] if pods else None


def _finish_pod(api: Api, pod: dict, *, exit_code: int, message: str) -> None:
    meta = pod["metadata"]
    container = pod["spec"]["containers"][0]
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "message": message,
                  "startedAt": "2026-11-29T11:00:00Z", "finishedAt": "2026-11-29T11:00:05Z"}
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "startTime": "2026-11-29T11:00:00Z",
        "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                               "ready": False, "restartCount": 0, "started": False,
                               "state": {"terminated": terminated}}],
    }
    api.kube.merge_patch("v1", "Pod", meta["namespace"], meta["name"], {"status": status}, status=True)


def test_verify_failure_blocks_the_rayjob_and_reports_what_verify_printed(control_plane, operator, api,
                                                                           namespace) -> None:
    apply(control_plane, job_doc("badverify", namespace, replay__verify=True))
    wait_for("phase Verifying", phase_is(api, namespace, "badverify", "Verifying"))
    verify = api.get("batch/v1", "Job", namespace, "badverify-verify")
    command = verify["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["forge-replay", "dumps", "verify"]
    pod = wait_for("the verify pod", lambda: _pod_of(api, namespace, "badverify-verify"))
    # the dumps PVC has no volume here (no provisioner): the status says why verification does not progress
    wait_for("the unschedulable reason in the status", lambda: "persistentvolumeclaim" in (
        api.status(namespace, "badverify").get("message") or "").lower(), timeout=60)
    printed = "rollout 2: run/rollout_2.pt: missing (fallbackToFirst would use run/rollout_0.pt)\nFAILED: 1 of 4"
    _finish_pod(api, pod, exit_code=1, message=printed)
    status = wait_for("phase Failed", phase_is(api, namespace, "badverify", "Failed"), timeout=90)
    dumps = next(c for c in status["conditions"] if c["type"] == "DumpsVerified")
    assert dumps["status"] == "False" and printed in dumps["message"]
    assert api.rayjob(namespace, "badverify") is None  # no GPUs were ever requested


def test_verify_success_launches_the_rayjob(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("goodverify", namespace, replay__verify=True))
    wait_for("phase Verifying", phase_is(api, namespace, "goodverify", "Verifying"))
    assert api.rayjob(namespace, "goodverify") is None
    pod = wait_for("the verify pod", lambda: _pod_of(api, namespace, "goodverify-verify"))
    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        _finish_pod(api, pod, exit_code=0, message="4 of 4 dumps ok")
    wait_for("the RayJob after verification", lambda: api.rayjob(namespace, "goodverify"), timeout=90)
    dumps = wait_for("DumpsVerified=True",
                     lambda: api.condition(namespace, "goodverify", "DumpsVerified").get("status") == "True")
    assert dumps


def test_spec_change_after_launch_is_refused_but_suspend_propagates(control_plane, operator, api,
                                                                     namespace) -> None:
    apply(control_plane, job_doc("frozen", namespace))
    # KubeRay's first reconcile adds its finalizer with an Update of the whole object, which can bump the generation
    # (seen under load in a parallel run): compare from after KubeRay has taken the RayJob.
    before = wait_for("the RayJob as KubeRay has taken it",
                      lambda: (r := api.rayjob(namespace, "frozen")) and (r.get("status") or {}).get(
                          "jobDeploymentStatus") and r)
    # the API server refuses this (tests/cluster/test_operator_platform.py); the operator's own refusal is the backstop
    change_behind_the_api_servers_back(control_plane, api, job_doc("frozen", namespace,
                                                                   trainer={"nodes": 2, "gpusPerNode": 1}))
    spec_valid = wait_for("SpecValid=False", lambda: (c := api.condition(namespace, "frozen", "SpecValid"))
                          .get("status") == "False" and c)
    assert spec_valid["reason"] == "SpecChangeRefused"
    assert "spec.trainer.nodes" in spec_valid["message"]
    assert api.condition(namespace, "frozen", "Stalled")["status"] == "True"
    after = api.rayjob(namespace, "frozen")
    assert after["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1  # never half applied
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    # suspend is the one spec field that may change after launch (even alongside a refused change)
    change_behind_the_api_servers_back(control_plane, api, job_doc("frozen", namespace, suspend=True,
                                                                   trainer={"nodes": 2, "gpusPerNode": 1}))
    wait_for("RayJob suspended", lambda: api.rayjob(namespace, "frozen")["spec"].get("suspend") is True)
    # reverting the refused change clears the refusal; resuming propagates
    apply(control_plane, job_doc("frozen", namespace, suspend=False))
    wait_for("RayJob resumed", lambda: api.rayjob(namespace, "frozen")["spec"].get("suspend") is False)
    wait_for("SpecValid=True", lambda: api.condition(namespace, "frozen", "SpecValid").get("status") == "True")


def test_suspended_job_reports_suspended(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("sleepy", namespace, suspend=True))
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "sleepy"))
    assert rayjob["spec"]["suspend"] is True
    wait_for("phase Suspended", phase_is(api, namespace, "sleepy", "Suspended"), timeout=90)


def test_delete_removes_every_child(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("gone", namespace, replay__verify=True))
    wait_for("the verify Job", lambda: api.get("batch/v1", "Job", namespace, "gone-verify"))
    operator.stop()  # deletion must not need the operator (no finalizer)
    control_plane.kubectl("delete", "forgereplayjob", "gone", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_for("every child garbage-collected",
             lambda: not any(api.children(namespace, "gone").values()), timeout=90)


def test_operator_killed_mid_burst_creates_exactly_one_rayjob_per_job(control_plane, operator, api,
                                                                       namespace) -> None:
    names = [f"burst-{i:02d}" for i in range(50)]
    apply(control_plane, [job_doc(n, namespace, suspend=True) for n in names])
    wait_for("a few RayJobs", lambda: len(api.kube.list("ray.io/v1", "RayJob", namespace,
                                                          "app.kubernetes.io/managed-by=forge-replay")) >= 5,
             interval=0.1)
    operator.kill()
    operator.start()

    def all_suspended():
        return all(api.status(namespace, n).get("phase") == "Suspended" for n in names)

    wait_for("all 50 jobs Suspended", all_suspended, timeout=300, interval=2)
    rayjobs = api.kube.list("ray.io/v1", "RayJob", namespace, "app.kubernetes.io/managed-by=forge-replay")
    assert sorted(r["metadata"]["name"] for r in rayjobs) == names
    configs = api.kube.list("v1", "ConfigMap", namespace, "app.kubernetes.io/managed-by=forge-replay")
    assert len(configs) == 100
    # the restarted process learns every job's phase (resume handlers, then resync) for its jobs-by-phase gauge
    wait_for("the jobs gauge at 50 Suspended",
             lambda: 'forge_replay_operator_jobs{phase="Suspended"} 50.0' in operator.metrics(), timeout=60)


def _bound_claim(control_plane, namespace: str, claim: str) -> None:
    """A PVC already bound to a hostPath PV (the test plane runs no volume binder), so KWOK can run pods."""
    volume = f"{namespace}-{claim}"[:63]
    apply(control_plane, [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                  "hostPath": {"path": f"/tmp/{volume}"}, "claimRef": {"namespace": namespace, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": claim, "namespace": namespace,
                      "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
         "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}},
                  "volumeName": volume, "storageClassName": ""}},
    ])
    control_plane.kubectl("patch", "pv", volume, "--subresource=status", "--type=merge",
                          "-p", '{"status": {"phase": "Bound"}}')
    control_plane.kubectl("patch", "pvc", claim, "-n", namespace, "--subresource=status", "--type=merge", "-p",
                          '{"status": {"phase": "Bound", "accessModes": ["ReadOnlyMany"], "capacity": {"storage": "1Gi"}}}')


def test_status_follows_kuberay_and_kwok_end_to_end(control_plane, operator, api, namespace) -> None:
    """Verify pod (completed by KWOK) -> RayJob -> KubeRay's RayCluster on fake GPU nodes -> Running -> KubeRay
    gives up (no real Ray head behind the fake pods) -> Failed with KubeRay's message."""
    _bound_claim(control_plane, namespace, "rollout-dumps")
    apply(control_plane, job_doc("live", namespace, replay__verify=True, ttlSecondsAfterFinished=1), claims=False)
    wait_for("DumpsVerified=True (KWOK completes the verify pod)",
             lambda: api.condition(namespace, "live", "DumpsVerified").get("status") == "True", timeout=120)
    status = wait_for("phase Running on a ready cluster", phase_is(api, namespace, "live", "Running"), timeout=180)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["ClusterReady"]["status"] == "True"
    cluster = status["rayClusterName"]
    assert cluster and api.get("ray.io/v1", "RayJob", namespace, "live")["status"]["rayClusterName"] == cluster
    status = wait_for("phase Failed once KubeRay gives up", phase_is(api, namespace, "live", "Failed"), timeout=180)
    assert status["message"].startswith("RayJob live")
    assert status["completionTime"]
    reasons = control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                    "involvedObject.name=live", "-o", "jsonpath={.items[*].reason}").stdout.split()
    assert {"Verifying", "Running", "Failed"} <= set(reasons)
    # ttlSecondsAfterFinished: KubeRay deletes the Ray cluster (the GPUs) after the TTL; the result stays
    wait_for("the RayCluster deleted after the TTL",
             lambda: control_plane.kubectl("get", "raycluster", cluster, "-n", namespace, "--ignore-not-found",
                                           "-o", "name").stdout.strip() == "", timeout=120)
    time.sleep(2)
    after = api.status(namespace, "live")
    assert after["phase"] == "Failed" and after["rayClusterName"] == cluster


def test_spec_the_crd_lets_through_but_validate_refuses_gets_spec_valid_false(control_plane, operator, api,
                                                                               namespace) -> None:
    """The operator re-validates with the pydantic models: same message as `forge-replay validate`, no children."""
    doc = job_doc("badargs", namespace, replay__mode="forge",
                  rollout={"numGpus": 1, "numGpusPerEngine": 1, "engineArgs": {"--port": "30000"}})
    import json

    result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
    if result.returncode != 0:
        pytest.skip(f"the CRD refuses this spec itself now (good); pick another CRD-valid, model-invalid spec: "
                    f"{result.stderr.strip()}")
    spec_valid = wait_for("SpecValid=False", lambda: (c := api.condition(namespace, "badargs", "SpecValid"))
                          .get("status") == "False" and c)
    from forge_replay.api import SpecInvalid, parse_job

    with pytest.raises(SpecInvalid) as refused:
        parse_job(doc)
    assert spec_valid["message"] == "\n".join(str(p) for p in refused.value.problems)
    assert spec_valid["reason"] == "SpecInvalid"
    assert api.status(namespace, "badargs")["phase"] == "Failed"
    assert api.condition(namespace, "badargs", "Stalled")["status"] == "True"
    assert not any(api.children(namespace, "badargs").values())


def test_a_stretch_beyond_the_inline_models_positions_is_refused_before_launch_without_verify(control_plane, operator,
                                                                                              api, namespace) -> None:
    """verify: false runs no verify Job, yet a stretch past the inline model's positions (a llama config's default
    2048) could only fail in the trainer, with its GPUs held: the operator refuses it first, as validate does."""
    import json

    doc = job_doc("toolong", namespace, replay__stretch={"maxTokens": 4096})
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    spec_valid = wait_for("SpecValid=False", lambda: (c := api.condition(namespace, "toolong", "SpecValid"))
                          .get("status") == "False" and c)
    assert spec_valid["message"].startswith(
        "spec.replay.stretch.maxTokens: 4096 is more than the model's 2048 positions"), spec_valid
    assert api.status(namespace, "toolong")["phase"] == "Failed"
    assert not any(api.children(namespace, "toolong").values())


@pytest.mark.parametrize("case", ["forge-memtest", "debug-checkpoint", "forge-colocated-cpu"])
def test_rendered_objects_pass_strict_server_side_validation(control_plane, namespace, case) -> None:
    """Every object render() makes is accepted by the API server and KubeRay's CRD schema, no field unknown."""
    from pathlib import Path

    import yaml

    from forge_replay.api import parse_job
    from forge_replay.controller.render import render

    doc = yaml.safe_load((Path(__file__).parents[1] / "unit" / "golden" / "render" / f"{case}.in.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    assert_strict_dry_run(control_plane, render(parse_job(doc)))


def assert_strict_dry_run(control_plane, objects: list[dict]) -> None:
    """The API server (and KubeRay's CRD schema) accepts every object in a strict server-side dry run."""
    import json

    result = control_plane.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                   input="\n---\n".join(json.dumps(o) for o in objects), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(objects)


def test_queued_job_waits_for_kueue_admission(control_plane, operator, api, namespace) -> None:
    """With scheduling.queueName the RayJob is labelled for Kueue and created suspended (no Kueue here: it waits)."""
    apply(control_plane, job_doc("queued", namespace, scheduling={"queueName": "h200-memtests"}))
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "queued"))
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "h200-memtests"
    assert rayjob["spec"]["suspend"] is True
    status = wait_for("Pending for admission", lambda: (s := api.status(namespace, "queued")).get("phase") == "Pending"
                      and "QueuedForAdmission" in [c["reason"] for c in s["conditions"]] and s, timeout=90)
    assert "h200-memtests" in status["message"]
    assert api.condition(namespace, "queued", "Reconciling")["status"] == "True"


def test_foreign_object_with_a_child_name_is_never_adopted(control_plane, operator, api, namespace) -> None:
    """A ConfigMap named like a child but not owned by the job: the operator stops and says which object."""
    control_plane.kubectl("create", "configmap", "squatter-config", "-n", namespace, "--from-literal=a=b")
    apply(control_plane, job_doc("squatter", namespace))
    message = wait_for("the conflict in status.message",
                       lambda: "squatter-config" in (m := api.status(namespace, "squatter").get("message") or "") and m)
    assert "not owned by ForgeReplayJob squatter" in message
    assert api.rayjob(namespace, "squatter") is None
    control_plane.kubectl("delete", "configmap", "squatter-config", "-n", namespace)
    wait_for("the RayJob once the foreign object is gone", lambda: api.rayjob(namespace, "squatter"), timeout=90)
