"""The chart on the real control plane: install/upgrade/uninstall with the real helm, RBAC checked by the
real RBAC authorizer, and every operator scenario of test_operator.py rerun under the chart's
ServiceAccount token instead of the admin certificate.

Helpers here (``install_chart``, ``service_account_kubeconfig``, ``chart_operator_kubeconfig``) are also
used by test_kstatus.py, and ``chart_operator_kubeconfig`` can be named in
FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY (tests/cluster/operator_harness.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

# Every scenario of the operator's own cluster tests, collected again in this module: the
# `operator_kubeconfig` fixture below makes them run under the chart's ServiceAccount.
from tests.cluster.test_operator import *  # noqa: F401,F403
from tests.cluster.test_operator import api  # noqa: F401  (fixture, explicit for readers)
from tests.cluster.operator_harness import OperatorProcess, job_doc, wait_for
from tests.unit.test_chart import CHART, helm_binary, render_chart

pytestmark = pytest.mark.cluster

SA_SUFFIX = "forge-replay-operator"


def release_name(namespace: str) -> str:
    """A short, unique Helm release name for a test namespace (release names are at most 53 characters)."""
    return "fro-" + hashlib.sha1(namespace.encode()).hexdigest()[:10]


def helm(control_plane: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary()), f"--kubeconfig={control_plane.kubeconfig}", *args],
                            capture_output=True, text=True, timeout=180)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def install_chart(control_plane: Any, release: str, release_namespace: str, values: dict[str, Any]) -> str:
    """`helm install` of the chart; returns the operator's ServiceAccount name."""
    values_path = Path(control_plane.workdir) / f"values-{release}.yaml"
    values_path.write_text(yaml.safe_dump(values))
    helm(control_plane, "install", release, str(CHART), "--namespace", release_namespace, "--create-namespace",
         "--values", str(values_path))
    return f"{release}-{SA_SUFFIX}"


