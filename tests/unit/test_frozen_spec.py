"""Spec immutability after launch: the operator's refusal and the CRD's transition rules read one list."""

from __future__ import annotations

from forge_replay.api.crd import crd, frozen_after_launch_rules
from forge_replay.api.job import MUTABLE_AFTER_LAUNCH, ForgeReplayJobSpec
from forge_replay.controller.render import frozen_spec
from tests.unit.test_status import job


def test_every_spec_field_but_the_mutable_ones_has_a_transition_rule() -> None:
    aliases = {f.alias or n for n, f in ForgeReplayJobSpec.model_fields.items() if n not in MUTABLE_AFTER_LAUNCH}
    rules = frozen_after_launch_rules()
    assert {r["fieldPath"].removeprefix(".spec.") for r in rules} == aliases
    for rule in rules:
        key = rule["fieldPath"].removeprefix(".spec.")
        assert f"self.spec.{key} == oldSelf.spec.{key}" in rule["rule"] and "oldSelf.status.launchedGeneration" in \
            rule["rule"]
        assert rule["message"].startswith(f"spec.{key} cannot change once the job is launched")
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert all(r in root["x-kubernetes-validations"] for r in rules)


def test_the_operator_freezes_what_the_rules_freeze() -> None:
    frozen = frozen_spec(job())
    assert "suspend" not in frozen and {"replay", "model", "trainer"} <= set(frozen)
    assert set(frozen) <= {r["fieldPath"].removeprefix(".spec.") for r in frozen_after_launch_rules()}
