"""The Helm chart, rendered and linted by a real helm (built from its Go module in tests/cluster/go/helm).

The helpers at the top (``helm_binary``, ``render_chart``) are also used by the cluster tests.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "forge-replay-operator"
GENERATED_CRD = REPO / "crds" / "forgereplayjobs.forgereplay.io.yaml"
CHART_CRD_COPY = CHART / "files" / "crds" / GENERATED_CRD.name
KEEP = {"helm.sh/resource-policy": "keep"}
RELEASE, RELEASE_NAMESPACE = "fro", "forge-replay-system"
# Verbs and resources a least-privilege operator role must never hold.
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate", "delete", "deletecollection", "update"}
FORBIDDEN_RESOURCES = {"*", "secrets", "pods/exec", "pods/attach", "pods/portforward", "nodes", "clusterroles",
                       "clusterrolebindings", "customresourcedefinitions/status"}


def helm_binary() -> Path:
    """The helm built from tests/cluster/go/helm (built on first use; skips when Go is missing)."""
    from tests.cluster import build

    try:
        return build.binary_path("helm")
    except build.GoToolchainMissing as error:
        pytest.skip(f"helm is not built and cannot be: {error}")


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def _values_file(values: dict[str, Any]) -> str:
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-", delete=False)
    with handle:
        yaml.safe_dump(values, handle)
    return handle.name


def render_chart(values: dict[str, Any] | None = None, *, release: str = RELEASE,
                 namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """`helm template` of the chart with ``values``; the rendered objects in order."""
    path = _values_file(values or {})
    try:
        out = run_helm("template", release, str(CHART), "--namespace", namespace, "--values", path).stdout
    finally:
        Path(path).unlink()
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(values: dict[str, Any]) -> str:
    """stderr of a `helm template` expected to fail."""
    path = _values_file(values)
    try:
        result = run_helm("template", RELEASE, str(CHART), "--values", path, check=False)
    finally:
        Path(path).unlink()
    assert result.returncode != 0, f"helm accepted values it must refuse: {values}"
    return result.stderr


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


# ---------------------------------------------------------------------------------------------- CRD


def test_chart_crd_is_a_byte_copy_of_the_generated_crd() -> None:
    assert CHART_CRD_COPY.read_bytes() == GENERATED_CRD.read_bytes(), (
        f"{CHART_CRD_COPY.relative_to(REPO)} differs from the generated {GENERATED_CRD.relative_to(REPO)}: "
        f"run scripts/generate (or `cp {GENERATED_CRD.relative_to(REPO)} {CHART_CRD_COPY.relative_to(REPO)}`)"
    )


def test_rendered_crd_is_the_generated_crd_with_keep_policy() -> None:
    rendered = only(render_chart(), "CustomResourceDefinition")
    generated = yaml.safe_load(GENERATED_CRD.read_text())
    assert rendered["metadata"].pop("annotations") == KEEP
    assert rendered == generated, "the chart's CRD template changed the CRD beyond the keep annotation"


def test_crd_takes_extra_annotations_but_always_keeps() -> None:
    sync = {"argocd.argoproj.io/sync-options": "ServerSideApply=true,Prune=false"}
    rendered = only(render_chart({"crds": {"install": True, "annotations": sync}}), "CustomResourceDefinition")
    assert rendered["metadata"]["annotations"] == {**sync, **KEEP}
    assert "helm.sh/resource-policy" in render_error({"crds": {"annotations": {"helm.sh/resource-policy": "delete"}}})


def test_crd_can_be_left_out() -> None:
    assert find(render_chart({"crds": {"install": False}}), "CustomResourceDefinition") == []


# ------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("values", [
    {},
    {"watchNamespaces": ["team-a", "team-b"], "rbac": {"create": True, "discovery": False},
     "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
     "image": {"repository": "registry.example.com:5000/ml/forge-replay-operator",
               "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
     "runtimeImage": {"repository": "registry.example.com/ml/forge-replay-runtime", "tag": "0.1.0-cu129"},
     "serviceAccount": {"create": False, "name": "forge-replay"}, "crds": {"install": False}},
], ids=["defaults", "namespaced-servicemonitor-digest"])
def test_helm_lint_strict(values: dict[str, Any]) -> None:
    path = _values_file(values)
    try:
        result = run_helm("lint", "--strict", str(CHART), "--values", path, check=False)
    finally:
        Path(path).unlink()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# ----------------------------------------------------------------------------------- deployment


def test_deployment_defaults_are_hardened_single_replica() -> None:
    from forge_replay.controller.settings import DEFAULT_RUNTIME_IMAGE

    deployment = only(render_chart(), "Deployment")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "RollingUpdate"}  # the Lease makes it safe
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(pod["securityContext"]["runAsUser"], int) and pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True and security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["image"] == "ghcr.io/forge-replay/operator:0.1.0"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in container["args"]
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    # The only writable path is an emptyDir at /tmp.
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/tmp"} and "emptyDir" in volume
    # The chart's default runtime image is the operator's own default (one release, one image).
    assert f"--runtime-image={DEFAULT_RUNTIME_IMAGE}" in container["args"]
    assert not any(a.startswith("--namespace") for a in container["args"]), "default watches the whole cluster"


def test_deployment_args_parse_with_the_operator_cli() -> None:
    """The chart's flags are exactly what `forge-replay operator` accepts, with the values meant."""
    from forge_replay.commands.operator import operator

    values = {"watchNamespaces": ["team-a", "team-b"], "runtimeUid": 4242,
              "runtimeImage": {"repository": "registry.example.com/rt", "digest": "sha256:" + "0f" * 32},
              "operator": {"resyncSeconds": 0, "watchServerTimeoutSeconds": 120, "verbose": True,
                           "imagePullSeconds": 90, "crashLoopRestarts": 5},
              "health": {"port": 8181}, "metrics": {"port": 9191}}
    (container,) = only(render_chart(values), "Deployment")["spec"]["template"]["spec"]["containers"]
    context = operator.make_context("operator", list(container["args"]))
    assert context.params["namespaces"] == ("team-a", "team-b")
    assert context.params["runtime_image"] == "registry.example.com/rt@sha256:" + "0f" * 32
    assert context.params["runtime_uid"] == 4242
    assert context.params["resync_seconds"] == 0
    assert context.params["watch_server_timeout"] == 120
    assert context.params["liveness"] == "http://0.0.0.0:8181/healthz"
    assert context.params["metrics_port"] == 9191
    assert context.params["verbose"] is True
    assert (context.params["image_pull_seconds"], context.params["crash_loop_restarts"]) == (90, 5)


