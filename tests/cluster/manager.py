"""A real Kubernetes control plane on loopback, started from the binaries tests/cluster/build.py makes.

etcd and kube-apiserver always run (generated CA and certificates, RBAC authorizer, service-account signing
keys); kube-controller-manager, kube-scheduler, KWOK with fake GPU nodes and the KubeRay operator are
optional. Every component runs in its own process group, logs to ``<workdir>/logs/<component>.log`` and is
stopped (SIGTERM, then SIGKILL) by ``stop()``; children also die with the process that started them.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from tests.cluster import build
from tests.cluster.certs import CertificateAuthority, service_account_keys

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_CRDS_DIR = REPO_ROOT / "crds"
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
FAKE_NODE_TAINT = "forgereplay.io/fake-node"
GPU_PRODUCT = "NVIDIA-H200"

# Controllers kube-controller-manager runs: garbage collection, namespace deletion, Jobs (KubeRay's submitter),
# Deployments (the operator chart), service accounts and their tokens, aggregated ClusterRoles.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "endpointslice-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "pod-garbage-collector-controller",
    "persistentvolumeclaim-protection-controller",  # removes the finalizer the admission plugin puts on PVCs
)

REAL_NODE_CONTROLLERS = ("persistentvolume-binder-controller",)

# KWOK stages (from the pinned module's kustomize/stage): nodes become Ready and keep heartbeating; bound pods
# become Running and Ready; pods owned by a Job complete (Succeeded); deleted pods go away.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat/node-heartbeat.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


class ControlPlaneError(RuntimeError):
    """The control plane could not start (the message names the component and its log)."""


@dataclass
class Options:
    """Which parts to start. etcd and kube-apiserver always run."""

    controller_manager: bool = True
    scheduler: bool = True
    kwok: bool = True
    kuberay: bool = True
    install_crds: bool = True
    project_crds_dir: Path = PROJECT_CRDS_DIR
    gpu_nodes: int = 2
    cpu_nodes: int = 1
    # One real node (tests/cluster/node.py): the whole control plane then runs in the node's namespaces.
    real_node: bool = False
    workdir: Path | None = None
    log: Callable[[str], None] = field(default=lambda message: print(message, file=sys.stderr, flush=True))

    def binaries(self) -> list[str]:
        names = ["etcd", "kube-apiserver", "kubectl"]
        names += ["kube-controller-manager"] if self.controller_manager else []
        names += ["kube-scheduler"] if self.scheduler else []
        names += ["kwok", "kwok-stages"] if self.kwok else []
        names += ["kuberay-operator"] if self.kuberay else []
        names += ["pause", "kubelet", "kube-proxy", "coredns"] if self.real_node else []
        return names


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the ephemeral range (runtime/ports.py)."""
    from forge_replay.runtime.ports import free_port as outside_ephemeral_range

    return outside_ephemeral_range("127.0.0.1")


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: its own process group, and SIGKILL when our process dies
    # (so a killed pytest or a closed terminal leaves no etcd/kube-apiserver behind).
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Component:
    """One control-plane process with its log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None,
                 preexec: Callable[[], None] = _die_with_parent, pass_fds: tuple[int, ...] = ()):
        self.name, self.argv, self.log_path = name, argv, log_path
        self.env = {**os.environ, **(env or {})}
        self.preexec, self.pass_fds = preexec, pass_fds
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env, preexec_fn=self.preexec,
                                            pass_fds=self.pass_fds)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        pgid = self.process.pid  # setsid made the child its own group leader
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.process.wait(timeout=grace)
        except ProcessLookupError:
            pass
        # A group leader that exited may leave children in its group; take them down too.
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return f"({self.log_path} does not exist)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _wait(what: str, check: Callable[[], bool], timeout: float, component: Component | None = None,
          interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if component is not None and not component.alive():
            raise ControlPlaneError(
                f"{component.name} exited (code {component.process.returncode}) while waiting for {what}; "
                f"log {component.log_path}:\n{component.log_tail()}")
        try:
            if check():
                return
        except Exception as error:  # noqa: BLE001 - any failure means "not ready yet"; reported on timeout
            last_error = error
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    tail = f"; log {component.log_path}:\n{component.log_tail()}" if component else ""
    raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{tail}")


class ControlPlane:
    """Start with ``start()`` (or as a context manager), stop with ``stop()``.

    After start: ``kubeconfig`` (admin, client certificate in system:masters), ``server`` (https URL),
    ``bin_dir`` (kubectl and friends), ``log_dir``, ``kubectl(*args)`` and ``api_client()``.
    """

    def __init__(self, options: Options | None = None):
        self.options = options or Options()
        self.log = self.options.log
        self._owns_workdir = self.options.workdir is None
        self.workdir = Path(self.options.workdir or tempfile.mkdtemp(prefix="forge-replay-cluster-"))
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.bin_dir = build.bin_dir()
        self.components: list[Component] = []
        self.binaries: dict[str, Path] = {}
        self.server = ""
        self.kuberay_crds_dir: Path | None = None
        self.installed_crds: list[str] = []
        self.project_crd_error: str | None = None
        self.skipped: list[str] = []
        self.keep_workdir = False
        self.node = None  # node.RealNode with Options.real_node
        self.left_behind: list[str] = []  # what stop() could not clean (real node cgroups)

    # ---- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop(keep_logs=exc_info[0] is not None)

    def start(self) -> "ControlPlane":
        started = time.monotonic()
        try:
            for name in self.options.binaries():
                self.binaries[name] = build.binary_path(name, log=self.log)
            if self.options.kuberay and self.options.install_crds:
                self.kuberay_crds_dir = build.binary_path("kuberay-crds", log=self.log)
            self._write_pki()
            if self.options.real_node:
                from tests.cluster.node import RealNode

                self.node = RealNode(self)
                self.node.create_namespaces()
            self._start_etcd()
            self._start_apiserver()
            if self.options.install_crds:
                self._install_crds()
            if self.options.controller_manager:
                self._start_controller_manager()
            if self.options.scheduler:
                self._start_scheduler()
            if self.options.kwok:
                self._start_kwok()
            if self.options.kuberay:
                self._start_kuberay()
            if self.options.controller_manager:
                self._wait_controller_manager()
            if self.node is not None:
                self.node.start()
        except BaseException:
            self.stop(keep_logs=bool(self.components))  # nothing to keep if nothing ran
            raise
        self.log(f"control plane up in {time.monotonic() - started:.1f}s ({', '.join(c.name for c in self.components)}); "
                 f"logs in {self.log_dir}")
        return self

    def stop(self, keep_logs: bool = False) -> None:
        """Stop every component (reverse start order); remove the workdir unless logs should be kept."""
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        if self.node is not None:
            self.left_behind = self.node.stop()
            if self.left_behind:
                self.log(f"ERROR: could not remove {', '.join(self.left_behind)}")
        if keep_logs or self.keep_workdir or not self._owns_workdir:
            if self.workdir.exists():
                self.log(f"control plane files kept in {self.workdir} (logs in {self.log_dir})")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def dead_components(self) -> list[Component]:
        return [c for c in self.components if not c.alive()]

    def log_tails(self, lines: int = 30) -> str:
        """The last lines of every component's log (for failure reports)."""
        return "\n".join(f"--- {c.name} ({c.log_path}) ---\n{c.log_tail(lines)}" for c in self.components)

    # ---- helpers for users and tests ---------------------------------------------------------------------
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the built kubectl against this control plane; raises with stderr when ``check`` and it fails."""
        result = subprocess.run([str(self.binaries["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def api_client(self):
        """A new ``kubernetes.client.ApiClient`` authenticated as the admin."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def _admin_get(self, path: str) -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        context.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        try:
            with urllib.request.urlopen(f"{self.server}{path}", context=context, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    # ---- steps ---------------------------------------------------------------------------------------------
    def _write_pki(self) -> None:
        self.secure_port = free_port()
        self.server = f"https://127.0.0.1:{self.secure_port}"
        self.ca = CertificateAuthority(self.pki_dir)
        self.serving = self.ca.issue("apiserver", "kube-apiserver", server_hosts=(
            "127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local", *(["10.246.0.1"] if self.options.real_node else [])))
        self.admin = self.ca.issue("admin", "forge-replay-test-admin", ("system:masters",), client=True)
        self.sa_keys = service_account_keys(self.pki_dir)
        self._write_kubeconfig(self.kubeconfig, self.admin, "admin")

    def _write_kubeconfig(self, path: Path, pair, user: str) -> None:
        import base64

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        document = {
            "apiVersion": "v1", "kind": "Config", "current-context": "forge-replay-test",
            "clusters": [{"name": "forge-replay-test", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.ca.pair.cert)}}],
            "users": [{"name": user, "user": {
                "client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)}}],
            "contexts": [{"name": "forge-replay-test", "context": {
                "cluster": "forge-replay-test", "user": user, "namespace": "default"}}],
        }
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        path.chmod(0o600)

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None, join_namespaces: bool = True,
                node: bool = False) -> Component:
        """Start a component; with a real node it runs in the node's namespaces (``node``: and its cgroup)."""
        preexec = _die_with_parent
        if self.node is not None and join_namespaces:
            real_node = self.node

            def preexec() -> None:
                _die_with_parent()
                real_node.join(cgroup=node)

        component = Component(name, argv, self.log_dir / f"{name}.log", env, preexec=preexec)
        component.start()
        self.components.append(component)
        return component

    def _wait_for(self, what: str, check: Callable[[], bool], timeout: float, component: Component | None = None,
                  interval: float = 0.2) -> None:
        _wait(what, check, timeout, component, interval)

    def _expose(self, port: int) -> None:
        """With a real node: make 127.0.0.1:port inside the node's network namespace reachable on the host's
        127.0.0.1:port (forward.py; the listening socket is the host's, the relayed connections the node's)."""
        if self.node is None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        real_node = self.node

        def preexec() -> None:
            _die_with_parent()
            real_node.join_network_only()

        component = Component(f"forward-{port}", [sys.executable, "-m", "tests.cluster.forward",
                                                  f"{listener.fileno()}:{port}"],
                              self.log_dir / f"forward-{port}.log", {"PYTHONPATH": str(REPO_ROOT)},
                              preexec=preexec, pass_fds=(listener.fileno(),))
        try:
            component.start()
        finally:
            listener.close()
        self.components.append(component)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        etcd = self._launch("etcd", [
            str(self.binaries["etcd"]), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync=true", "--log-level=warn",
            "--listen-metrics-urls=", f"--quota-backend-bytes={2 * 1024**3}",
        ])
        self._expose(client)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
                return json.loads(response.read()).get("health") == "true"

        _wait("etcd /health", healthy, timeout=30, component=etcd)

    def _start_apiserver(self) -> None:
        pki = self.pki_dir
        # TaintNodesByCondition would put a not-ready taint on every new node that only the node-lifecycle
        # controller removes; KWOK's nodes are Ready at once and that controller is not run here.
        disabled = ["TaintNodesByCondition"] + ([] if self.options.controller_manager else ["ServiceAccount"])
        # With a real node the API server listens on every address of the node's network namespace (pods reach
        # it through the `kubernetes` Service), authorizes kubelets with the Node authorizer and reaches them
        # with a client certificate of its own (kubectl logs/exec).
        real_node = []
        if self.node is not None:
            kubelet_client = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                           ("system:masters",), client=True)
            real_node = [f"--kubelet-client-certificate={kubelet_client.cert}",
                         f"--kubelet-client-key={kubelet_client.key}",
                         "--kubelet-preferred-address-types=InternalIP"]
        argv = [
            str(self.binaries["kube-apiserver"]),
            f"--etcd-servers={self.etcd_url}", f"--bind-address={'0.0.0.0' if self.node else '127.0.0.1'}",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.secure_port}", f"--cert-dir={pki}",
            f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.pair.cert}", f"--authorization-mode={'Node,RBAC' if self.node else 'RBAC'}",
            "--service-cluster-ip-range=10.0.0.0/24", f"--service-account-issuer={self.server}",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none", f"--disable-admission-plugins={','.join(disabled)}", "--v=1",
            f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking", *real_node,
        ]
        apiserver = self._launch("kube-apiserver", argv)
        self._expose(self.secure_port)
        _wait("kube-apiserver /readyz", lambda: self._admin_get("/readyz")[0] == 200, timeout=120,
              component=apiserver, interval=0.3)

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON line per list/watch of the kinds the operator watches."""
        return self.log_dir / "audit.log"

    def _audit_policy(self) -> Path:
        """Record (at Metadata level: URI with its labelSelector, user) every list and watch of ConfigMaps,
        Jobs and RayJobs, so tests can check which selectors clients send; nothing else is recorded."""
        policy = {
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "verbs": ["list", "watch"],
                 "resources": [{"group": "", "resources": ["configmaps"]}, {"group": "batch", "resources": ["jobs"]},
                               {"group": "ray.io", "resources": ["rayjobs"]}]},
                {"level": "None"},
            ],
        }
        path = self.workdir / "audit-policy.json"
        path.write_text(json.dumps(policy))
        return path

    def _install_crds(self) -> None:
        """KubeRay's CRDs must install; the project's CRD is reported (``project_crd_error``) if refused,
        so that one bad schema fails the CRD tests with the API server's words, not every cluster test."""
        if self.kuberay_crds_dir is not None:
            self._apply_crds(sorted(self.kuberay_crds_dir.glob("*.yaml")))
        directory = self.options.project_crds_dir
        project = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
        if not project:
            message = f"no project CRD in {directory} (generate it with `forge-replay crd`); not installed"
            self.skipped.append(message)
            self.log(message)
            return
        try:
            self._apply_crds(project)
        except ControlPlaneError as error:
            self.project_crd_error = f"the API server refused the project CRD from {directory}: {error}"
            self.log(f"ERROR: {self.project_crd_error}")

    def _apply_crds(self, files: list[Path]) -> None:
        args = ["apply", "--server-side", "--force-conflicts", "--field-manager=forge-replay-tests", "-o", "name"]
        for path in files:
            args += ["-f", str(path)]
        installed = [n.split("/", 1)[1] for n in self.kubectl(*args).stdout.split()]

        def established(name: str) -> bool:
            # Polled here: `kubectl wait` fails outright when it reads a CRD before it has any status.
            code, body = self._admin_get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (json.loads(body).get("status", {}).get("conditions") or []) if code == 200 else []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        for name in installed:
            _wait(f"CRD {name} to be Established", lambda: established(name), timeout=120, interval=0.2)
        self.installed_crds += installed
        self.log(f"CRDs installed: {', '.join(installed)}")

    def _start_controller_manager(self) -> None:
        identity = self.ca.issue("kube-controller-manager", "system:kube-controller-manager", client=True)
        kubeconfig = self.workdir / "kube-controller-manager.kubeconfig"
        self._write_kubeconfig(kubeconfig, identity, "system:kube-controller-manager")
        # Pods on the real node mount PersistentVolumes: binding claims to them needs the PV controller.
        controllers = CONTROLLERS + (REAL_NODE_CONTROLLERS if self.options.real_node else ())
        self.controller_manager = self._launch("kube-controller-manager", [
            str(self.binaries["kube-controller-manager"]), f"--kubeconfig={kubeconfig}",
            "--leader-elect=false", "--secure-port=0", f"--controllers={','.join(controllers)}",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_keys.key}", f"--root-ca-file={self.ca.pair.cert}",
            "--concurrent-gc-syncs=5", "--v=1",
        ])

    def _wait_controller_manager(self) -> None:
        # The service-account controller creating `default` in the `default` namespace proves the
        # controller manager runs with working credentials.
        _wait("kube-controller-manager (ServiceAccount default/default)",
              lambda: self._admin_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
              timeout=60, component=self.controller_manager, interval=0.3)

    def _start_scheduler(self) -> None:
        identity = self.ca.issue("kube-scheduler", "system:kube-scheduler", client=True)
        kubeconfig = self.workdir / "kube-scheduler.kubeconfig"
        self._write_kubeconfig(kubeconfig, identity, "system:kube-scheduler")
        self._launch("kube-scheduler", [
            str(self.binaries["kube-scheduler"]), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            "--secure-port=0", "--v=1",
        ])

    def fake_node(self, name: str, gpus: int) -> dict:
        """The Node object of one KWOK-managed fake node (``gpus`` > 0: an H200 pool node)."""
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "kwok", "forgereplay.io/pool": "gpu" if gpus else "cpu"}
        capacity = {"cpu": "192", "memory": "2Ti", "pods": "110", "ephemeral-storage": "10Ti"}
        if gpus:
            labels.update({"nvidia.com/gpu.product": GPU_PRODUCT, "nvidia.com/gpu.count": str(gpus),
                           "nvidia.com/gpu.present": "true"})
            capacity["nvidia.com/gpu"] = str(gpus)
        # Beside a real node, fake nodes take only pods that tolerate it (a pod on one would never run).
        taints = [{"key": FAKE_NODE_TAINT, "value": "true", "effect": "NoSchedule"}] if self.options.real_node else []
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {FAKE_NODE_ANNOTATION[0]: FAKE_NODE_ANNOTATION[1]}},
            "spec": {"taints": taints} if taints else {},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                    "kubeletVersion": "fake", "kubeProxyVersion": "fake"}},
        }

    def _start_kwok(self) -> None:
        # The standalone kwok binary has no built-in stages: pass the ones kwokctl uses by default.
        stages = self.binaries["kwok-stages"]
        configs = [f"--config={stages / relative}" for relative in KWOK_STAGES]
        kwok = self._launch("kwok", [
            str(self.binaries["kwok"]), *configs, f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION[0]}={FAKE_NODE_ANNOTATION[1]}",
            "--cidr=10.244.0.1/16", "--node-ip=10.240.0.1", f"--server-address=127.0.0.1:{free_port()}",
        ])
        nodes = [self.fake_node(f"gpu-node-{i}", 8) for i in range(self.options.gpu_nodes)]
        nodes += [self.fake_node(f"cpu-node-{i}", 0) for i in range(self.options.cpu_nodes)]
        self.fake_nodes = [n["metadata"]["name"] for n in nodes]
        if not nodes:
            return
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(n) for n in nodes))

        def all_ready() -> bool:
            out = self.kubectl("get", "nodes", "-o", "json").stdout
            ready = {item["metadata"]["name"] for item in json.loads(out)["items"]
                     if any(c["type"] == "Ready" and c["status"] == "True" for c in item["status"].get("conditions", []))}
            return set(self.fake_nodes) <= ready

        _wait(f"KWOK to mark nodes Ready ({', '.join(self.fake_nodes)})", all_ready, timeout=60, component=kwok,
              interval=0.5)

    def _start_kuberay(self) -> None:
        probe = free_port()
        operator = self._launch("kuberay-operator", [
            str(self.binaries["kuberay-operator"]), "--metrics-addr=0", f"--health-probe-bind-address=127.0.0.1:{probe}",
            "--enable-leader-election=false", "--log-stdout-encoder=console",
        ], env={"KUBECONFIG": str(self.kubeconfig)})
        self._expose(probe)

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=2) as response:
                return response.status == 200

        _wait("KubeRay operator /readyz", ready, timeout=60, component=operator)
