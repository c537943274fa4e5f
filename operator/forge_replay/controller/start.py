"""Starting the operator: kopf with the forge-replay handlers, the metrics endpoint and, when configured, the leader
Lease (a standby replica answers liveness while it waits). `forge-replay operator` calls :func:`run_operator`.

No kopf import at module level.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from forge_replay.controller.settings import OperatorSettings


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
