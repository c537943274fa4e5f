"""Operator configuration: what the operator needs to know that no ForgeReplayJob says.

One frozen dataclass, filled from the command line (``forge-replay operator --help``) or built
directly in tests. Pure data: nothing here talks to Kubernetes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_RUNTIME_IMAGE = "ghcr.io/forge-replay/runtime:0.1.0"


@dataclass(frozen=True)
class OperatorSettings:
    """Defaults and limits the operator applies to every job it renders and watches."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """Image for the Ray pods and the verify Job when ``spec.image`` is empty."""

    namespaces: tuple[str, ...] = ()
    """Namespaces watched; empty means the whole cluster."""

    ray_version: str = "2.60.0"
    """The Ray version of the runtime image (the RayCluster's ``rayVersion``; KubeRay gates features on it)."""

    runtime_uid: int = 10001
    """Non-root UID/GID the runtime pods run as (the runtime image's user)."""

    head_cpu: str = "2"
    head_memory: str = "8Gi"
    worker_cpus_per_gpu: int = 8
    """CPU request of a GPU pod, per GPU."""
    worker_memory_gib_per_gpu: int = 64
    """Memory request (and limit) of a GPU pod, per GPU, in GiB."""
    cpu_worker_cpu: str = "4"
    """CPU request of a trainer pod when ``trainer.gpusPerNode`` is 0."""
    cpu_worker_memory: str = "16Gi"
    shm_size: str = "16Gi"
    """Size of the in-memory /dev/shm of the Ray pods (NCCL and torch shared memory)."""

    verify_deadline_seconds: int = 3600
    """activeDeadlineSeconds of the verify Job: a hung verify fails instead of blocking forever."""

    engine_command: str | None = None
    """sglang server command passed to the runtime; None lets the runtime use its default."""

    image_pull_seconds: int = 300
    """A Ray pod whose image pull has failed (ErrImagePull / ImagePullBackOff) this long after it reached its node
    ends the job (reason ImagePullFailed)."""
    crash_loop_restarts: int = 3
    """A Ray container in CrashLoopBackOff after this many restarts ends the job (reason CrashLoop)."""

    # Production knobs of the kopf shell (see docs/operator.md).
    watch_server_timeout: int = 300
    """Seconds the API server keeps a watch open before kopf reconnects (catches silent stalls)."""
    watch_client_timeout: int = 330
    """Client-side watch timeout, a little above the server's."""
    connect_timeout: int = 30
    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    metrics_port: int | None = 9090
    max_workers: int = 8
    resync_seconds: int = 60
    """Every so often unfinished jobs are reconciled even without an event (0 turns this off)."""
    """Threads running the (synchronous) reconcile function."""

    leader_election_namespace: str | None = None
    """Namespace of the Lease ``leader_election_name``: when set, only the replica holding it acts."""
    leader_election_name: str = "forge-replay-operator"
    lease_seconds: int = 15
    """A leader that has not renewed for this long is replaced (renewed every third of it)."""

    extra_labels: dict[str, str] = field(default_factory=dict)
    """Labels added to every child object (e.g. a team or cost-centre label)."""

    def image_for(self, spec_image: str) -> str:
        """The runtime image a job uses: its own, else the operator's default."""
        return spec_image or self.runtime_image
