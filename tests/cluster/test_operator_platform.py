"""Issue 13 on the control plane: what a platform team running the operator against KubeRay (and Kueue) needs.

Each test here failed before its fix (see docs/operator.md). Like tests/cluster/test_operator.py, states that
need a real Ray head are reached by patching the RayJob's status as KubeRay would.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from tests.cluster.operator_harness import (Api, OperatorProcess, apply, change_behind_the_api_servers_back, claim_doc,
                                           job_doc, wait_for)
# The same fixtures (and so the same FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY override) as test_operator.py.
from tests.cluster.test_operator import _finish_pod, api, operator, operator_kubeconfig  # noqa: F401

pytestmark = pytest.mark.cluster


def _condition(api: Api, namespace: str, name: str, kind: str) -> dict:
    return api.condition(namespace, name, kind)


def _events(control_plane, namespace: str, name: str) -> list[dict]:
    out = control_plane.kubectl("get", "events", "-n", namespace, "--field-selector",
                                f"involvedObject.name={name}", "-o", "json").stdout
    return json.loads(out)["items"]


def _runtime_config(api: Api, namespace: str, name: str) -> dict:
    config = api.get("v1", "ConfigMap", namespace, f"{name}-config")
    return yaml.safe_load(config["data"]["config.yaml"])


# 1. GPUs held 24 h -----------------------------------------------------------------------------------------


def test_a_finished_jobs_ray_cluster_is_released_within_five_minutes_by_default(control_plane, operator, api,
                                                                                 namespace) -> None:
    doc = job_doc("short-ttl", namespace)
    del doc["spec"]["ttlSecondsAfterFinished"]
    apply(control_plane, doc)
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "short-ttl"))
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    assert 0 < rayjob["spec"]["ttlSecondsAfterFinished"] <= 300
    # the API server refuses a TTL KubeRay's int32 field cannot hold
    refused = control_plane.kubectl("apply", "-f", "-", check=False,
                                    input=json.dumps(job_doc("huge-ttl", namespace, ttlSecondsAfterFinished=2**31)))
    assert refused.returncode != 0 and "ttlSecondsAfterFinished" in refused.stderr


# 2. Results overwritten ------------------------------------------------------------------------------------


def test_jobs_sharing_a_results_claim_and_a_rerun_write_to_their_own_folders(control_plane, operator, api,
                                                                              namespace) -> None:
    shared = {"claimName": "forge-results"}
    apply(control_plane, [job_doc("one", namespace, results=shared), job_doc("two", namespace, results=shared)])
    for name in ("one", "two"):
        wait_for(f"{name}'s RayJob", lambda name=name: api.rayjob(namespace, name))
    folders = {}
    for name in ("one", "two"):
        uid = api.job(namespace, name)["metadata"]["uid"]
        folder = f"{namespace}/{name}/{uid.replace('-', '')[:8]}"
        assert _runtime_config(api, namespace, name)["resultsDir"] == f"/mnt/forge-replay/results/{folder}"
        status = wait_for("status.results", lambda name=name: api.status(namespace, name).get("results"))
        assert status == {"claimName": "forge-results", "path": folder}
        folders[name] = folder
    assert folders["one"] != folders["two"]
    # a re-run under the same name (delete, re-create) gets a folder of its own: the uid differs
    control_plane.kubectl("delete", "forgereplayjob", "one", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("one's children garbage-collected", lambda: not api.children(namespace, "one")["ConfigMap"], timeout=90)
    apply(control_plane, job_doc("one", namespace, results=shared))
    again = wait_for("the re-run's status.results", lambda: (r := api.status(namespace, "one").get("results"))
                     and r["path"] != folders["one"] and r, timeout=90)
    assert again["path"].startswith(f"{namespace}/one/")
    assert _runtime_config(api, namespace, "one")["resultsDir"] == f"/mnt/forge-replay/results/{again['path']}"


# 3. Suspend fights Kueue -----------------------------------------------------------------------------------


def _admit_like_kueue(api: Api, namespace: str, name: str) -> None:
    """What Kueue does to a RayJob it admits (kubernetes-sigs/kueue pkg/controller/jobs/rayjob/rayjob_controller.go,
    RunWithPodSetsInfo): spec.suspend=false, and the flavor's node selector merged into every pod template
    (podset.Merge). No Kueue runs here; this acts as its admission does."""
    rayjob = api.rayjob(namespace, name)
    cluster = rayjob["spec"]["rayClusterSpec"]
    flavor = {"cloud.example.com/flavor": "h200"}
    patch = {"spec": {"suspend": False, "rayClusterSpec": {
        "headGroupSpec": {"template": {"spec": {"nodeSelector": flavor}}},
        "workerGroupSpecs": [
            {**group, "template": {**group["template"], "spec": {**group["template"]["spec"],
                                                                  "nodeSelector": flavor}}}
            for group in cluster["workerGroupSpecs"]
        ],
    }}}
    api.kube.merge_patch("ray.io/v1", "RayJob", namespace, name, patch)


def test_kueue_owns_suspend_of_a_queued_job(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("queued", namespace, scheduling={"queueName": "h200-memtests"}))
    rayjob = wait_for("the RayJob, created suspended", lambda: api.rayjob(namespace, "queued"))
    assert rayjob["spec"]["suspend"] is True
    _admit_like_kueue(api, namespace, "queued")
    admitted = api.rayjob(namespace, "queued")["metadata"]["generation"]
    # suspending a queued job by spec is refused by the API server, naming Kueue's way
    refused = control_plane.kubectl("apply", "-f", "-", check=False, input=json.dumps(
        job_doc("queued", namespace, scheduling={"queueName": "h200-memtests"}, suspend=True)))
    assert refused.returncode != 0
    assert "spec.suspend" in refused.stderr and "Workload" in refused.stderr
    # the operator never re-suspends what Kueue admitted (that would tear the Ray cluster down and up again)
    time.sleep(12)  # two resync rounds of the test operator (5 s)
    after = api.rayjob(namespace, "queued")
    assert after["spec"]["suspend"] is False
    assert after["metadata"]["generation"] == admitted


# 4. Pull secrets reach the head only -----------------------------------------------------------------------


def test_every_pod_pulls_with_the_runtime_account_and_spec_pod(control_plane, operator, api, namespace) -> None:
    pod = {"imagePullSecrets": [{"name": "registry-creds"}], "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
           "annotations": {"example.com/team": "ml"}, "labels": {"team": "ml"}}
    apply(control_plane, job_doc("pulls", namespace, replay__verify=True, pod=pod))
    account = wait_for("the runtime ServiceAccount", lambda: api.get("v1", "ServiceAccount", namespace, "pulls-runtime"))
    assert account["imagePullSecrets"] == [{"name": "registry-creds"}]
    verify_pod = wait_for("the verify pod", lambda: (p := api.kube.list("v1", "Pod", namespace, "job-name=pulls-verify"))
                          and p[0])
    if (verify_pod.get("status") or {}).get("phase") != "Succeeded":  # no dumps PVC here: it cannot be scheduled
        _finish_pod(api, verify_pod, exit_code=0, message="4 of 4 dumps ok")
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "pulls"), timeout=90)
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"], "submitter": rayjob["spec"]["submitterPodTemplate"]}
    templates |= {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    # KubeRay creates the head and worker pods from these templates
    live = wait_for("KubeRay's head and worker pods", lambda: len(
        pods := api.kube.list("v1", "Pod", namespace, "forgereplay.io/job=pulls,forgereplay.io/role in (head,trainer)"))
        >= 2 and pods, timeout=120)
    live.append(verify_pod)
    for where, spec, meta in ([(w, t["spec"], t["metadata"]) for w, t in templates.items()]
                              + [(p["metadata"]["name"], p["spec"], p["metadata"]) for p in live]):
        assert spec.get("serviceAccountName") == "pulls-runtime", where
        assert spec.get("imagePullSecrets") == [{"name": "registry-creds"}], where
        assert meta["labels"]["team"] == "ml" and meta["annotations"]["example.com/team"] == "ml", where
        assert {"name": "HF_HUB_OFFLINE", "value": "1"} in spec["containers"][0].get("env", []), where


# 5. A succeeded job reported Failed ------------------------------------------------------------------------


def test_the_runtimes_result_survives_the_rayjob(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("vanish", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "vanish"))
    api.patch_rayjob_status(namespace, "vanish", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                  "rayClusterName": "vanish-raycluster-a"})
    wait_for("phase Running", lambda: api.status(namespace, "vanish").get("phase") == "Running")
    operator.stop()  # the operator is down while the job ends and KubeRay deletes the RayJob
    progress = {"completed": 4, "total": 4, "result": {"phase": "Succeeded", "finishedAt": "2026-11-30T10:00:00Z"}}
    control_plane.kubectl("patch", "configmap", "vanish-progress", "-n", namespace, "--type=merge",
                          "-p", json.dumps({"data": {"progress.json": json.dumps(progress)}}))
    control_plane.kubectl("delete", "rayjob", "vanish", "-n", namespace, "--wait=true", "--timeout=60s")
    operator.start()
    status = wait_for("phase Succeeded from the runtime's record",
                      lambda: (s := api.status(namespace, "vanish")).get("phase") in ("Succeeded", "Failed") and s,
                      timeout=90)
    assert status["phase"] == "Succeeded", status["message"]
    assert status["completionTime"] == "2026-11-30T10:00:00Z"
    assert status["rollouts"] == {"completed": 4, "total": 4}


# 6. Cluster-wide watches -----------------------------------------------------------------------------------


def test_child_watches_are_filtered_by_the_api_server(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("watched", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "watched"))
    audit = control_plane.audit_log

    def operator_requests():
        found = {}
        for line in audit.read_text().splitlines():
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            if "kopf" not in (entry.get("userAgent") or "") or entry.get("verb") not in ("list", "watch"):
                continue
            if ref.get("namespace") == namespace:
                found.setdefault(ref.get("resource"), []).append(entry["requestURI"])
        return found if {"configmaps", "jobs", "rayjobs"} <= set(found) else None

    found = wait_for("the operator's list/watch requests in the audit log", operator_requests)
    for resource, uris in found.items():
        for uri in uris:
            assert "labelSelector=" in uri and "forge-replay" in uri, f"{resource}: {uri}"


# 7. Permanent API errors retried forever -------------------------------------------------------------------


def test_a_permanent_api_error_stalls_the_job_with_the_apis_message(control_plane, operator, api,
                                                                     namespace) -> None:
    """A ValidatingAdmissionPolicy (the API server's own admission, no webhook server needed) refuses RayJobs in
    this namespace with 422 Invalid, as a policy webhook would."""
    policy = f"no-rayjobs-{namespace}"[:63]
    apply(control_plane, [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["ray.io"], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["rayjobs"]}]},
                  "validations": [{"expression": "false", "reason": "Invalid",
                                   "message": "RayJobs need a cost-center label here"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy},
         "spec": {"policyName": policy, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": namespace}}}}},
    ])
    try:
        # the policy takes a moment to be enforced: probe with a dry-run create until it refuses
        probe = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "probe", "namespace": namespace},
                 "spec": {"entrypoint": "true"}}
        wait_for("the policy enforced", lambda: control_plane.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False).returncode != 0, timeout=60)
        apply(control_plane, job_doc("refused", namespace))
        stalled = wait_for("Stalled=True", lambda: (c := _condition(api, namespace, "refused", "Stalled"))
                           .get("status") == "True" and c, timeout=60)
        assert stalled["reason"] == "Invalid"
        assert "cost-center" in stalled["message"] and "What to do" in stalled["message"]
        assert _condition(api, namespace, "refused", "Reconciling")["status"] == "False"
        warnings = wait_for("a Warning event", lambda: [e for e in _events(control_plane, namespace, "refused")
                                                         if e["type"] == "Warning" and e["reason"] == "Invalid"])
        assert "cost-center" in warnings[0]["message"]
    finally:
        control_plane.kubectl("delete", "validatingadmissionpolicybinding", policy, "--ignore-not-found")
        control_plane.kubectl("delete", "validatingadmissionpolicy", policy, "--ignore-not-found")
    # fixed: the next resync creates the RayJob and the job is no longer stalled
    wait_for("the RayJob once the policy is gone", lambda: api.rayjob(namespace, "refused"), timeout=90)
    wait_for("Stalled=False", lambda: _condition(api, namespace, "refused", "Stalled").get("status") == "False")


# 8. Refusals are silent ------------------------------------------------------------------------------------


def test_each_refused_change_posts_a_warning_event(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("frozen", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "frozen"))

    def refusals():
        return [e for e in _events(control_plane, namespace, "frozen")
                if e["type"] == "Warning" and e["reason"] == "SpecChangeRefused"]

    # the API server refuses such changes (test_the_api_server_refuses_...); the operator's refusal is the backstop
    change_behind_the_api_servers_back(control_plane, api, job_doc("frozen", namespace, replay__numRollouts=9,
                                                                   trainer={"nodes": 2, "gpusPerNode": 1}))
    first = wait_for("a Warning event for the refused change", refusals)
    assert "spec.trainer.nodes" in first[0]["message"]
    # kubectl get shows the rollouts the job runs (status.rollouts.total), not the refused value (issue 18)
    header, row = control_plane.kubectl("get", "forgereplayjob", "frozen", "-n", namespace).stdout.splitlines()
    columns = header.split()
    assert row.split()[columns.index("ROLLOUTS")] == "4"
    change_behind_the_api_servers_back(control_plane, api, job_doc("frozen", namespace,
                                                                   trainer={"nodes": 3, "gpusPerNode": 1}))
    wait_for("a second Warning event for the second refused change", lambda: len(refusals()) >= 2)
    time.sleep(11)  # resyncs repeat the status, not the event
    assert len(refusals()) == 2


# 9. KubeRay's reason is lost -------------------------------------------------------------------------------


@pytest.mark.parametrize(("deployment", "job_status", "reason"), [
    ("Failed", "RUNNING", "DeadlineExceeded"),
    ("Failed", "", "SubmissionFailed"),
    ("Running", "FAILED", "AppFailed"),  # KubeRay's grace period: the Ray job already failed
])
def test_kuberays_reason_reaches_the_condition(control_plane, operator, api, namespace, deployment, job_status,
                                               reason) -> None:
    apply(control_plane, job_doc("why", namespace))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "why"))
    patch = {"jobDeploymentStatus": deployment, "message": "what KubeRay said", "rayClusterName": "why-rc"}
    if job_status:
        patch["jobStatus"] = job_status
    if deployment == "Failed":
        patch["reason"] = reason
    api.patch_rayjob_status(namespace, "why", patch)
    status = wait_for("phase Failed", lambda: (s := api.status(namespace, "why")).get("phase") == "Failed" and s)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == reason
    assert "what KubeRay said" in status["message"] and "What to do" in status["message"]


# Settings ----------------------------------------------------------------------------------------------------


def test_deadline_reaches_the_rayjob_and_kubectl_shows_the_reason(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("deadline", namespace, activeDeadlineSeconds=7200))
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "deadline"))
    assert rayjob["spec"]["activeDeadlineSeconds"] == 7200
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"]
    api.patch_rayjob_status(namespace, "deadline", {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                                                    "message": "deadline passed"})
    wait_for("phase Failed", lambda: api.status(namespace, "deadline").get("phase") == "Failed")
    table = control_plane.kubectl("get", "forgereplayjob", "deadline", "-n", namespace).stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "PHASE", "REASON"] and "AGE" in table[0]
    assert table[1].split()[:3] == ["deadline", "Failed", "DeadlineExceeded"]


def test_user_roles_aggregate_into_the_built_in_edit_and_view(control_plane, namespace) -> None:
    """The chart's forgereplayjob-editor/-viewer, as helm renders them, reach whoever holds edit or view."""
    from tests.unit.test_chart import find, render_chart

    roles = [r for r in find(render_chart(), "ClusterRole") if r["metadata"]["name"].startswith("forgereplayjob-")]
    assert len(roles) == 2
    apply(control_plane, roles)
    apply(control_plane, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": who, "namespace": namespace}}
        for who in ("alice", "bob")] + [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": who, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": namespace}]}
        for who, role in (("alice", "edit"), ("bob", "view"))])

    def can(who: str, verb: str) -> bool:
        out = control_plane.kubectl("auth", "can-i", verb, "forgereplayjobs.forgereplay.io", "-n", namespace,
                                    f"--as=system:serviceaccount:{namespace}:{who}", check=False).stdout.strip()
        return out == "yes"

    try:
        wait_for("edit aggregating forgereplayjob-editor", lambda: can("alice", "create"), timeout=60)
        wait_for("view aggregating forgereplayjob-viewer", lambda: can("bob", "list"), timeout=60)
        assert can("alice", "delete") and not can("bob", "create") and not can("bob", "delete")
    finally:  # cluster-scoped: left behind, they would block every later helm install of the chart
        for role in roles:
            control_plane.kubectl("delete", "clusterrole", role["metadata"]["name"], "--ignore-not-found")


