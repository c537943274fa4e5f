"""Whether the Ray head pod a failed RayJob ran on went away mid-run (:func:`head_pod_loss`): what KubeRay recorded
of the head against the pods as read now. The status says such a failure with reason ``HeadPodLost``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

TEARDOWN_MARGIN = timedelta(seconds=5)
"""How long before KubeRay's own teardown (the RayJob's endTime + ttlSecondsAfterFinished) a missing head pod stops
counting as lost: the operator's clock and KubeRay's may differ by that much."""


def head_pod_loss(rayjob: dict[str, Any], pods: list[dict[str, Any]], now: datetime) -> str | None:
    """What happened to the Ray head pod a failed RayJob ran on, when it went away mid-run; None otherwise.

    The head the job ran on is the one KubeRay recorded with the job's status (``status.rayClusterStatus.head``,
    written when the Ray job started, kuberay v1.5.0 controllers/ray/rayjob_controller.go:331 and
    raycluster_controller.go:1636). It is lost when it is missing from ``pods`` (the pods of the Ray cluster, read
    now), being deleted, evicted, or when its Ray container restarted (Ray keeps nothing of a job across a head
    restart). KubeRay does not re-create the head of a RayJob's cluster (raycluster_controller.go:621-631).
    Only before KubeRay's own teardown of a finished job (``status.endTime`` + ``ttlSecondsAfterFinished``,
    rayjob_controller.go:1305) is a missing head a loss: afterwards KubeRay deleted it itself."""
    spec = rayjob.get("spec") or {}
    status = rayjob.get("status") or {}
    name = ((status.get("rayClusterStatus") or {}).get("head") or {}).get("podName")
    if not name:
        return None
    if spec.get("shutdownAfterJobFinishes"):
        ended = _parse_time(status.get("endTime"))
        if ended is None:
            return None
        teardown = ended + timedelta(seconds=spec.get("ttlSecondsAfterFinished") or 0)
        if now + TEARDOWN_MARGIN >= teardown:
            return None
    pod = next((p for p in pods if (p.get("metadata") or {}).get("name") == name), None)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return f"the Ray head pod {name} was deleted mid-run"
    pod_status = pod.get("status") or {}
    if pod_status.get("reason") == "Evicted":
        return f"the Ray head pod {name} was evicted mid-run: {pod_status.get('message') or 'no message'}"
    ray_container = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
    for container in pod_status.get("containerStatuses") or []:
        last = (container.get("lastState") or {}).get("terminated")
        if container.get("name") == ray_container and container.get("restartCount") and last:
            return (f"the Ray container {ray_container} of head pod {name} restarted mid-run "
                    f"({last.get('reason') or 'Error'}, exit code {last.get('exitCode')})")
    return None


def _parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None