def test_runtime_pod_resources_reach_the_rendered_pods() -> None:
    """runtimeResources -> the operator's flags -> the requests of the head and CPU trainer pods, so a CPU
    debug replay fits a small node (the test cluster's real node has 2 CPUs; the defaults ask for 7)."""
    import click

    from forge_replay.api import ForgeReplayJob
    from forge_replay.commands.operator import operator
    from forge_replay.controller.render import render
    from forge_replay.controller.settings import OperatorSettings

    small = {"head": {"cpu": "250m", "memory": "3Gi"}, "cpuWorker": {"cpu": "500m", "memory": "6Gi"}, "shmSize": "1Gi"}
    (container,) = only(render_chart({"runtimeResources": small}), "Deployment")["spec"]["template"]["spec"][
        "containers"]
    params = operator.make_context("operator", list(container["args"])).params
    settings = OperatorSettings(**{name: params[name] for name in (
        "head_cpu", "head_memory", "cpu_worker_cpu", "cpu_worker_memory", "shm_size")})
    job = ForgeReplayJob.model_validate(yaml.safe_load((REPO / "examples" / "smoke-cpu.yaml").read_text()))
    objects = render(job, settings)
    cluster = next(o for o in objects if o["kind"] == "RayJob")["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    assert head["containers"][0]["resources"]["requests"] == {"cpu": "250m", "memory": "3Gi"}
    (worker,) = cluster["workerGroupSpecs"]
    assert worker["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "6Gi"}
    shm = next(v for v in head["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    assert shm["emptyDir"]["sizeLimit"] == "1Gi"
    assert "runtimeResources" in render_error({"runtimeResources": {**small, "shmSize": "lots"}})
    with pytest.raises(click.BadParameter, match="not a Kubernetes quantity"):
        operator.make_context("operator", ["--head-memory=lots"])


def test_runtime_uid_matches_the_runtime_image_user() -> None:
    dockerfile = (REPO / "images" / "runtime" / "Dockerfile").read_text()
    user = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")][-1]
    (container,) = only(render_chart(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert f"--runtime-uid={user.split(':')[0]}" in container["args"]


def test_metrics_service_selects_the_operator_pod() -> None:
    objects = render_chart()
    service = only(objects, "Service")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    assert find(objects, "ServiceMonitor") == []


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objects = render_chart({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}})
    monitor, service = only(objects, "ServiceMonitor"), only(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_grafana_dashboard_is_a_sidecar_configmap_of_the_shipped_json_behind_its_flag() -> None:
    assert find(render_chart(), "ConfigMap") == []
    objects = render_chart({"metrics": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}}})
    (dashboard,) = find(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    shipped = CHART / "files" / "grafana" / "forge-replay-jobs.json"
    assert json.loads(dashboard["data"]["forge-replay-jobs.json"]) == json.loads(shipped.read_text())


def test_image_digest_wins_over_tag() -> None:
    digest = "sha256:" + "12" * 32
    (container,) = only(render_chart({"image": {"repository": "r.example/op", "tag": "x", "digest": digest}}),
                        "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"r.example/op@{digest}"


# ----------------------------------------------------------------------------------------- RBAC


USER_ROLES = {"forgereplayjob-editor", "forgereplayjob-viewer"}


def operator_roles(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The operator's rules on jobs and children: not the user-facing aggregated roles, not the leader Lease."""
    return [o for o in find(objects, kind)
            if o["metadata"]["name"] not in USER_ROLES and not o["metadata"]["name"].endswith("-leader")]


def _rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for role in operator_roles(objects, kind) for rule in role["rules"]]


def test_cluster_mode_rbac_is_least_privilege() -> None:
    objects = render_chart()
    roles = {o["metadata"]["name"]: o for o in operator_roles(objects, "ClusterRole")}
    assert set(roles) == {f"{RELEASE}-forge-replay-operator", f"{RELEASE}-forge-replay-operator-discovery"}
    assert operator_roles(objects, "Role") == [] and operator_roles(objects, "RoleBinding") == []
    service_account = only(objects, "ServiceAccount")["metadata"]
    for binding in find(objects, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": service_account["name"],
                                        "namespace": RELEASE_NAMESPACE}]
    for rule in _rules(objects, "ClusterRole"):
        if rule["resources"] == ["forgereplayjobs/finalizers"]:
            assert rule["verbs"] == ["update"], rule  # the one update: blockOwnerDeletion on our own jobs
            continue
        assert not set(rule["verbs"]) & FORBIDDEN_VERBS, rule
        assert not set(rule["resources"]) & FORBIDDEN_RESOURCES, rule
        if "pods" in rule["resources"]:  # notes and image digests come from one list by label, nothing else
            assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}, rule
        assert "*" not in rule["apiGroups"] and "resourceNames" not in rule, rule
    discovery = roles[f"{RELEASE}-forge-replay-operator-discovery"]["rules"]
    assert discovery == [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                          "verbs": ["list", "watch"]}]


def test_namespaced_mode_grants_the_same_rules_only_in_watched_namespaces() -> None:
    cluster_rules = next(o for o in find(render_chart(), "ClusterRole")
                         if not o["metadata"]["name"].endswith("-discovery"))["rules"]
    assert cluster_rules
    objects = render_chart({"watchNamespaces": ["team-a", "team-b"]})
    roles = operator_roles(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(r["rules"] == cluster_rules for r in roles)
    bindings = operator_roles(objects, "RoleBinding")
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["kind"]) for b in bindings) == [
        ("team-a", "Role"), ("team-b", "Role")]
    # Cluster-wide only the discovery role remains: CRD names, and namespace names for kopf's namespace watch.
    (cluster_role,) = operator_roles(objects, "ClusterRole")
    assert cluster_role["metadata"]["name"].endswith("-discovery")
    assert {(r["apiGroups"][0], r["resources"][0]) for r in cluster_role["rules"]} == {
        ("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
    assert all(r["verbs"] == ["list", "watch"] for r in cluster_role["rules"])

    strict = render_chart({"watchNamespaces": ["team-a"], "rbac": {"create": True, "discovery": False}})
    assert operator_roles(strict, "ClusterRole") == [] and find(strict, "ClusterRoleBinding") == []


def _operator_md_namespaced_grants() -> set[tuple[str, str, str]]:
    """(group, resource, verb) from the "API access" table of docs/operator.md, the operator's own list."""
    import re

    text = (REPO / "docs" / "operator.md").read_text()
    section = text[text.index("## API access"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    grants: set[tuple[str, str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        groups = [g.strip('"') for g in re.findall(r"`([^`]*)`", cells[0])]
        resources = re.findall(r"`([^`]*)`", cells[1])
        verbs = [v.strip() for v in cells[2].split(",")]
        grants |= {(g, r, v) for g in groups for r in resources for v in verbs}
    assert grants, "docs/operator.md has no API access table"
    return grants


def test_chart_grants_exactly_what_the_operator_docs_list() -> None:
    """The chart is the one source of the operator's rules (the cluster tests rerun every operator scenario
    under exactly them, rendered); docs/operator.md's table must say the same, no more and no less."""
    documented = _operator_md_namespaced_grants()
    (role,) = operator_roles(render_chart({"watchNamespaces": ["a"]}), "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == documented, (f"granted but not in docs/operator.md: {sorted(granted - documented)}; "
                                   f"documented but not granted: {sorted(documented - granted)}")


def test_rbac_can_be_left_to_the_cluster_admin() -> None:
    objects = render_chart({"rbac": {"create": False, "discovery": True}})
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & {o["kind"] for o in objects}


# ------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("values", "message"), [
    ({"replicas": 0}, "/replicas"),
    ({"runAsUser": 0}, "/runAsUser"),
    ({"runtimeUid": 0}, "/runtimeUid"),
    ({"image": {"repository": "r/op", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"repository": "r/op", "digest": "md5:abc"}}, "/image/digest"),
    ({"image": {"repository": "r/op:1.0"}}, "/image/repository"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"metrics": {"serviceMonitor": {"enabled": True, "interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"resources": {"requests": {"gpu": 1}}}, "additional properties 'gpu' not allowed"),
    ({"crds": {"install": "yes"}}, "/crds/install"),
    ({"crds": {"install": True, "annotations": {}, "keep": False}}, "additional properties 'keep' not allowed"),
    ({"operator": {"watchServerTimeoutSeconds": 0}}, "/operator/watchServerTimeoutSeconds"),
    ({"health": {"port": 9090}}, "health.port and metrics.port are both 9090"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
    ({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
     "metrics.serviceMonitor.enabled needs metrics.service.enabled"),
], ids=lambda v: json.dumps(v, sort_keys=True)[:60] if isinstance(v, dict) else None)
def test_bad_values_are_refused_with_the_field_named(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_schema_is_strict_everywhere() -> None:
    """Every object in values.schema.json that lists properties refuses unknown ones."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, f"{where or '/'} accepts unknown keys"
            for key, child in node.items():
                walk(child, f"{where}/{key}")
        elif isinstance(node, list):
            for index, child in enumerate(node):
                walk(child, f"{where}/{index}")

    walk(schema, "")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) == set(schema["properties"]), "values.yaml and values.schema.json list different keys"


def test_user_roles_aggregate_into_edit_admin_and_view_and_grant_nothing_else() -> None:
    roles = {o["metadata"]["name"]: o for o in find(render_chart(), "ClusterRole")}
    editor, viewer = roles["forgereplayjob-editor"], roles["forgereplayjob-viewer"]
    assert {k for k, v in editor["metadata"]["labels"].items() if v == "true" and "aggregate-to" in k} == {
        "rbac.authorization.k8s.io/aggregate-to-edit", "rbac.authorization.k8s.io/aggregate-to-admin"}
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    for role, verbs in ((editor, None), (viewer, {"get", "list", "watch"})):
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["forgereplay.io"], rule
            assert set(rule["resources"]) <= {"forgereplayjobs", "forgereplayjobs/status"}, rule
            if verbs is not None:  # read-only: the status subresource serves get alone
                assert set(rule["verbs"]) == (verbs if rule["resources"] == ["forgereplayjobs"] else {"get"})
    assert not any(b["roleRef"]["name"] in roles.keys() & USER_ROLES for b in find(render_chart(), "ClusterRoleBinding"))
    assert not USER_ROLES & {o["metadata"]["name"] for o in find(render_chart({"rbac": {
        "create": True, "discovery": True, "userRoles": False}}), "ClusterRole")}


def test_leader_election_lease_rules_and_replicas() -> None:
    objects = render_chart({"replicas": 2})
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert f"--leader-election-namespace={RELEASE_NAMESPACE}" in container["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    (lease_role,) = [r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-leader")]
    assert lease_role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["forge-replay-operator"],
         "verbs": ["get", "update"]}]
    from forge_replay.controller.settings import OperatorSettings

    assert OperatorSettings().leader_election_name == "forge-replay-operator"  # the name the Role allows
    single = render_chart({"leaderElection": {"enabled": False}})
    assert only(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not [r for r in find(single, "Role") if r["metadata"]["name"].endswith("-leader")]


def test_more_than_one_replica_needs_leader_election() -> None:
    stderr = render_error({"replicas": 2, "leaderElection": {"enabled": False}})
    assert "replicas > 1 needs leaderElection.enabled" in stderr
