"""Helpers for the operator's cluster tests: the operator as a real subprocess, waits, job specs.

The kubeconfig the operator runs with is the ``operator_kubeconfig`` fixture (admin by default). To run
the same scenarios under another identity (e.g. the chart's least-privilege ServiceAccount), either set
``FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY=module:function`` (``function(control_plane, namespace) -> path``),
or import the tests into your module and define your own ``operator_kubeconfig`` fixture there.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import yaml

from forge_replay.controller.kube import Kube
from forge_replay.runtime import ports

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE_JOB: dict[str, Any] = yaml.safe_load(
    """
apiVersion: forgereplay.io/v1alpha1
kind: ForgeReplayJob
metadata: {name: placeholder}
spec:
  replay:
    mode: debug
    dumps: {claimName: rollout-dumps, path: "run/rollout_{rollout_id}.pt"}
    numRollouts: 4
    verify: false
  model: {config: {architectures: [LlamaForCausalLM], hidden_size: 64}}
  trainer: {nodes: 1, gpusPerNode: 1}
  ttlSecondsAfterFinished: 60
"""
)


def job_doc(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A small debug-mode job; ``spec`` keys are merged into spec (dotted with __ for nesting)."""
    doc = copy.deepcopy(BASE_JOB)
    doc["metadata"] = {"name": name, "namespace": namespace}
    for dotted, value in spec.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def free_port() -> int:
    """A TCP port on 127.0.0.1, outside the ephemeral range (runtime/ports.py)."""
    return ports.free_port("127.0.0.1")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # the API may be briefly unavailable; keep the error for the message
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r:.2000})")


def operator_kubeconfig_for(control_plane: Any, namespace: str) -> str:
    """Admin kubeconfig, unless FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY names another source."""
    factory = os.environ.get("FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY")
    if factory:
        module, attr = factory.split(":")
        return str(getattr(importlib.import_module(module), attr)(control_plane, namespace))
    return str(control_plane.kubeconfig)


class OperatorProcess:
    """`python -m forge_replay.commands.operator --namespace NS` as a subprocess that can be killed and restarted."""

    def __init__(self, kubeconfig: str, namespaces: list[str], log_path: Path, *extra: str):
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_path = log_path
        self.extra = list(extra)
        self.process: subprocess.Popen | None = None
        self.liveness_port = 0
        self.metrics_port = 0

    def start(self, wait_ready: bool = True) -> "OperatorProcess":
        self.liveness_port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", "forge_replay.commands.operator", "--kubeconfig", self.kubeconfig,
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
                "--metrics-port", str(self.metrics_port), "--resync-seconds", "5", *self.extra]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        # Only --kubeconfig says where the cluster is: the flag itself is under test.
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {"PYTHONUNBUFFERED": "1"}
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                        start_new_session=True)
        log.close()
        if wait_ready:
            wait_for("the operator's liveness endpoint", self.alive_and_live, timeout=60)
        return self

    def alive_and_live(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"operator exited ({self.process and self.process.returncode}):\n{self.log_tail()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as response:
            return response.status == 200

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies mid-reconcile."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class Api:
    """Admin access for assertions, through the operator's own small REST client."""

    def __init__(self, kubeconfig: str):
        self.kube = Kube(kubeconfig)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get("forgereplay.io/v1alpha1", "ForgeReplayJob", namespace, name)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return (self.job(namespace, name) or {}).get("status") or {}

    def condition(self, namespace: str, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(namespace, name).get("conditions") or [] if c["type"] == kind), {})

    def rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get("ray.io/v1", "RayJob", namespace, name)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, namespace, name)

    def patch_rayjob_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.kube.merge_patch("ray.io/v1", "RayJob", namespace, name, {"status": status}, status=True)

    def children(self, namespace: str, job: str) -> dict[str, list[str]]:
        selector = f"forgereplay.io/job={job}"
        out = {}
        for api_version, kind in (("v1", "ConfigMap"), ("v1", "ServiceAccount"),
                                  ("rbac.authorization.k8s.io/v1", "Role"),
                                  ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("batch/v1", "Job"),
                                  ("ray.io/v1", "RayJob")):
            out[kind] = sorted(o["metadata"]["name"] for o in self.kube.list(api_version, kind, namespace, selector))
        return out


def claim_doc(name: str, namespace: str, *modes: str) -> dict[str, Any]:
    """A PersistentVolumeClaim (access ``modes``, ReadWriteMany by default); it stays Pending here (no PV)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": list(modes or ("ReadWriteMany",)), "resources": {"requests": {"storage": "1Gi"}}}}


def claims_for(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ReadWriteMany claims for every PVC the ForgeReplayJobs in ``docs`` name (the operator checks them)."""
    from forge_replay.api import parse_job
    from forge_replay.controller.claims import named_claims

    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in docs:
        if doc.get("kind") == "ForgeReplayJob":
            namespace = doc["metadata"]["namespace"]
            for claim in named_claims(parse_job(doc)):
                wanted[(namespace, claim.name)] = claim_doc(claim.name, namespace)
    return list(wanted.values())


def apply(control_plane: Any, doc: dict[str, Any] | list[dict[str, Any]], *, claims: bool = True) -> None:
    """kubectl apply ``doc``; with ``claims``, the PVCs its jobs name are created first (ReadWriteMany)."""
    docs = doc if isinstance(doc, list) else [doc]
    docs = (claims_for(docs) if claims else []) + docs
    control_plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))


def change_behind_the_api_servers_back(control_plane: Any, api: "Api", doc: dict[str, Any], attempts: int = 5) -> None:
    """Apply a spec change to a launched job as a CRD without the transition rules would take it, so the operator's
    own refusal is what is tested: status.launchedGeneration is dropped first (the API server's rules read it;
    the operator sets it again on its next status write, so a refused apply is retried)."""
    namespace, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    result = None
    for _ in range(attempts):
        api.kube.merge_patch("forgereplay.io/v1alpha1", "ForgeReplayJob", namespace, name,
                             {"status": {"launchedGeneration": None}}, status=True)
        result = control_plane.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
        if result.returncode == 0:
            return
    raise AssertionError(f"the API server kept refusing the change: {result.stderr if result else ''}")


def chart_operator_rules() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The operator's rules as the Helm chart grants them (namespaced Role, discovery ClusterRole), rendered
    by a real helm: the chart is their one source, so the least-privilege runs below test what ships.

    FORGE_REPLAY_OPERATOR_KUBECONFIG_FACTORY=tests.cluster.operator_harness:least_privilege_kubeconfig"""
    from tests.unit.test_chart import find, operator_roles, render_chart

    objects = render_chart({"watchNamespaces": ["rules"]})
    (role,) = operator_roles(objects, "Role")  # not the leader Lease's Role
    (discovery,) = [o for o in find(objects, "ClusterRole") if o["metadata"]["name"].endswith("-discovery")]
    return role["rules"], discovery["rules"]


def least_privilege_kubeconfig(control_plane: Any, namespace: str) -> Path:
    """A ServiceAccount in ``namespace`` holding only the chart's operator rules; its token kubeconfig."""
    rules, cluster_rules = chart_operator_rules()
    name = "forge-replay-operator"
    binding_name = f"{name}-{namespace}"[:63]
    apply(control_plane, [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": binding_name},
         "rules": cluster_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": binding_name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": binding_name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ])
    token = control_plane.kubectl("create", "token", name, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name, "namespace": namespace}}],
        "current-context": name,
    }
    path = Path(control_plane.workdir) / f"operator-{namespace}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path