def test_two_replicas_only_the_lease_holder_acts(control_plane, api, namespace, tmp_path) -> None:
    """Leader election on a real Lease: the second replica waits (alive) and takes over when the first dies."""
    kubeconfig = str(control_plane.kubeconfig)  # the Lease Role is the chart's; the scenario is the Lease itself
    elect = ("--leader-election-namespace", namespace)
    first = OperatorProcess(kubeconfig, [namespace], tmp_path / "first.log", *elect).start()
    wait_for("the Lease held", lambda: (lease := api.kube.get("coordination.k8s.io/v1", "Lease", namespace,
                                                               "forge-replay-operator")) and lease, timeout=30)
    second = OperatorProcess(kubeconfig, [namespace], tmp_path / "second.log", *elect).start()  # alive on standby
    try:
        apply(control_plane, job_doc("led-1", namespace))
        wait_for("led-1's RayJob from the leader", lambda: api.rayjob(namespace, "led-1"))
        time.sleep(6)  # a resync round: the standby would reconcile too if it acted

        def reconciles(process: OperatorProcess) -> float:
            return sum(float(line.split()[-1]) for line in process.metrics().splitlines()
                       if line.startswith("forge_replay_operator_reconciles_total{"))

        assert reconciles(first) > 0 and reconciles(second) == 0
        holder = api.kube.get("coordination.k8s.io/v1", "Lease", namespace, "forge-replay-operator")
        assert holder["spec"]["holderIdentity"].endswith(f"_{first.process.pid}")
        first.kill()  # no clean-up: the Lease expires after 15 s
        wait_for("the standby taking the Lease", lambda: api.kube.get(
            "coordination.k8s.io/v1", "Lease", namespace, "forge-replay-operator")["spec"]["holderIdentity"]
            .endswith(f"_{second.process.pid}"), timeout=60)
        apply(control_plane, job_doc("led-2", namespace))
        wait_for("led-2's RayJob from the new leader", lambda: api.rayjob(namespace, "led-2"), timeout=60)
    finally:
        first.stop()
        second.stop()
        print(f"--- first ---\n{first.log_tail(30)}\n--- second ---\n{second.log_tail(30)}")


