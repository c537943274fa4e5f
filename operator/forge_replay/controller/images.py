"""The image digests a job's Ray pods run (:func:`ray_pod_images`), from the pods' status as the kubelet writes it;
the reconciler records them once into the progress ConfigMap (``forge_replay.api.images``).

Kubernetes API, core/v1 ContainerStatus (kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
#PodStatus): ``name`` is the container's name in the pod spec; ``imageID`` is "the image ID of the container's
image. The image ID may not match the image ID of the image used in the PodSpec, as it may have been resolved by
the runtime". containerd writes ``<repository>@sha256:<hex>`` for a pulled image (its repo digest) and
``sha256:<hex>`` (the image's own ID) for one imported without a registry; Docker's dockershim wrote
``docker-pullable://<repository>@sha256:<hex>``. It is empty until the container was created from an image.
``initContainerStatuses`` has the same shape for init containers."""

from __future__ import annotations

from typing import Any

from forge_replay.backends.launch import FORGE_LIB_CONTAINER
from forge_replay.controller.render import HEAD_CONTAINER, WORKER_CONTAINER

RAY_CONTAINERS = (HEAD_CONTAINER, WORKER_CONTAINER)


def image_digest(image_id: str | None) -> str | None:
    """The digest of a container status's ``imageID``: what follows its last ``@`` (``sha256:<hex>``), or the whole
    ID without a ``scheme://`` prefix; None when empty. The repository is left out: one image pulled through a mirror
    is still the same image."""
    if not image_id:
        return None
    text = image_id.split("://", 1)[-1]
    return text.rsplit("@", 1)[-1] or None


def ray_pod_images(pods: list[dict[str, Any]], byo: bool) -> dict[str, str | list[str]] | None:
    """``{role: digest}`` of the Ray pods of one job (``forge_replay.api.images.IMAGE_ROLES``): the Ray containers'
    (head and workers) run the ``runtime`` image, or with slime / miles (``byo``) the team's ``trainer`` image, and
    the ``forge-replay-lib`` init container of such a job the ``runtime`` one. A role whose pods ran different digests
    gets their sorted list. None until every Ray container of ``pods`` reports its image (a pod not yet started, or
    no Ray pod at all): the caller asks again later. Pods being deleted, and the submitter's, are left out."""
    found: dict[str, set[str]] = {}
    ray_pods = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        statuses = [("ray", s) for s in status.get("containerStatuses") or []]
        statuses += [("init", s) for s in status.get("initContainerStatuses") or []]
        wanted = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []} & set(RAY_CONTAINERS)
        if not wanted:
            continue
        ray_pods += 1
        for kind, container in statuses:
            name = container.get("name")
            if kind == "ray" and name in wanted:
                role = "trainer" if byo else "runtime"
            elif kind == "init" and name == FORGE_LIB_CONTAINER:
                role = "runtime"
            else:
                continue
            digest = image_digest(container.get("imageID"))
            if digest is None:
                return None
            found.setdefault(role, set()).add(digest)
            wanted.discard(name)
        if wanted:
            return None  # its Ray container has no status yet
    if not ray_pods:
        return None
    return {role: (next(iter(d)) if len(d) == 1 else sorted(d)) for role, d in sorted(found.items())}
