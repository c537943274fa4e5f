"""The outcome of a builtin trainer's run (issue 31) as the verdict, the exit status and the published result read it:
spec.expect.outcome is one more check, an out-of-memory exits 4 (0 when expected), the operator reads both."""

from __future__ import annotations

import json

import pytest

from forge_replay.api.outcome import OutOfMemory
from forge_replay.api.progress_report import ProgressReport
from forge_replay.api.spec_parts import ExpectSpec
from forge_replay.runtime.report import RunReport, render_table
from forge_replay.runtime.run_inputs import EXIT_EXPECTATIONS, EXIT_OK, EXIT_OUT_OF_MEMORY, exit_status
from forge_replay.verdict.checks import Limits, check_report, unmet_line
from forge_replay.verdict.outcome import outcome_expected

OOM = OutOfMemory.model_validate({
    "signal": "kernelOomKiller", "where": {"component": "trainer", "rank": 0, "node": "host-a", "pid": 42},
    "when": {"rollout": 1, "phase": "forward"}, "how_much": {"limit_bytes": 3 * 2**30},
}).model_dump(mode="json")


def run(peak_rss=0.5, *, finished=True, oom=None):
    """report.json as parsed: one rollout trained of one (finished) or of two."""
    memory = [{"rank": 0, "device": "cpu", "peak_rss_gib": peak_rss, "peak_allocated_gib": None,
               "peak_reserved_gib": None}]
    return {"job": "memtest", "partial": not finished, "completed": 1, "planned": 1 if finished else 2,
            "error": OutOfMemory.model_validate(oom).line() if oom else None, "out_of_memory": oom,
            "rollouts": [{"rollout_id": 0, "loss": 0.5, "grad_norm": 1.0, "memory": memory}], "summary": {}}


@pytest.mark.parametrize("report, expect, passed, message", [
    (run(), {"outcome": "fits"}, True, "the run's outcome is fits, as expected"),
    (run(), {"outcome": "outOfMemory"}, False, "the run's outcome is fits; spec.expect.outcome is outOfMemory"),
    (run(2.0), {"outcome": "fits", "maxPeakMemoryGiB": 1.0}, False, "outcome is overBudget; spec.expect.outcome"),
    (run(finished=False, oom=OOM), {"outcome": "outOfMemory"}, True, "outcome is outOfMemory, as expected"),
    (run(finished=False, oom=OOM), {"outcome": "fits"}, False, "outcome is outOfMemory; spec.expect.outcome is fits"),
])
def test_spec_expect_outcome_is_one_more_check_the_last(report, expect, passed, message):
    checks = check_report(report, ExpectSpec.model_validate(expect))
    assert checks[-1].name == "outcome" and checks[-1].passed is passed
    assert message in checks[-1].message


def test_a_run_that_ran_out_of_memory_is_judged_on_its_outcome_alone():
    report = run(finished=False, oom=OOM)
    assert [c.name for c in check_report(report, ExpectSpec(outcome="outOfMemory", max_fallbacks=0))] == ["outcome"]
    assert check_report(report, ExpectSpec(max_fallbacks=0)) == []  # no outcome asked: nothing to judge


def test_the_slime_miles_limits_carry_the_outcome_too():
    # The publish step's report: finished (partial false), no per-rollout memory.
    published = {"partial": False, "error": None, "summary": {"memory_peak": {"peak_rss_gib": 0.5}}}
    [check] = check_report(published, Limits(outcome="outOfMemory"), records_losses=False)
    assert (check.name, check.passed) == ("outcome", False)
    assert check_report(published, Limits(outcome="fits"), records_losses=False)[0].passed


def finished_report(outcome: str, expectations=None, oom=None) -> RunReport:
    report = RunReport(job="memtest", mode="debug", world_size=1, device="cpu", num_params=1, started_at="now",
                       planned=2, completed=1 if oom else 2, partial=bool(oom), outcome=outcome, out_of_memory=oom,
                       error=OutOfMemory.model_validate(oom).line() if oom else None, expectations=expectations)
    return report


def expectations(expect: dict, report: dict) -> list[dict]:
    return [c.to_dict() for c in check_report(report, ExpectSpec.model_validate(expect))]


def test_exit_status_4_for_an_out_of_memory_0_when_expected_3_when_such_a_job_fits():
    oom_report = run(finished=False, oom=OOM)
    assert exit_status(finished_report("outOfMemory", oom=OOM)) == (EXIT_OUT_OF_MEMORY,
                                                                    OutOfMemory.model_validate(OOM).line())
    expected = expectations({"outcome": "outOfMemory"}, oom_report)
    assert outcome_expected(expected)
    assert exit_status(finished_report("outOfMemory", expected, oom=OOM)) == (EXIT_OK, None)
    refused = expectations({"outcome": "fits"}, oom_report)  # expected to fit, ran out: the outcome still says 4
    assert exit_status(finished_report("outOfMemory", refused, oom=OOM))[0] == EXIT_OUT_OF_MEMORY
    fitted = expectations({"outcome": "outOfMemory"}, run())
    code, why = exit_status(finished_report("fits", fitted))
    assert code == EXIT_EXPECTATIONS and why == unmet_line(fitted) and "outcome: the run's outcome is fits" in why
    assert exit_status(finished_report("fits")) == (EXIT_OK, None)


def test_the_end_of_run_table_says_the_outcome_and_an_out_of_memory_its_line():
    from rich.console import Console

    def shown(report):
        console = Console(record=True, width=200)
        console.print(render_table(report))
        return console.export_text()

    assert "outcome: fits" in shown(finished_report("fits"))
    text = shown(finished_report("outOfMemory", oom=OOM))
    assert "outcome: outOfMemory: out of memory (kernelOomKiller): rank 0 on host-a, rollout 1 forward; limit 3.00 " \
           "GiB" in text


def test_the_published_result_carries_the_outcome_and_the_record_for_the_operator(tmp_path):
    from forge_replay.runtime.progress_publish import record_result
    from tests.unit.test_runtime_progress import _config

    record_result(_config(tmp_path), "Failed", "out of memory", outcome="outOfMemory", out_of_memory=OOM)
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["result"]["outcome"] == "outOfMemory"
    assert data["result"]["outOfMemory"]["howMuch"]["limitBytes"] == 3 * 2**30  # camelCase, like the status
    result = ProgressReport.model_validate(data).result
    assert result.out_of_memory.when.phase == "forward" and result.out_of_memory.where.rank == 0