@pytest.mark.parametrize("elect", [False, True], ids=["alone", "lease-holder"])
def test_sigterm_stops_the_operator_within_seconds(control_plane, api, namespace, tmp_path, elect) -> None:
    """kopf waited for our stop flag in an executor thread that closing its loop joins: a SIGTERM'd operator hung
    until kopf's own SIGKILL 10 minutes later (Kubernetes kills it after the 30 s grace period: every rollout of
    the operator waited those 30 s). It exits 0 within seconds, also while it holds the Lease."""
    extra = ("--leader-election-namespace", namespace) if elect else ()
    process = OperatorProcess(str(control_plane.kubeconfig), [namespace], tmp_path / "operator.log", *extra).start()
    try:
        if elect:
            wait_for("the Lease held", lambda: api.kube.get("coordination.k8s.io/v1", "Lease", namespace,
                                                            "forge-replay-operator"), timeout=30)
        signalled = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        code = process.process.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert code == 0, process.log_tail()
    assert took < 10, f"{took:.1f} s from SIGTERM to exit\n{process.log_tail()}"


def test_a_stuck_launch_says_why_in_cluster_ready(control_plane, operator, api, namespace) -> None:
    """KubeRay's pods cannot be scheduled (no node has the asked-for GPU): the scheduler's reason reaches the job."""
    apply(control_plane, job_doc("nowhere", namespace, scheduling={"nodeSelector": {"nvidia.com/gpu.product": "B300"}}))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "nowhere"))
    cluster = wait_for("ClusterReady naming the scheduler's reason",
                       lambda: (c := _condition(api, namespace, "nowhere", "ClusterReady")).get("reason") == "PodsNotReady"
                       and c, timeout=120)
    assert "cannot be scheduled" in cluster["message"]
    assert api.status(namespace, "nowhere")["phase"] == "Launching"


