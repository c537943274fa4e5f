"""spec.expect (issue 17): the API accepts the issue's example and refuses a bad baseline naming the field."""

from __future__ import annotations

import pytest

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.spec_parts import ROLLOUT_METRICS
from tests.unit.spec_factory import debug_job

ISSUE_EXAMPLE = {
    "maxPeakMemoryGiB": 130,
    "maxFallbacks": 0,
    "minTokensPerSecond": 0,
    "baseline": {"configMapName": "release-1-3-baseline", "metrics": ["loss", "grad_norm"], "rtol": 1.0e-5,
                 "atol": 1.0e-8},
}


def test_the_issue_example_parses():
    expect = parse_job(debug_job(spec__expect=ISSUE_EXAMPLE)).spec.expect
    assert (expect.max_peak_memory_gib, expect.max_fallbacks, expect.min_tokens_per_second) == (130, 0, 0)
    assert expect.baseline.config_map_name == "release-1-3-baseline"
    assert expect.baseline.metrics == ["loss", "grad_norm"]


def test_a_pvc_baseline_and_defaults():
    b = parse_job(debug_job(spec__expect={"baseline": {"claimName": "results", "path": "r1/report.json"}}))
    assert (b.spec.expect.baseline.metrics, b.spec.expect.baseline.rtol) == (["loss", "grad_norm"], 1.0e-5)
    assert parse_job(debug_job()).spec.expect is None


@pytest.mark.parametrize("expect, path, fragment", [
    ({"baseline": {}}, "spec.expect.baseline", "none is set"),
    ({"baseline": {"configMapName": "b", "claimName": "c", "path": "p"}}, "spec.expect.baseline", "configMapName and claimName + path are set"),
    ({"baseline": {"claimName": "c"}}, "spec.expect.baseline.path", "go together"),
    ({"baseline": {"path": "r.json"}}, "spec.expect.baseline.claimName", "go together"),
    ({"baseline": {"claimName": "c", "path": "../r.json"}}, "spec.expect.baseline.path", "without '..'"),
    ({"baseline": {"configMapName": "b", "metrics": []}}, "spec.expect.baseline.metrics", "at least 1"),
    ({"baseline": {"configMapName": "b", "metrics": ["los"]}}, "spec.expect.baseline.metrics[0]", "'loss'"),
    ({"baseline": {"configMapName": "b", "metrics": ["loss", "loss"]}}, "spec.expect.baseline.metrics", "once"),
    ({"baseline": {"configMapName": "Bad_Name"}}, "spec.expect.baseline.configMapName", ""),
    ({"baseline": {"configMapName": "b", "rtol": -1.0}}, "spec.expect.baseline.rtol", ""),
    ({"maxPeakMemoryGiB": 0}, "spec.expect.maxPeakMemoryGiB", "greater than 0"),
    ({"maxFallbacks": -1}, "spec.expect.maxFallbacks", ""),
    ({"maxFallbacks": 0.5}, "spec.expect.maxFallbacks", ""),
    ({"maxPeakMemoryGib": 1}, "spec.expect.maxPeakMemoryGib", ""),
])
def test_bad_expectations_name_the_field(expect, path, fragment):
    with pytest.raises(SpecInvalid) as info:
        parse_job(debug_job(spec__expect=expect))
    found = [str(p) for p in info.value.problems]
    assert any(p.startswith(path + ":") and fragment in p for p in found), found


def test_baseline_metrics_are_numeric_rollout_fields_of_the_report():
    """The API's metric names are the report's numeric per-rollout fields (one list, checked here)."""
    import dataclasses
    import typing

    from forge_replay.runtime.report import RolloutRecord

    hints = typing.get_type_hints(RolloutRecord)
    numeric = {f.name for f in dataclasses.fields(RolloutRecord) if hints[f.name] in (int, float)}
    assert set(ROLLOUT_METRICS) <= numeric
    # the rest are the record's keys and timings, which differ run to run
    assert numeric - set(ROLLOUT_METRICS) == {"step", "rollout_id", "step_seconds", "data_wait_seconds"}, (
        "a numeric per-rollout field of RolloutRecord is new: add it to api.spec_parts.ROLLOUT_METRICS (then "
        "scripts/generate) so spec.expect.baseline can compare it, or to this set if it varies run to run")


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_a_foreign_trainer_may_expect_only_what_its_probe_records(backend):
    """slime / miles: maxPeakMemoryGiB is checked against the memory probe; what their report does not hold is
    refused, naming the field and why (issue 25: this relaxed 'spec.expect needs the builtin trainer')."""
    def job(expect):
        doc = debug_job(spec__expect=expect, spec__trainer__backend=backend,
                        spec__trainer__image="registry.example/slime:1", spec__trainer__workingDir="/root/slime",
                        spec__trainer__args=["--rollout-batch-size", "8"])  # required by both parsers (issue 26)
        for key in ("microBatchTokens", "gpusPerNode"):
            doc["spec"]["trainer"].pop(key, None)
        return doc

    assert parse_job(job({"maxPeakMemoryGiB": 130})).spec.expect.max_peak_memory_gib == 130
    asked = {"maxPeakMemoryGiB": 130, "maxFallbacks": 0, "minTokensPerSecond": 1,
             "baseline": {"configMapName": "b"}}
    with pytest.raises(SpecInvalid) as info:
        parse_job(job(asked))
    problems = {p.path: p.message for p in info.value.problems}
    assert set(problems) == {"spec.expect.maxFallbacks", "spec.expect.minTokensPerSecond", "spec.expect.baseline"}
    assert all(f"not recorded for backend {backend}" in m for m in problems.values())
    assert "does not time its training steps" in problems["spec.expect.minTokensPerSecond"]


@pytest.mark.parametrize("expect, path, fragment", [
    ({}, "spec.expect", "holds no check"),
    ({"baseline": {"configMapName": "b", "rtol": float("nan")}}, "spec.expect.baseline.rtol", "finite"),
    ({"baseline": {"configMapName": "b", "atol": float("inf")}}, "spec.expect.baseline.atol", "finite"),
    ({"baseline": {"configMapName": "b", "atol": -1e-9}}, "spec.expect.baseline.atol", "greater than or equal"),
    ({"baseline": {"configMapName": "b", "metrics": []}}, "spec.expect.baseline.metrics", "at least 1"),
])
def test_an_expectation_that_checks_nothing_or_everything_is_refused(expect, path, fragment):
    with pytest.raises(SpecInvalid) as info:
        parse_job(debug_job(spec__expect=expect))
    assert any(p.path == path and fragment in p.message for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("backend", ["builtin", "slime"])
def test_an_expected_outcome_alone_is_a_check(backend):
    """spec.expect.outcome (issue 31) is a gate of its own: a release test that a known-too-big configuration still
    runs out of memory needs nothing else; slime / miles record it too (their publish step)."""
    from tests.unit.spec_factory import byo_job

    doc = debug_job(spec__expect={"outcome": "outOfMemory"}) if backend == "builtin" else byo_job(
        backend, spec__expect={"outcome": "outOfMemory"})
    assert parse_job(doc).spec.expect.outcome == "outOfMemory"
