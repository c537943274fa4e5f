"""The images a job's Ray pods ran, by digest (issue 35): what the operator records into the progress ConfigMap
under :data:`IMAGES_KEY` and the runtime copies into report.json's ``environment`` (``image_digests``).

A pod cannot read its own image digest: the kubelet writes it into the pod's status
(``status.containerStatuses[].imageID``), which the downward API does not expose, and reading it from the API
server would need ``get pods`` for the runtime. So the operator, which already lists the Ray pods, records it
(``forge_replay.controller.images``) and the runtime reads it with the one right it already has: get on its own
progress ConfigMap."""

from __future__ import annotations

import json

IMAGES_KEY = "images.json"
"""The progress ConfigMap's key that holds the Ray pods' image digests (JSON: ``{role: digest}``)."""

IMAGE_ROLES = ("runtime", "trainer")
"""What an image is to a job: ``runtime`` is forge-replay's runtime image (every Ray container of a builtin-trainer
job; the ``forge-replay-lib`` init container of a slime / miles job), ``trainer`` the team's slime / miles image
(spec.trainer.image, every Ray container of such a job)."""


def read_images(text: str | None) -> dict[str, str | list[str]]:
    """The digests :data:`IMAGES_KEY` holds, by role: a digest, or the sorted digests when the pods of one role ran
    different ones (a mutable tag pulled at different times on different nodes). Empty when ``text`` is empty or
    not such a document (it is never fatal: the digests explain a regression, they do not gate one)."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[str, str | list[str]] = {}
    for role, value in doc.items():
        if role not in IMAGE_ROLES:
            continue
        if isinstance(value, str) and value:
            out[role] = value
        elif isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            out[role] = sorted(value)
    return out
