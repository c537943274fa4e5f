"""Table test of the rollout-side plan over mode x FT enabled x components (miles' replay fix)."""

from __future__ import annotations

import itertools

import pytest

from forge_replay.runtime.gating import RolloutSidePlan, plan_rollout_side

COMPONENT_SETS = [(), ("train",), ("rollout",), ("train", "rollout"), ("rollout", "train")]


def expected_plan(mode: str, enabled: bool, components: tuple[str, ...]) -> dict[str, bool]:
    """The rule written out longhand, row by row, independent of the implementation's expression."""
    forge = mode == "forge"
    rollout_ft = forge and enabled and "rollout" in components
    return {
        "start_engines": forge,
        "health_monitors": rollout_ft,
        "fault_injection": rollout_ft,
        "recover_before_weight_sync": rollout_ft,
        "eval_fleet_self_probe": forge and not rollout_ft,
    }


# The full table, spelled out so a reader sees every row and a changed rule fails a named row.
TABLE = [
    # mode,   enabled, components,            engines, monitors/injection/recovery, self-probe
    ("forge", False, (), True, False, True),
    ("forge", False, ("train",), True, False, True),
    ("forge", False, ("rollout",), True, False, True),
    ("forge", False, ("train", "rollout"), True, False, True),
    ("forge", True, (), True, False, True),
    ("forge", True, ("train",), True, False, True),
    ("forge", True, ("rollout",), True, True, False),
    ("forge", True, ("train", "rollout"), True, True, False),
    ("debug", False, (), False, False, False),
    ("debug", False, ("train",), False, False, False),
    ("debug", True, ("train",), False, False, False),
    ("debug", True, ("rollout",), False, False, False),
    ("debug", True, ("train", "rollout"), False, False, False),
]


@pytest.mark.parametrize(("mode", "enabled", "components", "engines", "rollout_ft", "self_probe"), TABLE)
def test_plan_table(mode, enabled, components, engines, rollout_ft, self_probe):
    plan = plan_rollout_side(mode, enabled, components)
    assert plan == RolloutSidePlan(
        start_engines=engines,
        health_monitors=rollout_ft,
        fault_injection=rollout_ft,
        recover_before_weight_sync=rollout_ft,
        eval_fleet_self_probe=self_probe,
    )
    assert plan.rollout_ft is rollout_ft


@pytest.mark.parametrize(
    ("mode", "enabled", "components"), list(itertools.product(("forge", "debug"), (False, True), COMPONENT_SETS))
)
def test_plan_matches_longhand_rule_everywhere(mode, enabled, components):
    plan = plan_rollout_side(mode, enabled, components)
    assert {name: getattr(plan, name) for name in expected_plan(mode, enabled, components)} == expected_plan(
        mode, enabled, components
    )


def test_train_only_ft_plans_exactly_like_no_ft():
    """The miles determinism bug: train-only FT must not add a single rollout-side action."""
    assert plan_rollout_side("forge", True, ["train"]) == plan_rollout_side("forge", False, [])


def test_components_may_be_any_iterable():
    assert plan_rollout_side("forge", True, iter(["rollout"])).health_monitors
    assert plan_rollout_side("forge", True, {"rollout"}).recover_before_weight_sync


def test_unknown_mode_is_refused_with_the_mode_named():
    with pytest.raises(ValueError, match="'replay'"):
        plan_rollout_side("replay", False, [])


# weightSync x colocate x GPUs -> (path, backend); None: the spec rules refuse the combination.
WEIGHT_SYNC_TABLE = [
    ("auto", False, False, ("disk", None)),
    ("auto", False, True, ("distributed", "nccl")),
    ("auto", True, True, ("tensor", None)),
    ("disk", False, False, ("disk", None)),
    ("disk", True, True, ("disk", None)),
    ("distributed", False, False, ("distributed", "gloo")),
    ("distributed", False, True, ("distributed", "nccl")),
    ("distributed", True, True, None),
    ("tensor", True, True, ("tensor", None)),
    ("tensor", False, True, None),
]


@pytest.mark.parametrize("choice, colocate, use_gpus, expected", WEIGHT_SYNC_TABLE)
def test_weight_sync_plan_table(choice, colocate, use_gpus, expected):
    from forge_replay.runtime.gating import plan_weight_sync

    if expected is None:
        with pytest.raises(ValueError, match=choice):
            plan_weight_sync(choice, colocate, use_gpus)
        return
    plan = plan_weight_sync(choice, colocate, use_gpus)
    assert (plan.path, plan.backend) == expected


@pytest.mark.parametrize("choice, colocate", [("tensor", False), ("distributed", True)])
def test_refused_weight_sync_combinations_are_refused_by_the_spec_too(choice, colocate):
    """Every combination the plan raises on is one the spec rules refuse first, naming the field."""
    from forge_replay.api import SpecInvalid, parse_job
    from tests.unit.spec_factory import forge_job

    doc = forge_job(spec__rollout={"numGpus": 2, "numGpusPerEngine": 1, "colocate": colocate, "weightSync": choice})
    with pytest.raises(SpecInvalid) as refused:
        parse_job(doc)
    assert [p.path for p in refused.value.problems] == ["spec.rollout.weightSync"]


def test_a_debug_rollout_manager_constructs_its_replay_source_and_nothing_else(tmp_path):
    """The plan's debug rows in the runtime (no Ray needed): the manager's construction log holds only the
    replay source, its forge-mode hooks do nothing, and no engine fleet can be built from that plan."""
    from forge_replay.api import parse_job
    from forge_replay.runtime.engines.fleet import EngineFleet
    from forge_replay.runtime.rollout_manager import RolloutManager
    from tests.unit.spec_factory import debug_job

    job = parse_job(debug_job(spec__faultTolerance={"enabled": True, "components": ["train"]}))
    manager = RolloutManager(job, str(tmp_path), world_size=1, use_object_store=False)
    assert manager.start() == ["replay_source"] and manager.engine_side is None
    manager.before_train_step(0)
    manager.after_train_step(0, None)
    manager.before_eval(0)
    assert manager.get_construction_log() == ["replay_source"] and manager.engine_report() is None
    with pytest.raises(RuntimeError, match="debug mode"):
        EngineFleet(None, manager.get_plan(), [], None, tmp_path, engine_command_given=False)
