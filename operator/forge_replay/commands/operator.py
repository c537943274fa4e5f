"""`forge-replay operator` (also `python -m forge_replay.commands.operator`): run the kopf operator.

The command reads its flags into the operator's settings; :func:`forge_replay.controller.start.run_operator` starts
it. No kopf import at module level.
"""

from __future__ import annotations

import re

import click

from forge_replay.controller.settings import DEFAULT_RUNTIME_IMAGE, OperatorSettings
from forge_replay.controller.start import run_operator


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
@click.option("--image-pull-seconds", default=OperatorSettings.image_pull_seconds, show_default=True,
              type=click.IntRange(min=1),
              help="End a job whose Ray pod has failed to pull its image this long after reaching its node "
                   "(ImagePullFailed).")
@click.option("--crash-loop-restarts", default=OperatorSettings.crash_loop_restarts, show_default=True,
              type=click.IntRange(min=1), help="End a job whose Ray container is in CrashLoopBackOff after this many "
              "restarts (CrashLoop).")
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
    image_pull_seconds: int,
    crash_loop_restarts: int,
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
        image_pull_seconds=image_pull_seconds,
        crash_loop_restarts=crash_loop_restarts,
        leader_election_namespace=leader_election_namespace or None,
    )
    run_operator(settings, kubeconfig=kubeconfig, verbose=verbose)


if __name__ == "__main__":
    operator(prog_name="python -m forge_replay.commands.operator")
