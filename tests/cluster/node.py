"""One real node for the test control plane (``up --real-node``, scripts/e2e): pods that really run.

What runs where (docs/cluster.md, "The real node"):

- A namespace holder (``unshare --net --mount --propagation private`` around the pause binary) owns a network
  and a mount namespace of the cluster's own. Inside the network namespace: loopback, the node's address
  ``NODE_IP`` on loopback, the CNI bridge, kube-proxy's iptables rules, ``ip_forward``. Inside the mount
  namespace: a tmpfs over /run and /var/lib (pod netns files, CNI state), the workdir over /var/log (pod
  logs), files with the values the kubelet wants bind-mounted over the /proc/sys entries it would otherwise
  write (``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``...), and a resolv.conf that
  points at the cluster's DNS. The host's network, iptables, sysctls and mounts are never touched.
- The whole control plane runs inside both namespaces too (manager.py), so the API server reaches the kubelet
  (``kubectl logs``) and pod IPs (service proxy), KubeRay reaches the Ray head's dashboard by its Service name,
  and pods reach the API server through the ``kubernetes`` Service. The host reaches the API server through
  forward.py on the same 127.0.0.1 port.
- containerd (Debian's 1.6, ``restrict_oom_score_adj``, cgroupfs), runc and the CNI plugins (bridge,
  host-local, portmap, loopback), the kubelet (``failCgroupV1: false``, cgroupfs under a cgroup root of the
  cluster's own, ``--node-ip``), kube-proxy (iptables mode, conntrack limits left alone) and CoreDNS (a
  process on ``NODE_IP:53`` behind the ``kube-dns`` Service 10.0.0.10) run in the namespaces, in the cgroup
  ``<root>/node`` of every hierarchy; pods run under ``<root>/kubepods``.
- ``stop()`` stops the components, kills every process left in those cgroups (containerd's shims, containers),
  removes the cgroups; the namespaces end with their last process, taking every mount with them.

containerd's image store lives in the forge-replay cache (``<cache>/node/containerd``) so that large images
are imported once per machine, not per run; a lock keeps it to one real node per machine at a time.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tests.cluster import build, oci

if TYPE_CHECKING:
    from tests.cluster.manager import Component, ControlPlane

NODE_NAME = "real-node-0"
NODE_IP = "10.246.0.1"
POD_CIDR = "10.245.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_DNS = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
NODE_LABEL = ("forgereplay.io/real-node", "true")
PAUSE_IMAGE = "forge-replay.test/pause:local"
BUSYBOX_IMAGE = "forge-replay.test/busybox:local"
CNI_BIN_DIR = Path("/usr/lib/cni")
# The values the kubelet's setupKernelTunables wants (k8s.io/kubernetes v1.37.2
# pkg/kubelet/cm/container_manager_linux.go:478-485, values from k8s.io/component-helpers
# node/util/sysctl/sysctl.go:55-72); each entry the host has at another value gets a file over it.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000,
}
HOST_PACKAGES = {  # the Debian packages the real node needs, by the file it uses
    "containerd": Path("/usr/bin/containerd"), "runc": Path("/usr/sbin/runc"), "ctr": Path("/usr/bin/ctr"),
    "containernetworking-plugins": CNI_BIN_DIR / "bridge", "iptables": Path("/usr/sbin/iptables"),
    "util-linux (unshare)": Path("/usr/bin/unshare"),
}
CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class RealNodeError(RuntimeError):
    """The real node could not start (the message names the part and its log)."""


def missing_host_packages() -> list[str]:
    """Debian packages the real node needs that are not installed."""
    return [name for name, path in HOST_PACKAGES.items() if not path.exists()]


def node_cache() -> Path:
    return build.cache_root() / "node"


def busybox_binary() -> Path:
    """Debian's static busybox (package busybox-static, downloaded and unpacked into the cache, not installed)."""
    target = node_cache() / "busybox"
    if target.exists():
        return target
    work = node_cache() / ".busybox-download"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["apt-get", "download", "-q", "busybox-static"], cwd=work, check=True, capture_output=True)
    package = next(work.glob("busybox-static_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(package), str(work / "root")], check=True)
    shutil.copy2(work / "root" / "bin" / "busybox", target)
    shutil.rmtree(work, ignore_errors=True)
    return target


def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies (v1 controllers, the named systemd one, the unified one)."""
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] in ("cgroup", "cgroup2"):
            mounts.append(Path(fields[1]))
    return mounts


def cgroup_pids(cgroup_root: str) -> set[int]:
    """Every process in the cgroup tree ``cgroup_root`` of any hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / cgroup_root
        if root.exists():
            for procs in root.rglob("cgroup.procs"):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except OSError:
                    pass
    return pids


def remove_cgroups(cgroup_root: str) -> list[str]:
    """Kill every process left in the cgroup tree ``cgroup_root`` and remove it; returns what could not be removed."""
    deadline = time.monotonic() + 30
    while (pids := cgroup_pids(cgroup_root)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    left = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / cgroup_root
        if not root.exists():
            continue
        for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [root]:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(str(path))
    return left


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _setns(fd: int, kind: int) -> None:
    if _libc.setns(fd, kind) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


class RealNode:
    """The real node's namespaces, cgroups and components; owned by a ControlPlane started with real_node."""

    def __init__(self, plane: "ControlPlane"):
        self.plane = plane
        self.dir = plane.workdir / "node"
        self.cgroup_root = f"forge-replay-{plane.workdir.name.rsplit('-', 1)[-1]}"
        self.holder: Component | None = None
        self.net_fd = self.mnt_fd = -1
        self._lock_handle = None
        self.containerd_root = node_cache() / "containerd"
        self.socket = self.dir / "containerd" / "containerd.sock"

    # ---- namespaces ---------------------------------------------------------------------------------------
    def create_namespaces(self) -> None:
        """Start the holder, set up loopback, the node address and the private mounts."""
        absent = missing_host_packages()
        if absent:
            raise RealNodeError(f"the real node needs Debian packages that are not installed: {', '.join(absent)} "
                                "(apt-get install containerd runc containernetworking-plugins iptables)")
        node_cache().mkdir(parents=True, exist_ok=True)
        self._lock_handle = open(node_cache() / ".lock", "w")
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RealNodeError(f"another real node is running on this machine (it holds {node_cache() / '.lock'}); "
                                "stop it first") from None
        self._sweep_stale_nodes()
        for sub in ("log", "sysctl", "containerd", "cni/net.d", "kubelet", "pki"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._make_cgroups()
        pause = build.binary_path("pause", log=self.plane.log)
        self.holder = self.plane._launch("namespaces", [
            "unshare", "--net", "--mount", "--propagation", "private", str(pause)], join_namespaces=False)
        pid = self.holder.process.pid
        deadline = time.monotonic() + 10
        host_net = os.stat("/proc/self/ns/net").st_ino
        while os.stat(f"/proc/{pid}/ns/net").st_ino == host_net:  # unshare has not unshared yet
            if time.monotonic() > deadline or not self.holder.alive():
                raise RealNodeError(f"the namespace holder did not start:\n{self.holder.log_tail()}")
            time.sleep(0.05)
        self.net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        self.mnt_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {CLUSTER_DNS}\nsearch default.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} "
                          f"{CLUSTER_DOMAIN}\noptions ndots:5\n")
        (self.dir / "upstream-resolv.conf").write_text("")  # pods with dnsPolicy Default: no upstream here
        script = [
            "set -e", "ip link set lo up", f"ip addr add {NODE_IP}/32 dev lo",
            # Processes of the namespace itself (KubeRay asking the Ray head's dashboard, the API server's service
            # proxy) reach Service IPs: a route is needed before kube-proxy's OUTPUT rules rewrite the address.
            f"ip route add {SERVICE_CIDR} dev lo src {NODE_IP}",
            "mount -t tmpfs -o mode=755 forge-replay-run /run", "mkdir -p /run/netns",
            "mount -t tmpfs -o mode=755 forge-replay-var-lib /var/lib",
            f"mount --bind {self.dir / 'log'} /var/log", f"mount --bind {resolv} /etc/resolv.conf",
        ]
        for entry, wanted in KUBELET_SYSCTLS.items():
            current = Path("/proc/sys", entry).read_text().strip()
            if current != str(wanted):
                replacement = self.dir / "sysctl" / entry.replace("/", ".")
                replacement.write_text(f"{wanted}\n")
                script.append(f"mount --bind {replacement} /proc/sys/{entry}")
        self.run_inside(["sh", "-c", "\n".join(script)])

    def join(self, cgroup: bool) -> None:
        """In a child between fork and exec: enter the node's cgroup (if asked) and namespaces."""
        if cgroup:
            for hierarchy in cgroup_hierarchies():
                procs = hierarchy / self.cgroup_root / "node" / "cgroup.procs"
                if procs.exists():
                    procs.write_text(str(os.getpid()))
        _setns(self.net_fd, CLONE_NEWNET)
        _setns(self.mnt_fd, CLONE_NEWNS)

    def join_network_only(self) -> None:
        _setns(self.net_fd, CLONE_NEWNET)

    def run_inside(self, argv: list[str], check: bool = True, timeout: float = 600,
                   input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command in the node's namespaces (and cgroup); raises with its output when ``check`` fails."""
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                                preexec_fn=lambda: self.join(cgroup=True))
        if check and result.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)} failed ({result.returncode}) in the node's namespaces:\n"
                                f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
        return result

    # ---- cgroups ------------------------------------------------------------------------------------------
    def _make_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            for relative in (self.cgroup_root, f"{self.cgroup_root}/node"):
                path = hierarchy / relative
                path.mkdir(exist_ok=True)
                if (path / "cpuset.cpus").exists():  # a v1 cpuset child starts empty: inherit the parent's
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (path / name).write_text((path.parent / name).read_text())

    def _sweep_stale_nodes(self) -> None:
        """Clean up after real nodes whose process was killed before it could stop: their containers and shims
        live on in their cgroups. Each node registers its cgroup root with its owner's pid in the cache; an
        entry whose owner is gone is stale (the lock makes sure no live node of this cache is touched)."""
        registry = node_cache() / "running"
        registry.mkdir(parents=True, exist_ok=True)
        for entry in registry.iterdir():
            if _alive(int(entry.read_text() or 0)):
                continue
            self.plane.log(f"removing what a killed real node left (cgroups {entry.name} and their processes)")
            left = remove_cgroups(entry.name)
            if left:
                raise RealNodeError(f"could not remove a killed real node's cgroups: {', '.join(left)}")
            entry.unlink()
        (registry / self.cgroup_root).write_text(str(os.getpid()))

    def cgroup_pids(self) -> set[int]:
        return cgroup_pids(self.cgroup_root)

    # ---- components ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """containerd (with the pause and busybox images), kubelet, kube-proxy, CoreDNS; waits for Ready."""
        plane = self.plane
        binaries = {name: build.binary_path(name, log=plane.log) for name in ("kubelet", "kube-proxy", "coredns")}
        self._start_containerd()
        self.import_image(self._small_image_archives()["pause"])
        self.import_image(self._small_image_archives()["busybox"])
        self._write_cni_config()
        self._apply_cluster_objects()
        self._start_kubelet(binaries["kubelet"])
        self._start_kube_proxy(binaries["kube-proxy"])
        self._start_coredns(binaries["coredns"])
        self._wait_ready()

    def _small_image_archives(self) -> dict[str, Path]:
        cache = node_cache() / "images"
        pause = build.binary_path("pause", log=self.plane.log)
        archives = {}
        pause_archive = cache / f"pause-{pause.parent.name}.tar"
        if not pause_archive.exists():
            oci.write_image(pause_archive, PAUSE_IMAGE, {"/pause": pause}, ["/pause"])
        archives["pause"] = pause_archive
        busybox = busybox_binary()
        busybox_archive = cache / "busybox.tar"
        if not busybox_archive.exists():
            applets = ("sh", "echo", "cat", "ls", "sleep", "wget", "nslookup", "id", "stat", "test", "env", "true")
            oci.write_image(busybox_archive, BUSYBOX_IMAGE, {"/bin/busybox": busybox}, ["/bin/sh"],
                            symlinks={f"/bin/{a}": "busybox" for a in applets})
        archives["busybox"] = busybox_archive
        return archives

    def ctr(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return self.run_inside(["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args], timeout=timeout)

    def images(self) -> set[str]:
        return set(self.ctr("images", "list", "--quiet").stdout.split())

    def import_image(self, archive: Path, name: str | None = None) -> None:
        """Import an OCI or docker archive into the node's containerd unless an image of that name is there."""
        present = self.images()
        if name is not None and name in present:
            return
        started = time.monotonic()
        self.ctr("images", "import", "--no-unpack=false", str(archive))
        self.plane.log(f"imported {archive.name} into the node's containerd in {time.monotonic() - started:.1f}s")
        if name is not None:  # older builds of the same image: removed, so the content store does not grow forever
            repository = name.rsplit(":", 1)[0]
            stale = [image for image in present if image.rsplit(":", 1)[0] == repository and ":" in image]
            if stale:
                self.ctr("images", "remove", *stale)

    def _start_containerd(self) -> None:
        state = self.dir / "containerd"
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        config = f"""version = 2
root = "{self.containerd_root}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{state / 'containerd.sock.ttrpc'}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{state / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / 'cni' / 'net.d'}"
"""
        path = state / "config.toml"
        path.write_text(config)
        containerd = self.plane._launch("containerd", ["containerd", f"--config={path}", "--log-level=info"],
                                        node=True)
        self.plane._wait_for("containerd", lambda: self.socket.exists() and
                             self.run_inside(["ctr", f"--address={self.socket}", "version"], check=False)
                             .returncode == 0, timeout=60, component=containerd)

    def _write_cni_config(self) -> None:
        config = {
            "cniVersion": "1.0.0", "name": "forge-replay",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/var/lib/cni/networks"}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.dir / "cni" / "net.d" / "10-forge-replay.conflist").write_text(json.dumps(config, indent=2))

    def _identity_kubeconfig(self, name: str, common_name: str, organizations: tuple[str, ...] = ()) -> Path:
        plane = self.plane
        pair = plane.ca.issue(name, common_name, organizations, client=True)
        path = self.dir / f"{name}.kubeconfig"
        plane._write_kubeconfig(path, pair, common_name)
        return path

    def _apply_cluster_objects(self) -> None:
        """The objects a node's add-ons bring: CoreDNS's RBAC, the kube-dns Service and the endpoints of
        ``kubernetes`` and ``kube-dns`` (both served by processes on NODE_IP)."""
        plane = self.plane

        def slice_for(service: str, namespace: str, ports: list[dict]) -> dict:
            return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": service, "namespace": namespace, "labels": {
                        "kubernetes.io/service-name": service,
                        "endpointslice.kubernetes.io/managed-by": "forge-replay-tests"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
                    "ports": ports}

        objects = [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "forge-replay-tests:coredns"},
             "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
                        "verbs": ["list", "watch"]},
                       {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                        "verbs": ["list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "forge-replay-tests:coredns"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "forge-replay-tests:coredns"},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}]},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
             "spec": {"clusterIP": CLUSTER_DNS, "ports": [
                 {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                 {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
            slice_for("kube-dns", "kube-system", [{"name": "dns", "port": 53, "protocol": "UDP"},
                                                  {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]),
            slice_for("kubernetes", "default", [{"name": "https", "port": plane.secure_port, "protocol": "TCP"}]),
        ]
        plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))

    def _start_kubelet(self, kubelet: Path) -> None:
        kubeconfig = self._identity_kubeconfig("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",))
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_root}",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.plane.ca.pair.cert)}},
            "authorization": {"mode": "AlwaysAllow"},  # only holders of a certificate from the test CA get in
            "clusterDNS": [CLUSTER_DNS], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(self.dir / "upstream-resolv.conf"),
            "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "failSwapOn": False, "protectKernelDefaults": False, "oomScoreAdj": 0,
            "rotateCertificates": False, "serverTLSBootstrap": False,
            "podLogsDir": "/var/log/pods",  # the workdir's node/log, bind-mounted in the node's mount namespace
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False, "registerNode": True,
            "syncFrequency": "10s", "fileCheckFrequency": "10s", "nodeStatusReportFrequency": "10s",
        }
        path = self.dir / "kubelet" / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        self.kubelet = self.plane._launch("kubelet", [
            str(kubelet), f"--config={path}", f"--kubeconfig={kubeconfig}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}", f"--root-dir={self.dir / 'kubelet' / 'root'}",
            f"--cert-dir={self.dir / 'kubelet' / 'pki'}", f"--node-labels={NODE_LABEL[0]}={NODE_LABEL[1]}",
            "--v=2",
        ], node=True)

    def _start_kube_proxy(self, kube_proxy: Path) -> None:
        kubeconfig = self._identity_kubeconfig("kube-proxy", "system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": NODE_NAME,
            "mode": "iptables", "clusterCIDR": POD_CIDR, "bindAddress": NODE_IP,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            "oomScoreAdj": 0,
            # Leave the (partly host-wide) conntrack limits alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.kube_proxy = self.plane._launch("kube-proxy", [str(kube_proxy), f"--config={path}", "--v=2"], node=True)

    def _start_coredns(self, coredns: Path) -> None:
        kubeconfig = self._identity_kubeconfig("coredns", "system:coredns")
        corefile = self.dir / "Corefile"
        corefile.write_text(f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
    loop
}}
""")
        self.coredns = self.plane._launch("coredns", [str(coredns), "-conf", str(corefile)], node=True)

    def _wait_ready(self) -> None:
        def node_ready() -> bool:
            out = self.plane.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conditions = json.loads(out.stdout)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        self.plane._wait_for(f"node {NODE_NAME} Ready", node_ready, timeout=180, component=self.kubelet,
                             interval=1.0)
        self.plane._wait_for("CoreDNS /ready", self._coredns_ready, timeout=60, component=self.coredns, interval=0.5)

    def _coredns_ready(self) -> bool:
        result = self.run_inside([str(busybox_binary()), "wget", "-q", "-O", "-", "http://127.0.0.1:8181/ready"],
                                 check=False)
        return result.returncode == 0

    # ---- stop ---------------------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """After the components stopped: kill what is left in the node's cgroups, remove them, close the
        namespaces. Returns what could not be cleaned (empty when everything is gone)."""
        left = remove_cgroups(self.cgroup_root)
        if not left:
            (node_cache() / "running" / self.cgroup_root).unlink(missing_ok=True)
        for fd in (self.net_fd, self.mnt_fd):
            if fd >= 0:
                os.close(fd)
        self.net_fd = self.mnt_fd = -1
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None
        return left
