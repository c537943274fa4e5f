"""Names, labels and annotations of everything the operator creates: the single source for all of them."""

from __future__ import annotations

PREFIX = "forgereplay.io"
"""The operator's own prefix for labels, annotations, kopf progress and its (never added) finalizer."""

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "forge-replay"
LABEL_JOB = f"{PREFIX}/job"
LABEL_ROLE = f"{PREFIX}/role"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"

ANNOTATION_SPEC_HASH = f"{PREFIX}/spec-hash"
ANNOTATION_ENTRYPOINT = f"{PREFIX}/entrypoint"  # a slime / miles RayJob's shell line, readable (backends.entry)
"""Hash of the launched spec (all of it but ``suspend``), on the job and on every child."""

FINALIZER = f"{PREFIX}/finalizer"
"""Declared so kopf never uses its default marker; no handler requires it, so it is never added."""

# KubeRay's RayJob kind.
RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAY_PLURAL = "rayjobs"
RAY_KIND = "RayJob"


def config_map_name(job_name: str) -> str:
    """ConfigMap holding ``config.yaml`` (the RuntimeConfig)."""
    return f"{job_name}-config"


def progress_map_name(job_name: str) -> str:
    """ConfigMap the runtime patches with ``progress.json`` (name owned by forge_replay.api.progress_report)."""
    from forge_replay.api.progress_report import progress_configmap_name

    return progress_configmap_name(job_name)


def runtime_account_name(job_name: str) -> str:
    """ServiceAccount, Role and RoleBinding of the runtime pods (all share this name)."""
    return f"{job_name}-runtime"


def verify_job_name(job_name: str) -> str:
    """The pre-flight dump verification batch Job."""
    return f"{job_name}-verify"


def ray_job_name(job_name: str) -> str:
    """The KubeRay RayJob: the same name as the ForgeReplayJob."""
    return job_name


UID_PREFIX = 8
"""Characters of the job's uid in its results folder: a re-run under the same name gets a new folder."""


def results_folder(namespace: str | None, job_name: str, uid: str | None) -> str:
    """The run's folder on the results claim, relative to its root: ``<namespace>/<name>/<uid prefix>``.

    Without a uid (``forge-replay render`` of a file) the last part is left out: the operator always has one.
    """
    parts = [namespace or "default", job_name]
    if uid:
        parts.append(uid.replace("-", "")[:UID_PREFIX])
    return "/".join(parts)


def child_labels(job_name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Labels on every child object: who manages it and which job it belongs to."""
    labels = dict(extra or {})
    labels[LABEL_MANAGED_BY] = MANAGED_BY
    labels[LABEL_JOB] = job_name
    return labels
