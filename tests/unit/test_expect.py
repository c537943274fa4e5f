"""The verdict (issue 17): a report against spec.expect and a baseline report, table by table."""

from __future__ import annotations

import json
import math

import pytest

from forge_replay.api.spec_parts import ExpectSpec
from forge_replay.verdict.checks import check_report, first_failure, over_memory_budget, peak_memory_gib
from forge_replay.verdict.compare import rollout_differences
from forge_replay.verdict.identity import environment_differences
from forge_replay.verdict.reports import ReportUnreadable, parse_report, read_report


def record(rid, loss, grad_norm=1.0, rss=0.5, reserved=None, fallback=False):
    mem = {"rank": 0, "device": "cpu", "peak_rss_gib": rss, "peak_allocated_gib": None, "peak_reserved_gib": reserved}
    return {"rollout_id": rid, "loss": loss, "grad_norm": grad_norm, "fallback_used": fallback, "memory": [mem]}


def report(*records, tokens_per_second=100.0, fallbacks=None):
    """A finished run's report: usable as a baseline (verdict.reports.unusable_reason)."""
    fb = sum(r["fallback_used"] for r in records) if fallbacks is None else fallbacks
    return {"job": "release", "partial": False, "completed": len(records), "planned": len(records),
            "rollouts": list(records), "summary": {"fallbacks": fb, "tokens_per_second": tokens_per_second}}


def checked(run, spec, *baseline):
    """The checks of ``spec`` but finiteMetrics (which every spec.expect brings: test_non_finite.py)."""
    checks = check_report(run, spec, *baseline)
    assert checks[0].name == "finiteMetrics"
    return checks[1:]


RUN = report(record(0, 0.5, 2.0), record(1, 0.25, 1.5), record(2, -0.125, 1.0))


def expect(**kw):
    return ExpectSpec.model_validate(kw)


@pytest.mark.parametrize("spec, name, passed, observed, limit", [
    ({"maxPeakMemoryGiB": 1.0}, "maxPeakMemoryGiB", True, 0.5, 1.0),
    ({"maxPeakMemoryGiB": 0.01}, "maxPeakMemoryGiB", False, 0.5, 0.01),
    ({"maxFallbacks": 0}, "maxFallbacks", True, 0, 0),
    ({"minTokensPerSecond": 100}, "minTokensPerSecond", True, 100.0, 100),
    ({"minTokensPerSecond": 101}, "minTokensPerSecond", False, 100.0, 101),
])
def test_limits(spec, name, passed, observed, limit):
    [check] = checked(RUN, expect(**spec))
    assert (check.name, check.passed, check.observed, check.limit) == (name, passed, observed, limit)
    assert (first_failure([check]) is None) == passed


def test_fallbacks_over_the_limit_fail():
    run = report(record(0, 0.5), record(1, 0.5, fallback=True), record(2, 0.5, fallback=True))
    [check] = checked(run, expect(maxFallbacks=1))
    assert (check.passed, check.observed, check.limit) == (False, 2, 1)


def test_gpu_memory_is_the_peak_reserved_of_any_rank():
    run = report(record(0, 0.5, reserved=70.0), record(1, 0.5, reserved=75.5))
    run["rollouts"][1]["memory"].append({"rank": 1, "peak_allocated_gib": 80.0, "peak_reserved_gib": 81.0})
    assert peak_memory_gib(run["rollouts"]) == 81.0
    [check] = checked(run, expect(maxPeakMemoryGiB=80))
    assert (check.passed, check.observed) == (False, 81.0)
    assert "CUDA reserved" in check.message


def test_a_figure_the_run_did_not_record_fails():
    [mem, tps] = checked({"rollouts": [], "summary": {}}, expect(maxPeakMemoryGiB=1, minTokensPerSecond=0))
    assert not mem.passed and not tps.passed and "not recorded" in tps.message


def test_the_memory_budget_after_one_step():
    assert over_memory_budget(record(3, 0.1, rss=0.5), 1.0) is None
    assert over_memory_budget(record(3, 0.1, rss=0.5), None) is None
    why = over_memory_budget(record(3, 0.1, rss=0.5), 0.01)
    assert "rollout 3" in why and "0.01" in why


BASE = {"baseline": {"configMapName": "b", "metrics": ["loss", "grad_norm"], "rtol": 1e-6, "atol": 0.0}}


