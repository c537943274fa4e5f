"""The release gate learns from history (issue 35): baselines of several runs of one identity, bands over their
statistics, shadow mode, regressions explained and windowed checks, over hand-made report sets."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from forge_replay.api.metrics import GATED_METRICS, MEASURED_METRICS, MEMORY_METRICS
from forge_replay.verdict.baseline import KEPT, applied_size, baseline_configmap
from forge_replay.verdict.reports import parse_report, unusable_reason
from forge_replay.verdict.statistics import history_content, reference, reference_peaks
from tests.unit.test_verdict_gate import ENV, IDENTITY, good, invoke, long_report, write


def run(day, reserved=(75.0, 74.0), step=(12.0, 12.5, 13.0), env=None, identity=None, job="release", **top):
    """A usable report of three rollouts on two ranks: loss as a debug replay reproduces it, step times and memory
    as they vary run to run."""
    doc = good(job=job, started_at=f"2026-12-{day:02d}T10:00:00Z", environment=env or ENV,
               identity=identity or {**IDENTITY, "job": job}, **top)
    for r, seconds in zip(doc["rollouts"], step):
        r["step_seconds"] = seconds
        r["memory"] = [{"rank": k, "device": "cuda:0", "peak_allocated_gib": gib - 4, "peak_reserved_gib": gib,
                        "peak_rss_gib": 3.0, "rss_reset": True} for k, gib in enumerate(reserved)]
    return doc


def content(*docs):
    return history_content(list(docs), GATED_METRICS, MEMORY_METRICS, KEPT, MEASURED_METRICS)


# ------------------------------------------------------------------------------------------ item 2: several runs


def test_several_runs_make_per_rollout_statistics_and_per_rank_peaks():
    runs = [run(1, (75.0, 74.0), (12.0, 12.5, 13.0)), run(2, (76.0, 74.5), (12.4, 12.5, 13.6), job="release-2"),
            run(3, (77.0, 73.0), (12.2, 12.5, 13.3), job="release-3")]
    base = content(*runs)
    assert base["runs"] == 3 and [h["job"] for h in base["history"]] == ["release", "release-2", "release-3"]
    assert base["job"] == "release-3"  # the newest run's fields
    cols = base["rollouts"]
    assert cols["loss"] == [0.5, 0.25, 0.125] and "loss.min" not in cols  # equal in every run: the mean alone
    assert cols["step_seconds"][0] == pytest.approx(12.2) and cols["step_seconds.spread"][0] == pytest.approx(0.4)
    assert cols["step_seconds.min"][2] == 13.0 and cols["step_seconds.max"][2] == 13.6
    assert cols["peak_reserved_gib"] == [76.0, 76.0, 76.0] and cols["peak_reserved_gib.spread"] == [2.0] * 3
    peak = base["peaks"]["peak_reserved_gib"]
    assert peak["0"] == {"mean": 76.0, "min": 75.0, "max": 77.0, "spread": 2.0, "runs": 3}
    assert peak["1"]["min"] == 73.0 and peak["1"]["max"] == 74.5
    doc = parse_report(json.dumps(base), "b")  # as the verdict reads it back
    assert unusable_reason(doc) is None
    stats = reference(doc["rollouts"][0], "step_seconds", 3)
    assert (stats.min, stats.max, stats.runs) == (12.0, 12.4, 3)
    assert reference_peaks(doc, "peak_reserved_gib")["0"].spread == 2.0


def test_a_rollout_not_every_run_recorded_says_how_many_did():
    short = run(2, job="b")
    short["rollouts"] = short["rollouts"][:2]
    cols = content(run(1), short)["rollouts"]
    assert cols["loss.runs"] == [2, 2, 1] and cols["rollout_id"] == [0, 1, 2]


def test_report_baseline_of_several_runs_and_refusals_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = write(tmp_path, "a.json", run(1)), write(tmp_path, "b.json", run(2, (76.0, 74.0), job="nightly"))
    result = invoke("baseline", a, b, "--name", "release-history")
    assert result.exit_code == 0, result.output
    data = json.loads(yaml.safe_load(result.output)["data"]["report.json"])
    assert data["runs"] == 2 and data["rollouts"]["peak_reserved_gib.max"] == [76.0] * 3
    lr = {**IDENTITY, "trainer": {**IDENTITY["trainer"], "learning_rate": 1e-5}}
    unusable = [("other.json", run(3, identity=lr), "other.json: a run of another identity than a.json "
                 "(trainer.learning_rate 1e-06 -> 1e-05)"),
                ("failed.json", run(4, expectations=[{"name": "maxPeakMemoryGiB", "passed": False}]),
                 "failed.json: its own expectations failed"),
                ("partial.json", run(5, partial=True, completed=2), "partial.json: the run did not finish"),
                ("again.json", run(1), "again.json: the same run as a.json")]
    for name, doc, _ in unusable:
        write(tmp_path, name, doc)
    refused = invoke("baseline", "a.json", "b.json", *[u[0] for u in unusable], "--name", "release-history")
    assert refused.exit_code == 2
    for _, _, why in unusable:
        assert why in refused.output
    checkpointing = {**IDENTITY, "trainer": {**IDENTITY["trainer"], "gradient_checkpointing": True}}
    same = invoke("baseline", a, write(tmp_path, "gc.json", run(6, identity=checkpointing)), "--name", "h")
    assert same.exit_code == 0, same.output  # memory, not numbers: one identity


def test_one_report_still_makes_the_one_run_baseline_unless_statistics_are_asked(tmp_path):
    a = write(tmp_path, "a.json", run(1))
    plain = json.loads(yaml.safe_load(invoke("baseline", a, "--name", "b").output)["data"]["report.json"])
    assert plain["format"] == "forge-replay-baseline/v1" and "peak_reserved_gib" not in plain["rollouts"]
    stats = json.loads(yaml.safe_load(invoke("baseline", a, "--name", "b", "--statistics").output)["data"]
                       ["report.json"])
    assert stats["runs"] == 1 and stats["peaks"]["peak_reserved_gib"]["0"]["spread"] == 0.0


def test_five_1000_rollout_runs_fit_client_side_apply():
    import random

    docs = []
    for k in range(5):
        doc, draw = long_report(), random.Random(k).random
        doc["started_at"] = f"2026-12-0{k + 1}T00:00:00Z"
        for r in doc["rollouts"]:
            r["step_seconds"] = 12 + draw()
            for mem in r["memory"]:
                mem.update(peak_reserved_gib=75 + draw(), peak_allocated_gib=71 + draw())
        docs.append(doc)
    assert applied_size(baseline_configmap(content(*docs), "release-history", "ml")) < 262144 - 4096


# ------------------------------------------------------------------------------------------ item 3: bands


def expect(bands=(), metrics=("loss",), **more):
    from forge_replay.api import parse_job
    from tests.unit.spec_factory import debug_job

    spec = {"baseline": {"configMapName": "b", "metrics": list(metrics), "bands": list(bands)}, **more}
    return parse_job(debug_job(metadata={"name": "release"}, spec__expect=spec)).spec.expect


def verdict(doc, base, e):
    from forge_replay.verdict.checks import check_report

    return {c.name: c for c in check_report(doc, e, parse_report(json.dumps(base), "b"))}


HISTORY = [run(1, (75.0, 74.0)), run(2, (76.0, 74.5), job="r2"), run(3, (77.0, 73.0), job="r3")]
RESERVED_2PC = {"metric": "peak_reserved_gib", "rtol": 0.02}
BANDS = [
    # (case, run, band, passed, message fragment)
    ("noisy-but-good", run(4, (77.4, 74.0)), RESERVED_2PC, True, "within the band of 3 trusted run(s)"),
    ("memory-regression", run(4, (79.0, 74.0)), RESERVED_2PC, False,
     "rollout 0: peak reserved 79 GiB, +1.48 GiB over the band of 3 trusted runs (74.48 GiB .. 77.52 GiB"),
    ("under-the-band", run(4, (70.0, 70.0)), RESERVED_2PC, False, "-4.48 GiB under the band"),
    ("spread-multiple", run(4, (79.0, 74.0)), {"metric": "peak_reserved_gib", "spread": 2}, True, "within"),
    ("spread-multiple-miss", run(4, (81.0, 74.0)), {"metric": "peak_reserved_gib", "spread": 2}, False,
     "+1 GiB over the band of 3 trusted runs (72 GiB .. 80 GiB"),
    ("atol-step-time", run(4, step=(12.9, 12.5, 13.0)), {"metric": "step_seconds", "atol": 0.5}, False,
     "rollout 0: step time 12.9 s, +0.4 s over the band of 3 trusted runs (11.5 s .. 12.5 s"),
    ("per-rank-peak", run(4, (76.0, 76.0)), {"metric": "peak_reserved_gib", "over": "peakPerRank", "rtol": 0.02},
     False, "rank 1: peak reserved 76 GiB, +0.69 GiB over the band of 3 trusted runs (72.36 GiB .. 75.31 GiB"),
    ("per-rank-peak-good", run(4, (76.0, 74.0)), {"metric": "peak_reserved_gib", "over": "peakPerRank",
                                                  "rtol": 0.02}, True, "each of 2 rank(s)"),
]


@pytest.mark.parametrize("case, doc, band, passed, fragment", BANDS, ids=[b[0] for b in BANDS])
def test_bands_over_the_statistics_of_trusted_runs(case, doc, band, passed, fragment):
    checks = verdict(doc, content(*HISTORY), expect([band]))
    check = checks[f"baseline.{band['metric']}.{'peakPerRank' if band.get('over') else 'band'}"]
    assert check.passed is passed and fragment in check.message, check.message
    assert checks["baseline.loss"].passed  # the exact comparison of a deterministic metric, as before


def test_a_regression_message_names_the_changed_setting():
    changed = {**ENV, "sglang": "0.5.23", "trainer": {"gradient_checkpointing": False, "micro_batch_tokens": 4096}}
    history = [run(d, env={**ENV, "sglang": "0.5.22", "trainer": {"gradient_checkpointing": True,
                                                                   "micro_batch_tokens": 4096}}, job=f"r{d}")
               for d in (1, 2, 3, 5, 6)]
    check = verdict(run(7, (80.0, 74.0), env=changed), content(*history), expect([RESERVED_2PC]))[
        "baseline.peak_reserved_gib.band"]
    assert not check.passed
    assert "over the band of 5 trusted runs" in check.message
    assert "sglang 0.5.22 -> 0.5.23" in check.message
    assert "trainer.gradient_checkpointing True -> False" in check.message
    assert "micro_batch_tokens" not in check.message  # what did not change is not named


def test_a_one_run_baseline_without_memory_cannot_gate_memory():
    from forge_replay.verdict.baseline import baseline_content

    one = baseline_content(run(1), GATED_METRICS)  # the v1 layout keeps no memory entries
    check = verdict(run(2), one, expect([RESERVED_2PC]))["baseline.peak_reserved_gib.band"]
    assert not check.passed and "the baseline holds no finite peak_reserved_gib" in check.message


def test_a_band_never_accepts_what_is_not_finite():
    for bad in (math.nan, math.inf, -math.inf, None):
        doc = run(4)
        doc["rollouts"][1]["step_seconds"] = bad
        check = verdict(doc, content(*HISTORY), expect([{"metric": "step_seconds", "rtol": 1e9}]))[
            "baseline.step_seconds.band"]
        assert not check.passed and check.rollout == 1


# ------------------------------------------------------------------------------------------ item 7: windows

WINDOWS = [
    ({"metric": "loss", "last": 2, "atMost": 0.2}, True, "mean of loss over the last 2 rollouts (1..2) 0.1875 within"),
    ({"metric": "loss", "last": 2, "atMost": 0.1}, False, "0.1875 > atMost 0.1"),
    ({"metric": "loss", "atLeast": 0.3}, False, "over the run (0..2) 0.2916666666666667 < atLeast 0.3"),
    ({"metric": "peak_reserved_gib", "statistic": "max", "atMost": 74.5}, False, "max of peak reserved over the run"),
    ({"metric": "step_seconds", "statistic": "max", "atMost": 13.5}, True, "13 s within atMost 13.5"),
    ({"metric": "loss", "last": 5, "atMost": 1}, True, "only 3 were replayed"),
    ({"metric": "weight_sync_seconds", "atMost": 1}, False, "rollout 0: weight_sync_seconds is not recorded"),
]


@pytest.mark.parametrize("window, passed, fragment", WINDOWS)
def test_windows(window, passed, fragment):
    from forge_replay.verdict.checks import check_report

    e = expect(metrics=("loss",), windows=[window])
    e = e.model_copy(update={"baseline": None})
    check = check_report(run(1), e)[-1]
    assert check.name == f"window.{window.get('statistic', 'mean')}.{window['metric']}"
    assert check.passed is passed and fragment in check.message, check.message


@pytest.mark.parametrize("expect_spec, path, fragment", [
    ({"windows": [{"metric": "loss"}]}, "spec.expect.windows[0]", "checks nothing"),
    ({"windows": [{"metric": "loss", "atMost": 1, "atLeast": 2}]}, "spec.expect.windows[0].atLeast", "no value"),
    ({"windows": [{"metric": "loss", "last": 0, "atMost": 1}]}, "spec.expect.windows[0].last", ""),
    ({"windows": [{"metric": "los", "atMost": 1}]}, "spec.expect.windows[0].metric", ""),
    ({"baseline": {"configMapName": "b", "bands": [{"metric": "step_seconds"}]}},
     "spec.expect.baseline.bands[0]", "no width"),
    ({"baseline": {"configMapName": "b", "bands": [{"metric": "loss", "over": "peakPerRank", "rtol": 1}]}},
     "spec.expect.baseline.bands[0].over", "memory peak"),
    ({"baseline": {"configMapName": "b", "bands": [{"metric": "step_seconds", "rtol": -1}]}},
     "spec.expect.baseline.bands[0].rtol", ""),
])
def test_malformed_bands_and_windows_name_the_field(expect_spec, path, fragment):
    from forge_replay.api import SpecInvalid, parse_job
    from tests.unit.spec_factory import debug_job

    with pytest.raises(SpecInvalid) as info:
        parse_job(debug_job(spec__expect=expect_spec))
    found = [str(p) for p in info.value.problems]
    assert any(p.startswith(path + ":") and fragment in p for p in found), found


# ------------------------------------------------------------------------------------------ properties


FLOATS = st.floats(allow_nan=True, allow_infinity=True)
NON_NEGATIVE = st.one_of(st.floats(min_value=0), st.just(float("nan")), st.just(float("inf")))
WIDTH = st.one_of(st.none(), NON_NEGATIVE)


@given(value=st.sampled_from([float("nan"), float("inf"), float("-inf")]), mean=FLOATS,
       spread=NON_NEGATIVE, rtol=WIDTH, atol=WIDTH, k=WIDTH)
def test_a_band_never_accepts_nan_or_inf(value, mean, spread, rtol, atol, k):
    from forge_replay.verdict.bands import band_of, within
    from forge_replay.verdict.statistics import Stats

    band = band_of(Stats(mean, mean, mean + spread, spread, 3), rtol, atol, k)
    assert not within(value, band)
    assert band is None or (band.low <= band.high and math.isfinite(band.low) and math.isfinite(band.high))


FAILURES = st.sampled_from([
    {"partial": True}, {"error": "boom"}, {"interrupted": "SIGTERM"}, {"stopped_early": "over budget"},
    {"expectations": [{"name": "baseline.peak_reserved_gib.band", "passed": False}]},
    {"summary": {"rollouts": 3, "all_finite": False}},
])


@given(failure=FAILURES, where=st.integers(min_value=0, max_value=3), size=st.integers(min_value=1, max_value=4))
def test_a_failed_run_is_never_trusted(failure, where, size):
    from forge_replay.verdict.baseline import several_runs_problems

    docs = [(f"run-{i}.json", run(i + 1, job=f"r{i}")) for i in range(size)]
    where = min(where, size - 1)
    docs[where][1].update(failure)
    problems = several_runs_problems(docs)
    assert any(p.startswith(f"run-{where}.json: ") for p in problems), problems


# ------------------------------------------------------------------------------------------ item 5: shadow mode


@pytest.mark.parametrize("enforce, rj, result, phase, reason", [
    (False, "SUCCEEDED", "Succeeded", "Succeeded", "ExpectationsNotMetShadow"),
    (False, None, "Succeeded", "Succeeded", "ExpectationsNotMetShadow"),  # the RayJob is gone: the runtime's record
    (True, "FAILED", "Failed", "Failed", "ExpectationsNotMet"),
    (True, "SUCCEEDED", "Succeeded", "Failed", "ExpectationsNotMet"),  # a verdict not met is never a pass
])
def test_shadow_records_the_verdict_and_the_job_succeeds_enforce_fails_it(enforce, rj, result, phase, reason):
    from forge_replay.controller.status import status_from
    from tests.unit.test_expect_status import EXPECT, LOSS_OK, MEMORY_MISS, cond, gate, progress, rayjob

    job = gate({**EXPECT, "enforce": enforce})
    status = status_from(job, rayjob(rj) if rj else None, None, progress(result, MEMORY_MISS, LOSS_OK))
    met = cond(status, "ExpectationsMet")
    assert status["phase"] == phase and (met["status"], met["reason"]) == ("False", reason)
    assert "maxPeakMemoryGiB: peak memory (GiB, RSS) 0.8 > 0.01" in met["message"]
    assert (cond(status, "Stalled")["status"] == "True") is enforce
    assert [e["passed"] for e in status["expectations"]] == [False, True]  # recorded either way
    if not enforce:
        assert met["message"].startswith("shadow mode (spec.expect.enforce: false), not enforced: ")
        health = pytest.importorskip("tests.unit.test_argocd_health")
        obj = {**job.model_dump(mode="json", by_alias=True, exclude_none=True), "status": status}
        verdict_health = health.run_health(obj)
        assert verdict_health["status"] == "Healthy" and "not enforced: maxPeakMemoryGiB" in verdict_health["message"]


@pytest.mark.parametrize("enforced, outcome, checks, code", [
    (False, "fits", [{"name": "maxPeakMemoryGiB", "passed": False, "message": "9 > 8"}], 0),
    (True, "fits", [{"name": "maxPeakMemoryGiB", "passed": False, "message": "9 > 8"}], 3),
    (False, "fits", [{"name": "outcome", "passed": False, "message": "the run's outcome is fits"}], 0),
    (False, "outOfMemory", [{"name": "outcome", "passed": False, "message": "outcome is outOfMemory"}], 4),
    (None, "fits", [{"name": "maxFallbacks", "passed": True, "message": "0 <= 0"}], 0),
])
def test_run_exits_0_in_shadow_mode_but_an_unexpected_out_of_memory_still_fails(enforced, outcome, checks, code):
    from forge_replay.runtime.report import RunReport
    from forge_replay.runtime.run_inputs import exit_status

    report = RunReport(job="gate", mode="debug", world_size=1, device="cpu", num_params=1, started_at="now",
                       outcome=outcome, expectations=checks, enforced=enforced, error="out of memory")
    status, why = exit_status(report)
    assert status == code
    if enforced is False and code == 0:
        assert why.startswith("shadow mode (spec.expect.enforce: false), not enforced: ")


def test_a_slime_or_miles_run_in_shadow_mode_records_its_verdict_and_succeeds(tmp_path):
    from forge_replay.api import parse_job
    from forge_replay.api.progress_report import PROGRESS_KEY, ProgressReport
    from forge_replay.backends import launch, publish
    from tests.unit.test_byo_publish import GOLDEN, write_probe_files

    doc = yaml.safe_load((GOLDEN / "miles-debug.in.yaml").read_text())
    doc["spec"]["expect"] = {"maxPeakMemoryGiB": 64, "enforce": False}
    assert "--shadow --exit-code" in launch.entrypoint(parse_job(doc).spec, "/dumps", results_dir="/r")
    write_probe_files(tmp_path / "probe")
    assert publish.main(["--results", str(tmp_path), "--exit-code", "0", "--backend", "miles", "--total", "4",
                         "--max-peak-memory-gib", "64", "--shadow"]) == 0
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["enforced"] is False and written["expectations"][0]["passed"] is False
    result = ProgressReport.model_validate_json((tmp_path / PROGRESS_KEY).read_text()).result
    assert result.phase == "Succeeded" and "not enforced: 1 of 1 expectation(s) not met" in result.message


# ------------------------------------------------------------------------------------------ item 1: environment


def test_the_environment_records_what_explains_a_run_that_moved():
    from forge_replay.api import parse_job
    from forge_replay.runtime.environment import environment
    from forge_replay.verdict.explain import what_changed
    from tests.unit.spec_factory import debug_job

    spec = parse_job(debug_job(spec__trainer__gradient_checkpointing=True)).spec
    env = environment(7, "cpu", 1, {}, {}, spec)
    assert env["trainer"] == {"gradient_checkpointing": True, "micro_batch_tokens": spec.trainer.micro_batch_tokens}
    assert "cuda" in env and "sglang" in env  # None where not installed / a CPU build: recorded as such
    off = environment(7, "cpu", 1, {}, {}, parse_job(debug_job(spec__trainer__gradient_checkpointing=False)).spec)
    assert what_changed(off, [env, env]) == "trainer.gradient_checkpointing True -> False"
    assert what_changed(env, [env]) == "" and what_changed({}, [env]) == ""
    assert what_changed({"sglang": "0.5.23"}, [{"sglang": "0.5.21"}, {"sglang": "0.5.22"}]) == \
        "sglang {0.5.21, 0.5.22} -> 0.5.23"
