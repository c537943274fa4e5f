"""The release gate learns from history (issue 35): baselines of several runs of one identity, bands over their
statistics, shadow mode, regressions explained and windowed checks, over hand-made report sets."""

from __future__ import annotations

import json

import pytest
import yaml

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