def test_claims_are_checked_before_anything_is_requested(control_plane, operator, api, namespace) -> None:
    """A missing claim, then a ReadWriteOnce results claim: Pending with the reason and a Warning event, no
    child created; a ReadWriteMany claim lets the job launch (the spec may change until then)."""
    doc = job_doc("claims", namespace, results={"claimName": "missing-results"})
    apply(control_plane, doc, claims=False)
    apply(control_plane, claim_doc("rollout-dumps", namespace, "ReadOnlyMany"), claims=False)
    status = wait_for("ClaimNotFound", lambda: (s := api.status(namespace, "claims")).get("phase") == "Pending"
                      and _condition(api, namespace, "claims", "ClusterReady").get("reason") == "ClaimNotFound" and s)
    assert f"PersistentVolumeClaim {namespace}/missing-results (spec.results.claimName) does not exist" in \
        status["message"]
    assert "ReadWriteMany" in status["message"]
    wait_for("a ClaimNotFound Warning event", lambda: [e for e in _events(control_plane, namespace, "claims")
                                                       if e["type"] == "Warning" and e["reason"] == "ClaimNotFound"])
    assert api.rayjob(namespace, "claims") is None
    assert not any(api.children(namespace, "claims").values())

    apply(control_plane, claim_doc("rwo-results", namespace, "ReadWriteOnce"), claims=False)
    doc["spec"]["results"] = {"claimName": "rwo-results"}
    apply(control_plane, doc, claims=False)
    message = wait_for("ClaimAccessMode", lambda: (c := _condition(api, namespace, "claims", "ClusterReady"))
                       .get("reason") == "ClaimAccessMode" and c["message"])
    assert "rwo-results (spec.results.claimName) has access modes ReadWriteOnce" in message
    wait_for("a ClaimAccessMode Warning event", lambda: [e for e in _events(control_plane, namespace, "claims")
                                                         if e["reason"] == "ClaimAccessMode"])
    assert api.rayjob(namespace, "claims") is None

    apply(control_plane, claim_doc("shared-results", namespace, "ReadWriteMany"), claims=False)
    doc["spec"]["results"] = {"claimName": "shared-results"}
    apply(control_plane, doc, claims=False)
    wait_for("the RayJob once the claims can be mounted", lambda: api.rayjob(namespace, "claims"))
    wait_for("Stalled=False", lambda: _condition(api, namespace, "claims", "Stalled").get("status") == "False")


def test_the_api_server_refuses_a_spec_change_after_launch(control_plane, operator, api, namespace) -> None:
    apply(control_plane, job_doc("cel", namespace))
    wait_for("status.launchedGeneration", lambda: api.status(namespace, "cel").get("launchedGeneration"))
    changed = job_doc("cel", namespace, trainer={"nodes": 2, "gpusPerNode": 1}, image="other:1")
    refused = control_plane.kubectl("apply", "-f", "-", check=False, input=json.dumps(changed))
    assert refused.returncode != 0
    assert "spec.trainer: Forbidden: spec.trainer cannot change once the job is launched" in refused.stderr
    assert "spec.image: Forbidden" in refused.stderr
    assert api.job(namespace, "cel")["spec"]["trainer"]["nodes"] == 1
    # suspend is the one field that may change; re-applying the launched spec is no change at all
    apply(control_plane, job_doc("cel", namespace, suspend=True), claims=False)
    wait_for("RayJob suspended", lambda: api.rayjob(namespace, "cel")["spec"].get("suspend") is True)
    apply(control_plane, job_doc("cel", namespace), claims=False)