def service_account_kubeconfig(control_plane: Any, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that authenticates with a TokenRequest token of ``service_account`` (no admin rights)."""
    token = control_plane.kubectl("create", "token", service_account, "-n", namespace,
                                  "--duration=2h").stdout.strip()
    admin = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    user = f"system:serviceaccount:{namespace}:{service_account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "chart-sa",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "chart-sa", "context": {"cluster": cluster["name"], "user": user}}],
    }))
    path.chmod(0o600)
    return path


def chart_operator_kubeconfig(control_plane: Any, namespace: str) -> Path:
    """Install the chart watching ``namespace`` (release in ``<namespace>-op``); the operator SA's kubeconfig.

    The release is uninstalled by ``uninstall_chart_for`` (cluster-scoped objects outlive the namespace).
    """
    release, release_namespace = release_name(namespace), f"{namespace}-op"[:63]
    service_account = install_chart(control_plane, release, release_namespace,
                                    # the user-facing ClusterRoles have fixed names: one release per cluster
                                    # owns them, and these per-test releases must not collide on them
                                    {"crds": {"install": False}, "watchNamespaces": [namespace],
                                     "rbac": {"userRoles": False}})
    return service_account_kubeconfig(control_plane, release_namespace, service_account,
                                      Path(control_plane.workdir) / f"{release}.kubeconfig")


def uninstall_chart_for(control_plane: Any, namespace: str) -> None:
    release, release_namespace = release_name(namespace), f"{namespace}-op"[:63]
    helm(control_plane, "uninstall", release, "--namespace", release_namespace, "--wait", "--timeout=60s",
         check=False)
    control_plane.kubectl("delete", "namespace", release_namespace, "--wait=false", "--ignore-not-found",
                          check=False)


@pytest.fixture
def operator_kubeconfig(control_plane, namespace) -> str:  # noqa: F811 (overrides test_operator's)
    """The operator of every imported scenario runs with the chart's ServiceAccount token."""
    path = chart_operator_kubeconfig(control_plane, namespace)
    yield str(path)
    uninstall_chart_for(control_plane, namespace)


@pytest.fixture
def operator(operator_kubeconfig, namespace, tmp_path):  # noqa: F811 (overrides test_operator's)
    """The operator of the imported scenarios; afterwards its log must show no refused request."""
    process = OperatorProcess(operator_kubeconfig, [namespace], tmp_path / "operator.log").start()
    yield process
    process.stop()
    print(f"--- operator log (chart ServiceAccount) ---\n{process.log_tail(80)}")
    refused = [line for line in process.log_path.read_text(errors="replace").splitlines()
               if "forbidden" in line.lower() or "not enough permissions" in line.lower()]
    assert not refused, "the operator was refused requests under the chart's RBAC:\n" + "\n".join(refused[:20])


def can_i(control_plane: Any, kubeconfig: Path, verb: str, resource: str, namespace: str | None) -> bool:
    """A SelfSubjectAccessReview as the kubeconfig's identity, answered by the real RBAC authorizer.

    ``resource`` reads like kubectl's: ``pods``, ``pods/log``, ``rayjobs.ray.io``,
    ``forgereplayjobs.forgereplay.io/status``. The review names group and resource explicitly, so it does
    not depend on kubectl's discovery cache.
    """
    plural_group, _, subresource = resource.partition("/")
    plural, _, group = plural_group.partition(".")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": plural,
                                              "subresource": subresource, "namespace": namespace or ""}}}
    result = subprocess.run([str(control_plane.binaries["kubectl"]), f"--kubeconfig={kubeconfig}", "create", "-f", "-",
                             "-o", "json"], input=json.dumps(review), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"SelfSubjectAccessReview {verb} {resource}: {result.stderr}"
    return bool(json.loads(result.stdout)["status"].get("allowed"))


# ------------------------------------------------------------------------------------- the chart


def test_rendered_rules_name_real_resources_and_verbs(control_plane) -> None:
    """Every (apiGroup, resource, verb) the chart grants exists on a real API server with KubeRay's CRDs."""
    discovery: dict[tuple[str, str], set[str]] = {}
    for resource in json.loads(control_plane.kubectl("get", "--raw", "/api/v1").stdout)["resources"]:
        discovery[("", resource["name"])] = set(resource["verbs"])
    groups = json.loads(control_plane.kubectl("get", "--raw", "/apis").stdout)["groups"]
    for group in groups:
        version = group["preferredVersion"]["groupVersion"]
        for resource in json.loads(control_plane.kubectl("get", "--raw", f"/apis/{version}").stdout)["resources"]:
            discovery[(group["name"], resource["name"])] = set(resource["verbs"])
    objects = render_chart({"watchNamespaces": ["a"]}) + render_chart()
    for role in (o for o in objects if o["kind"] in ("Role", "ClusterRole")):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    if resource.endswith("/finalizers"):
                        # Authorization-only subresource (OwnerReferencesPermissionEnforcement checks
                        # `update` on it): not served, so not in discovery; its resource must be.
                        assert (group, resource.split("/")[0]) in discovery and rule["verbs"] == ["update"]
                        continue
                    assert (group, resource) in discovery, f"{role['metadata']['name']}: no resource {group}/{resource}"
                    unknown = set(rule["verbs"]) - discovery[(group, resource)]
                    assert not unknown, f"{group}/{resource} does not support {unknown}"


def test_install_upgrade_uninstall_keeps_the_crd_and_the_jobs(control_plane, namespace, tmp_path) -> None:
    """The README's path: helm install (with the CRD), upgrade, uninstall; the CRD and its jobs survive."""
    crd = "customresourcedefinitions.apiextensions.k8s.io/forgereplayjobs.forgereplay.io"
    release = release_name(namespace)
    # The control plane installed the CRD already (server-side apply); hand it to this release, as a
    # cluster admin would when moving the CRD under Helm (otherwise Helm refuses to take it over).
    control_plane.kubectl("label", crd, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    control_plane.kubectl("annotate", crd, f"meta.helm.sh/release-name={release}",
                          f"meta.helm.sh/release-namespace={namespace}", "--overwrite")
    install_chart(control_plane, release, namespace, {"watchNamespaces": [namespace]})
    try:
        kept = control_plane.kubectl("get", crd, "-o", "json").stdout
        assert json.loads(kept)["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        deployment = json.loads(control_plane.kubectl("get", "deployment", f"{release}-{SA_SUFFIX}", "-n", namespace,
                                                      "-o", "json").stdout)
        assert f"--namespace={namespace}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(job_doc("survivor", namespace)))

        values = tmp_path / "upgrade.yaml"
        values.write_text(yaml.safe_dump({"watchNamespaces": [namespace], "operator": {"verbose": True},
                                          "metrics": {"serviceMonitor": {"enabled": False}}}))
        helm(control_plane, "upgrade", release, str(CHART), "--namespace", namespace, "--values", str(values))
        deployment = json.loads(control_plane.kubectl("get", "deployment", f"{release}-{SA_SUFFIX}", "-n", namespace,
                                                      "-o", "json").stdout)
        assert "--verbose" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        history = helm(control_plane, "history", release, "--namespace", namespace, "-o", "json").stdout
        assert [h["revision"] for h in json.loads(history)] == [1, 2]
    finally:
        uninstall = helm(control_plane, "uninstall", release, "--namespace", namespace, "--wait", "--timeout=60s")
    assert "kept due to the resource policy" in uninstall.stdout + uninstall.stderr
    assert control_plane.kubectl("get", crd, check=False).returncode == 0, "uninstall deleted the CRD"
    assert control_plane.kubectl("get", "forgereplayjob", "survivor", "-n", namespace, check=False).returncode == 0
    for kind in ("deployment", "serviceaccount", "role", "rolebinding", "service"):
        assert control_plane.kubectl("get", kind, f"{release}-{SA_SUFFIX}" if kind != "service"
                                     else f"{release}-{SA_SUFFIX}-metrics", "-n", namespace,
                                     check=False).returncode != 0, f"{kind} left behind by helm uninstall"
    assert control_plane.kubectl("get", "clusterrole", f"{release}-{SA_SUFFIX}-discovery",
                                 check=False).returncode != 0


def test_schema_violations_are_refused_by_helm_install(control_plane, namespace, tmp_path) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(yaml.safe_dump({"replica": 3, "runAsUser": 0}))  # a misspelt key, a root uid
    result = helm(control_plane, "install", release_name(namespace), str(CHART), "--namespace", namespace,
                  "--values", str(values), check=False)
    assert result.returncode != 0
    assert "additional properties 'replica' not allowed" in result.stderr and "/runAsUser" in result.stderr
    assert control_plane.kubectl("get", "deployment", "-n", namespace, "-o", "name").stdout.strip() == ""


# --------------------------------------------------------------------------- what the token can do


@pytest.fixture
def chart_sa(control_plane, namespace):
    """The chart installed watching ``namespace`` only; its ServiceAccount's kubeconfig."""
    path = chart_operator_kubeconfig(control_plane, namespace)
    yield path
    uninstall_chart_for(control_plane, namespace)


NEEDED = [  # what the operator does in a namespace it watches (docs/operator.md, "API access")
    ("get", "forgereplayjobs.forgereplay.io"), ("list", "forgereplayjobs.forgereplay.io"),
    ("watch", "forgereplayjobs.forgereplay.io"), ("patch", "forgereplayjobs.forgereplay.io"),
    ("patch", "forgereplayjobs.forgereplay.io/status"), ("update", "forgereplayjobs.forgereplay.io/finalizers"),
    ("create", "rayjobs.ray.io"), ("patch", "rayjobs.ray.io"), ("watch", "rayjobs.ray.io"),
    ("create", "jobs.batch"), ("list", "pods"),
    ("create", "configmaps"), ("patch", "configmaps"), ("create", "serviceaccounts"),
    ("create", "roles.rbac.authorization.k8s.io"), ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("create", "events"),
]
REFUSED = [  # never needed: reading secrets, running code in pods, deleting or rewriting what it does not own
    ("get", "secrets"), ("list", "secrets"), ("watch", "secrets"), ("create", "secrets"),
    ("create", "pods"), ("create", "pods/exec"), ("get", "pods/log"), ("delete", "pods"),
    ("delete", "forgereplayjobs.forgereplay.io"), ("update", "forgereplayjobs.forgereplay.io"),
    ("delete", "rayjobs.ray.io"), ("delete", "configmaps"), ("delete", "jobs.batch"),
    ("create", "deployments.apps"), ("patch", "deployments.apps"), ("create", "rayclusters.ray.io"),
    ("patch", "roles.rbac.authorization.k8s.io"), ("escalate", "roles.rbac.authorization.k8s.io"),
    ("bind", "roles.rbac.authorization.k8s.io"), ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts"), ("create", "serviceaccounts/token"), ("patch", "nodes"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
]


def test_service_account_holds_exactly_what_the_operator_uses(control_plane, namespace, chart_sa) -> None:
    for verb, resource in NEEDED:
        assert can_i(control_plane, chart_sa, verb, resource, namespace), f"cannot {verb} {resource}"
    for verb, resource in REFUSED:
        assert not can_i(control_plane, chart_sa, verb, resource, namespace), f"may {verb} {resource}"
    # Nothing at all in a namespace it does not watch, and nothing cluster-wide beyond discovery.
    other = f"{namespace}-op"
    for verb, resource in NEEDED:
        assert not can_i(control_plane, chart_sa, verb, resource, "default"), f"may {verb} {resource} in default"
    assert not can_i(control_plane, chart_sa, "list", "configmaps", other)
    assert not can_i(control_plane, chart_sa, "list", "forgereplayjobs.forgereplay.io", None)
    # kopf's discovery: names of namespaces and CRDs (list/watch), nothing more.
    assert can_i(control_plane, chart_sa, "watch", "namespaces", None)
    assert can_i(control_plane, chart_sa, "list", "customresourcedefinitions.apiextensions.k8s.io", None)
    assert not can_i(control_plane, chart_sa, "get", "namespaces", None)
    assert not can_i(control_plane, chart_sa, "delete", "namespaces", None)


def test_service_account_token_is_refused_secrets_by_the_api_server(control_plane, namespace, chart_sa) -> None:
    """Not only `can-i`: real requests with the token get 403 for Secrets and for objects it does not manage."""
    control_plane.kubectl("create", "secret", "generic", "hf-token", "-n", namespace, "--from-literal=token=x")
    kubectl = [str(control_plane.binaries["kubectl"]), f"--kubeconfig={chart_sa}", "-n", namespace]
    for args in (["get", "secret", "hf-token"], ["get", "secrets"],
                 ["create", "deployment", "miner", "--image=busybox"],
                 ["delete", "configmap", "kube-root-ca.crt"]):
        result = subprocess.run(kubectl + args, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), (args, result.stdout, result.stderr)
    allowed = subprocess.run(kubectl + ["get", "forgereplayjobs"], capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr


def test_cluster_wide_operator_runs_under_the_cluster_role(control_plane, namespace, tmp_path) -> None:
    """Default values (watch the whole cluster): the operator, without --namespace, under the ClusterRole."""
    from tests.cluster.operator_harness import Api, apply

    release, release_namespace = release_name(namespace), f"{namespace}-op"
    service_account = install_chart(control_plane, release, release_namespace, {"crds": {"install": False}})
    process = None
    try:
        kubeconfig = service_account_kubeconfig(control_plane, release_namespace, service_account,
                                                tmp_path / "sa.kubeconfig")
        assert can_i(control_plane, kubeconfig, "watch", "forgereplayjobs.forgereplay.io", None)
        assert not can_i(control_plane, kubeconfig, "list", "secrets", None)
        process = OperatorProcess(str(kubeconfig), [], tmp_path / "operator.log").start()
        api = Api(str(control_plane.kubeconfig))
        apply(control_plane, job_doc("wide", namespace))
        wait_for("the RayJob", lambda: api.rayjob(namespace, "wide"), timeout=90)
        wait_for("status written", lambda: api.status(namespace, "wide").get("rayJobName") == "wide")
        log = process.log_tail(400)
        # a refused request logs "Forbidden" or its status 403; not a log line's milliseconds (",403")
        assert "Forbidden" not in log and not re.search(r"(?<![\d,.:])403(?!\d)", log), process.log_tail(80)
    finally:
        if process is not None:
            process.stop()
        uninstall_chart_for(control_plane, namespace)


READ_ONLY_ROOT = (
    # In a private mount namespace: /tmp stays writable (the chart's emptyDir there), then the root filesystem
    # goes read-only, as the Deployment's securityContext (readOnlyRootFilesystem) and volumes have it; then the
    # operator. /tmp is bind-mounted onto itself rather than replaced by a tmpfs: a checkout under /tmp (CI's
    # clone may live there) must stay visible to the operator's interpreter.
    'K="$(cat "$1")"; shift; mount --bind /tmp /tmp && D="$(mktemp -d /tmp/forge-replay-ro-XXXXXX)" '
    '&& printf "%s" "$K" > "$D/kubeconfig" && mount -o remount,bind,ro / '
    '&& exec env HOME="$D" PYTHONDONTWRITEBYTECODE=1 "$@" --kubeconfig "$D/kubeconfig"'
)


def test_operator_runs_with_a_read_only_root_filesystem(control_plane, namespace, chart_sa, tmp_path) -> None:
    """The operator as the chart runs it: read-only root, writable /tmp only, the chart's SA token."""
    import shutil
    import sys
    import urllib.request

    from tests.cluster.operator_harness import Api, apply, free_port

    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -o remount,bind,ro / && ! touch /read-only-probe 2>/dev/null"],
                           capture_output=True, text=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"cannot make a read-only root here (unshare): {probe.stderr if probe else 'no unshare'}")
    liveness, metrics = free_port(), free_port()
    log = tmp_path / "operator-ro.log"
    argv = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", READ_ONLY_ROOT, "sh", str(chart_sa),
            sys.executable, "-m", "forge_replay.commands.operator",
            "--liveness", f"http://127.0.0.1:{liveness}/healthz", "--metrics-port", str(metrics),
            "--resync-seconds", "5", "--namespace", namespace]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def live() -> bool:
            assert process.poll() is None, f"operator exited {process.returncode}:\n{log.read_text()[-3000:]}"
            with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2) as response:
                return response.status == 200

        wait_for("the read-only operator's liveness endpoint", live, timeout=90)
        api = Api(str(control_plane.kubeconfig))
        apply(control_plane, job_doc("readonly", namespace))
        wait_for("the RayJob", lambda: api.rayjob(namespace, "readonly"), timeout=90)
        wait_for("status written", lambda: api.status(namespace, "readonly").get("rayJobName") == "readonly")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            assert b"forge_replay_operator" in response.read()
    finally:
        if process.poll() is None:
            import os
            import signal

            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
    text = log.read_text(errors="replace")
    assert "Read-only file system" not in text and "forbidden" not in text.lower(), text[-3000:]
