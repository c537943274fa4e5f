"""`forge-replay validate` and the real API server agree on the bounds of issue 19: each spec below is refused by
both, naming the same field (the CRD carries the same min/max, types and CEL as the models), or accepted by both.

Where they cannot agree, validate is the stricter: it refuses 4.0 for an integer (the API server stores it as 4)
and node selector / pod label keys that are not label keys (the CRD cannot afford that CEL's cost on map keys;
the pods would be refused later)."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from forge_replay.commands.validate import validate_files
from tests.cluster.test_control_plane import GROUP, PLURAL, VERSION, _set, minimal_job, project_crd  # noqa: F401

pytestmark = pytest.mark.cluster

REFUSED = [
    ("spec.ttlSecondsAfterFinished", 10**20),
    ("spec.ttlSecondsAfterFinished", 2**31),
    ("spec.trainer.microBatchTokens", 1e26),
    ("spec.trainer.nSamplesPerPrompt", 2**31),
    ("spec.replay.numRollouts", True),
    ("spec.replay.numRollouts", "4"),
    ("spec.replay.dumps.path", "run/\x00/rollout_{rollout_id}.pt"),
    ("spec.replay.dumps.path", "run/" + "x" * 256),
    ("metadata.labels", {"bad key!": "v"}),
    ("metadata.labels", {"team": "bad value!"}),
]
ACCEPTED = [
    ("spec.ttlSecondsAfterFinished", 2**31 - 1),
    ("spec.trainer.microBatchTokens", 2**31 - 1),
    ("spec.trainer.learningRate", 1),
    ("spec.replay.dumps.path", "run/" + "x" * 255),
    ("metadata.labels", {"app.kubernetes.io/name": "forge-replay", "empty": ""}),
]


def ids(cases):
    return [f"{dotted}={str(value)[:24]}" for dotted, value in cases]


def validate(tmp_path, document) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    out = io.StringIO()
    return validate_files([str(path)], out), out.getvalue()


def create(control_plane, namespace, document) -> str | None:
    """None when the API server stores the job; else its refusal's message."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with control_plane.api_client() as api:
        try:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, document, field_validation="Strict")
        except ApiException as refused:
            assert refused.status in (400, 422), refused.body
            return json.loads(refused.body)["message"]
    return None


@pytest.mark.parametrize("dotted, value", REFUSED, ids=ids(REFUSED))
def test_refused_by_validate_and_by_the_api_server_naming_the_field(control_plane, project_crd, namespace,
                                                                    tmp_path, dotted, value):
    document = _set(minimal_job("bounds"), dotted, value)
    code, out = validate(tmp_path, document)
    assert code == 1 and f": {dotted}" in out, out
    message = create(control_plane, namespace, document)
    assert message is not None, f"the API server stored {dotted}={value!r}, which validate refuses"
    assert dotted in message, message


@pytest.mark.parametrize("dotted, value", ACCEPTED, ids=ids(ACCEPTED))
def test_accepted_by_both(control_plane, project_crd, namespace, tmp_path, dotted, value):
    document = _set(minimal_job("bounds"), dotted, value)
    code, out = validate(tmp_path, document)
    assert code == 0, out
    assert create(control_plane, namespace, document) is None