def edited(rid, **values):
    base = json.loads(json.dumps(RUN))
    for r in base["rollouts"]:
        if r["rollout_id"] == rid:
            r.update(values)
    return base


@pytest.mark.parametrize("baseline, failed, rollout, metric, fragment", [
    (RUN, None, None, None, ""),
    (edited(1, loss=0.25 * 1.01), "baseline.loss", 1, "loss", "differs beyond rtol"),
    (edited(2, grad_norm=1.0 + 1e-7), None, None, None, ""),  # within rtol 1e-6
    (edited(0, grad_norm=2.1), "baseline.grad_norm", 0, "grad_norm", "vs baseline 2.1"),
    (report(record(0, 0.5, 2.0), record(1, 0.25, 1.5)), "baseline.loss", 2, "loss", "no entry for rollout 2"),
    (edited(1, loss=None), "baseline.loss", 1, "loss", "not a number in the baseline"),
    (edited(1, loss=math.nan), "baseline.loss", None, "loss", "non-finite values"),  # not usable: all fail
])
def test_baseline(baseline, failed, rollout, metric, fragment):
    checks = checked(RUN, expect(**BASE), baseline)
    assert [c.name for c in checks] == ["baseline.loss", "baseline.grad_norm"]
    miss = first_failure(checks)
    if failed is None:
        assert miss is None, miss
        assert all(c.rollout is None for c in checks)
        return
    assert (miss.name, miss.rollout, miss.metric) == (failed, rollout, metric)
    assert fragment in miss.message
    assert miss.to_status().get("rollout") == rollout


def test_a_baseline_miss_carries_both_values():
    [loss, _] = checked(RUN, expect(**BASE), edited(1, loss=0.3))
    assert (loss.observed, loss.limit) == (0.25, 0.3)


def test_first_differing_rollout_is_named_not_the_largest():
    baseline = edited(0, loss=0.51)
    baseline["rollouts"][2]["loss"] = 5.0
    [loss, _] = checked(RUN, expect(**BASE), baseline)
    assert loss.rollout == 0


def test_an_unreadable_baseline_fails_every_baseline_check():
    checks = checked(RUN, expect(**BASE), None, "configmap b: not found")
    assert [(c.passed, "configmap b: not found" in c.message) for c in checks] == [(False, True), (False, True)]
    assert not checked(RUN, expect(**BASE))[0].passed  # no baseline given at all: never a silent pass


def test_an_empty_run_has_nothing_to_compare():
    [loss, _] = checked(report(), expect(**BASE), RUN)
    assert not loss.passed and "no rollout" in loss.message


def test_status_form_drops_non_finite_numbers():
    [loss, _] = checked(edited(1, loss=math.inf), expect(**BASE), RUN)
    assert "observed" not in loss.to_status() and loss.to_status()["limit"] == 0.25
    json.dumps(loss.to_status(), allow_nan=False)


def test_differences_rollout_by_rollout():
    rows = rollout_differences(RUN, edited(1, loss=0.3), ["loss"], 1e-6, 0.0)
    assert [(d.rollout, d.within) for d in rows] == [(0, True), (1, False), (2, True)]
    assert rows[1].abs_diff == pytest.approx(0.05)


@pytest.mark.parametrize("text, fragment", [
    ("{", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"job": "j"}', "no 'rollouts' list"),
    ('{"rollouts": [{"loss": 1}]}', "is not an integer"),
    ('{"rollouts": [{"rollout_id": true}]}', "rollout_id True is not an integer"),
])
def test_unreadable_reports(text, fragment, tmp_path):
    with pytest.raises(ReportUnreadable, match=fragment):
        parse_report(text, "b.json")
    with pytest.raises(ReportUnreadable, match="cannot be read"):
        read_report(tmp_path / "absent.json")


def test_environment_differences():
    env = {"seed": 1, "torch": "2.9", "transformers": "4.5", "forge_replay": "0.1", "device": "cpu", "world_size": 1,
           "deterministic": {"use_deterministic_algorithms": True}, "threads": {"torch_intra_op": 2}}
    a, b = {"environment": env}, {"environment": {**env, "torch": "2.8", "world_size": 2}}
    assert environment_differences(a, a) == []
    assert [line.split(":")[0] for line in environment_differences(a, b)] == ["torch", "world_size"]
    assert "recorded no environment" in environment_differences(a, {})[0]

