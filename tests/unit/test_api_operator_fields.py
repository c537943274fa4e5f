"""The spec fields the operator adds for real clusters (issue 13): TTL bound, queued suspend, spec.pod."""

from __future__ import annotations

import pytest

from forge_replay.api import SpecInvalid, parse_job
from tests.unit.spec_factory import forge_job


def problems(doc):
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def test_ttl_defaults_to_five_minutes_and_is_an_int32():
    assert parse_job(forge_job()).spec.ttl_seconds_after_finished == 300
    assert parse_job(forge_job(spec__ttlSecondsAfterFinished=2**31 - 1)).spec.ttl_seconds_after_finished == 2**31 - 1
    [problem] = problems(forge_job(spec__ttlSecondsAfterFinished=2**31))
    assert problem.startswith("spec.ttlSecondsAfterFinished:")


def test_a_queued_job_cannot_be_suspended_by_spec():
    [problem] = problems(forge_job(spec__suspend=True, spec__scheduling={"queueName": "h200"}))
    assert problem.startswith("spec.suspend: cannot be true with spec.scheduling.queueName")
    assert "Workload" in problem
    assert parse_job(forge_job(spec__suspend=True)).spec.suspend is True
    assert parse_job(forge_job(spec__scheduling={"queueName": "h200"})).spec.suspend is False


def test_spec_pod_env_accepts_value_from_and_refuses_unknown_sources():
    env = [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
           {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    job = parse_job(forge_job(spec__pod={"env": env, "imagePullSecrets": [{"name": "creds"}]}))
    assert [e.name for e in job.spec.pod.env] == ["A", "B", "C"]
    assert job.spec.pod.env[1].value_from.secret_key_ref.key == "k"
    found = problems(forge_job(spec__pod={"env": [{"name": "D", "valueFrom": {"vaultRef": {}}}]}))
    assert any(p.startswith("spec.pod.env[0].valueFrom") for p in found), found
    found = problems(forge_job(spec__pod={"imagePullSecrets": [{"name": "Not_A_Name"}]}))
    assert any(p.startswith("spec.pod.imagePullSecrets[0].name") for p in found), found
