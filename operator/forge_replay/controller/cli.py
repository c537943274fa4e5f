"""`forge-replay render FILE` and `forge-replay operator` (also `python -m forge_replay.controller`).

No torch, ray or kopf import at module level: `forge-replay render` stays fast.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any

import click
import yaml

from forge_replay.controller.settings import DEFAULT_RUNTIME_IMAGE, OperatorSettings


class _LiteralDumper(yaml.SafeDumper):
    """YAML with multi-line strings as literal blocks (config.yaml stays readable in a diff)."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str)


def objects_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as multi-document YAML, in creation order."""
    return yaml.dump_all(objects, Dumper=_LiteralDumper, sort_keys=False, explicit_start=True)


@click.command()
@click.argument("file", metavar="FILE")
@click.option("--runtime-image", default=DEFAULT_RUNTIME_IMAGE, show_default=True,
              help="The operator's default runtime image (used when spec.image is empty).")
@click.option("--namespace", "-n", default=None, help="Namespace for jobs whose metadata has none.")
def render(file: str, runtime_image: str, namespace: str | None) -> None:
    """Print the objects the operator creates for the ForgeReplayJob(s) in FILE, as multi-document YAML.

    For GitOps review and diffs. Owner references appear only for objects read back from a cluster
    (they need the job's uid). Invalid specs print `FILE: field.path: message` and exit 1.
    """
    from forge_replay.api import SpecInvalid
    from forge_replay.api.parse import DocumentError, NotAForgeReplayJob, load_documents, parse_job
    from forge_replay.controller.render import render as render_objects

    settings = OperatorSettings(runtime_image=runtime_image)
    try:
        docs = load_documents(file)
    except DocumentError as exc:
        click.echo(f"{file}: {exc}", err=True)
        sys.exit(2)
    if not docs:
        click.echo(f"{file}: holds no YAML document (expected a ForgeReplayJob)", err=True)
        sys.exit(2)
    objects: list[dict[str, Any]] = []
    failed = 0
    for index, doc in enumerate(docs):
        where = file if len(docs) == 1 else f"{file}[{index}]"
        try:
            job = parse_job(doc)
        except NotAForgeReplayJob as exc:
            click.echo(f"{where}: {exc}", err=True)
            failed = max(failed, 2)
            continue
        except SpecInvalid as exc:
            for problem in exc.problems:
                click.echo(f"{where}: {problem}", err=True)
            failed = max(failed, 1)
            continue
        if namespace and not job.metadata.namespace:
            job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})})
        if not job.metadata.name:
            click.echo(f"{where}: metadata.name: required to render (generateName cannot name the RayJob)", err=True)
            failed = max(failed, 1)
            continue
        objects += render_objects(job, settings)
    if failed:
        sys.exit(failed)
    sys.stdout.write(objects_yaml(objects))


# A Kubernetes resource quantity: "2", "500m", "1.5", "8Gi", "512M", "1e9".
_QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


def _quantity(context: click.Context, parameter: click.Parameter, value: str) -> str:
    if not _QUANTITY.match(value):
        raise click.BadParameter(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 8Gi)")
    return value


@click.command()
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Watch this namespace (repeatable). Without it the operator watches the whole cluster.")
@click.option("--runtime-image", default=DEFAULT_RUNTIME_IMAGE, show_default=True,
              help="Runtime image for jobs whose spec.image is empty.")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
              help="Kubeconfig file (default: in-cluster ServiceAccount, else ~/.kube/config).")
@click.option("--liveness", default="http://0.0.0.0:8080/healthz", show_default=True,
              help="kopf liveness endpoint URL; empty to disable.")
@click.option("--metrics-port", default=9090, show_default=True, type=int,
              help="Port of the Prometheus /metrics endpoint; 0 to disable.")
@click.option("--resync-seconds", default=60, show_default=True, type=int,
              help="Reconcile unfinished jobs this often even without events; 0 to disable.")
@click.option("--watch-server-timeout", default=300, show_default=True, type=int,
              help="Seconds before the API server ends a watch and kopf reconnects (catches silent stalls).")
@click.option("--runtime-uid", default=10001, show_default=True, type=int,
              help="Non-root UID/GID of the runtime pods.")
@click.option("--ray-version", default=OperatorSettings.ray_version, show_default=True,
              help="Ray version of the runtime image (the RayCluster's rayVersion).")
@click.option("--head-cpu", default=OperatorSettings.head_cpu, show_default=True, callback=_quantity,
              help="CPU request of the Ray head pod.")
@click.option("--head-memory", default=OperatorSettings.head_memory, show_default=True, callback=_quantity,
              help="Memory request and limit of the Ray head pod.")
@click.option("--cpu-worker-cpu", default=OperatorSettings.cpu_worker_cpu, show_default=True, callback=_quantity,
              help="CPU request of a trainer pod when trainer.gpusPerNode is 0.")
@click.option("--cpu-worker-memory", default=OperatorSettings.cpu_worker_memory, show_default=True,
              callback=_quantity, help="Memory request and limit of a trainer pod when trainer.gpusPerNode is 0.")
@click.option("--shm-size", default=OperatorSettings.shm_size, show_default=True, callback=_quantity,
              help="Size of the in-memory /dev/shm of the Ray pods (capped by each pod's memory limit).")
@click.option("--leader-election-namespace", default=None,
              help="Take the Lease forge-replay-operator in this namespace before acting (two replicas are safe).")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def operator(
    namespaces: tuple[str, ...],
    runtime_image: str,
    kubeconfig: str | None,
    liveness: str,
    metrics_port: int,
    resync_seconds: int,
    watch_server_timeout: int,
    runtime_uid: int,
    ray_version: str,
    head_cpu: str,
    head_memory: str,
    cpu_worker_cpu: str,
    cpu_worker_memory: str,
    shm_size: str,
    leader_election_namespace: str | None,
    verbose: bool,
) -> None:
    """Run the ForgeReplayJob operator (one replica by design: see docs/operator.md)."""
    settings = OperatorSettings(
        runtime_image=runtime_image,
        namespaces=tuple(namespaces),
        liveness_endpoint=liveness or None,
        metrics_port=metrics_port or None,
        resync_seconds=resync_seconds,
        watch_server_timeout=watch_server_timeout,
        watch_client_timeout=watch_server_timeout + 30,
        runtime_uid=runtime_uid,
        ray_version=ray_version,
        head_cpu=head_cpu,
        head_memory=head_memory,
        cpu_worker_cpu=cpu_worker_cpu,
        cpu_worker_memory=cpu_worker_memory,
        shm_size=shm_size,
        leader_election_namespace=leader_election_namespace or None,
    )
    run_operator(settings, kubeconfig=kubeconfig, verbose=verbose)


def run_operator(settings: OperatorSettings, *, kubeconfig: str | None = None, verbose: bool = False) -> None:
    """Start kopf with the forge-replay handlers until interrupted."""
    if kubeconfig:
        _login_with(kubeconfig)
    import kopf

    from forge_replay.controller import handlers  # noqa: F401  (registers the handlers)
    from forge_replay.controller import metrics
    from forge_replay.controller.kube import Kube
    from forge_replay.controller.reconcile import Reconciler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kube = Kube(kubeconfig, on_request=metrics.count_request)
    reconciler = Reconciler(kube, settings)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    # kopf waits for a threading.Event stop flag in a thread of its event loop's executor, and closing the loop joins
    # that thread: the cleanup handler sets the flag on every stop (handlers.stop), or a SIGTERM'd operator would
    # hang until kopf's own SIGKILL ten minutes later (Kubernetes' grace period kills it first, after 30 s).
    stop_flag = threading.Event()
    lease_lost = threading.Event()
    if settings.leader_election_namespace:
        _lead(kube, settings, lambda: (lease_lost.set(), stop_flag.set()))
    kopf.run(
        identity=replica_identity(),  # never kopf's default, the login name (see replica_identity)
        standalone=True,  # no kopf peering: the Lease (when configured) decides who acts
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(settings=settings, reconciler=reconciler, stop_flag=stop_flag),
        stop_flag=stop_flag,
    )
    if lease_lost.is_set():
        raise SystemExit("lost the leader Lease: exiting so that a fresh process queues for it")


def replica_identity() -> str:
    """This replica's name, for the Lease and for kopf: the pod's name (POD_NAME, set by the chart) or the host
    name, and the pid.

    Never the login name, which kopf would otherwise look up (getpass.getuser()): the image runs as a numeric
    user with no passwd entry, where that lookup raises KeyError and the operator dies at start.
    """
    import os
    import socket

    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


def _lead(kube, settings: OperatorSettings, on_lost) -> None:
    """Block until this replica holds the Lease; then keep it, and call ``on_lost`` (stop kopf) if it is lost."""
    from forge_replay.controller.leader import LeaderElector

    identity = replica_identity()
    elector = LeaderElector(
        kube, settings.leader_election_namespace, settings.leader_election_name, identity,
        lease_seconds=settings.lease_seconds, renew_seconds=settings.lease_seconds / 3, on_lost=on_lost,
    )
    standby = _standby_liveness(settings.liveness_endpoint)  # a waiting replica is alive, not stuck
    try:
        elector.acquire()
    finally:
        if standby is not None:
            standby.shutdown()
            standby.server_close()
    elector.keep()


def _standby_liveness(endpoint: str | None):
    """Answer 200 on the liveness endpoint while waiting for the Lease (kopf serves it once it runs)."""
    if not endpoint:
        return None
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"standby: waiting for the leader Lease")

        def log_message(self, *args: Any) -> None:
            pass

    where = urlsplit(endpoint)
    server = ThreadingHTTPServer((where.hostname or "0.0.0.0", where.port or 80), Alive)
    threading.Thread(target=server.serve_forever, name="forge-replay-standby-liveness", daemon=True).start()
    return server


def _login_with(kubeconfig: str) -> None:
    """Make kopf authenticate from this kubeconfig file, whatever $KUBECONFIG or ~/.kube say.

    kopf logs in through the kubernetes client, whose default kubeconfig path is read from
    $KUBECONFIG once, when the module is first imported: set both.
    """
    import os

    import kubernetes.config.kube_config

    os.environ["KUBECONFIG"] = kubeconfig
    kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig
