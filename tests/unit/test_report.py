"""The run report: merging ranks, the summary, the JSON, the PNG and the table."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from forge_replay.runtime.report import (
    EvalRecord,
    RunReport,
    combine_rank_results,
    memory_peak,
    render_table,
    summarize,
    write_report,
)


def rank_result(rank, loss_sum, loss_tokens, rss, allocated=None):
    return {
        "rank": rank, "loss_sum": loss_sum, "loss_tokens": loss_tokens, "clipped_tokens": loss_tokens / 4,
        "tokens": int(loss_tokens * 2), "micro_batches": 1, "grad_norm": 0.5, "seconds": 0.1,
        "memory": {"rank": rank, "device": "cpu" if allocated is None else "cuda:0", "peak_allocated_gib": allocated,
                   "peak_reserved_gib": None if allocated is None else allocated + 1, "peak_rss_gib": rss,
                   "rss_reset": True},
    }


def batch(rollout_id, fallback=False, masked_out=0, rollout_id_mismatch="", multimodal_ignored=0, stretch=None):
    return SimpleNamespace(rollout_id=rollout_id, num_samples=8, fallback_used=fallback,
                           path=f"/d/rollout_{0 if fallback else rollout_id}.pt", reward_mean=0.5,
                           masked_out=masked_out, rollout_id_mismatch=rollout_id_mismatch,
                           multimodal_ignored=multimodal_ignored, stretch=stretch)


def make_report(on_gpu=False):
    report = RunReport(job="t", mode="debug", world_size=2, device="cpu", num_params=10, started_at="now",
                       time_to_first_step_seconds=3.0)
    gib = (lambda x: x) if on_gpu else (lambda x: None)
    for step, (fallback, peaks) in enumerate([(False, (1.0, 2.0)), (True, (4.0, 3.0)), (False, (1.5, 1.0))]):
        ranks = [rank_result(0, -3.0, 30, peaks[0], gib(peaks[0])), rank_result(1, -1.0, 10, peaks[1], gib(peaks[1]))]
        report.rollouts.append(combine_rank_results(step, batch(step, fallback), ranks, 0.01, 1.0))
    report.evals.append(EvalRecord(1, 1, None, True, 0, None, 0))
    report.summary = summarize(report.rollouts, report.evals, 3.0)
    return report


def test_ranks_merge_into_a_token_mean_loss():
    record = make_report().rollouts[0]
    assert record.loss == pytest.approx(-4.0 / 40)
    assert record.loss_tokens == 40 and record.tokens == 80
    assert record.clip_fraction == pytest.approx(0.25)
    assert [m["rank"] for m in record.memory] == [0, 1]


def test_summary_counts_fallbacks_and_finds_the_peak_rank_and_step():
    s = make_report().summary
    assert s["fallbacks"] == 1 and s["fallback_rollout_ids"] == [1]
    assert s["memory_peak"]["rank"] == 0 and s["memory_peak"]["step"] == 1
    assert s["memory_peak"]["peak_rss_gib"] == 4.0
    assert s["data_wait_share"] == pytest.approx(0.03 / 3.03)
    assert s["tokens_per_second"] == pytest.approx(240 / 3.0)
    assert s["all_losses_finite"] and s["evals_missing"] == 1


def test_gpu_peaks_use_allocated_and_report_reserved():
    peak = memory_peak(make_report(on_gpu=True).rollouts)
    assert peak["source"] == "cuda" and peak["peak_rss_gib"] is None
    assert peak["peak_allocated_gib"] == 4.0 and peak["peak_reserved_gib"] == 5.0


def test_cpu_peak_is_named_rss_never_cuda_allocated(tmp_path):
    # On CPU the figure is the process's peak RSS: it was stored (and shown) as peak allocated.
    from rich.console import Console

    report = make_report()
    peak = report.summary["memory_peak"]
    assert peak["source"] == "rss" and peak["peak_rss_gib"] == 4.0
    assert peak["peak_allocated_gib"] is None and peak["peak_reserved_gib"] is None
    console = Console(record=True, width=140)
    console.print(render_table(report))
    text = console.export_text()
    assert "RSS GiB (rank)" in text and "peak RSS 4.00 GiB on rank 0 at rollout 1" in text
    assert "alloc" not in text.lower()


def test_gpu_table_names_cuda_allocated_and_reserved():
    from rich.console import Console

    report = make_report(on_gpu=True)
    console = Console(record=True, width=140)
    console.print(render_table(report))
    text = console.export_text()
    assert "CUDA GiB (rank)" in text
    assert "peak CUDA allocated 4.00 GiB on rank 0 at rollout 1 (reserved 5.00 GiB)" in text


def test_non_finite_losses_are_flagged():
    report = make_report()
    report.rollouts[2].loss = math.nan
    assert summarize(report.rollouts, [], None)["all_losses_finite"] is False


def test_json_and_png_are_written_and_the_table_shows_the_fallback(tmp_path):
    from rich.console import Console

    report = make_report()
    files = write_report(report, tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"]["fallbacks"] == 1
    assert [r["fallback_used"] for r in data["rollouts"]] == [False, True, False]
    assert len(data["rollouts"][1]["memory"]) == 2
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert files["plot"] == str(tmp_path / "memory.png")
    console = Console(record=True, width=140)
    console.print(render_table(report))
    text = console.export_text()
    assert "yes" in text and "rollouts [1] trained on rollout 0's dump" in text
    assert "eval 1: MISSING dump" in text


def test_data_slime_accepts_is_counted_per_rollout_in_the_summary_and_the_table():
    from rich.console import Console

    report = make_report()
    quiet = Console(record=True, width=80)
    quiet.print(render_table(report))
    assert "mask" not in quiet.export_text() and "mismatch" not in quiet.export_text()  # nothing to show
    ranks = [rank_result(0, -3.0, 30, 1.0), rank_result(1, -1.0, 10, 1.0)]
    note = "the dump's rollout_id is 9, its file stands for rollout 4"
    report.rollouts.append(combine_rank_results(3, batch(3, masked_out=2), ranks, 0.01, 1.0))
    report.rollouts.append(combine_rank_results(4, batch(4, masked_out=1, rollout_id_mismatch=note), ranks, 0.01, 1.0))
    report.summary = s = summarize(report.rollouts, report.evals, 3.0)
    assert [r.masked_out_samples for r in report.rollouts] == [0, 0, 0, 2, 1]
    assert [r.rollout_id_mismatch for r in report.rollouts] == [None, None, None, None, note]
    assert s["masked_out_samples"] == 3
    assert s["rollout_id_mismatches"] == 1 and s["rollout_id_mismatch_rollout_ids"] == [4]
    console = Console(record=True, width=80)
    console.print(render_table(report))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80
    assert "samples with an all-zero loss mask 3 (rollouts [3, 4]: no loss token)" in text
    assert "rollout_id mismatches 1 (rollouts [4]: the dump's rollout_id is not its file's)" in text


def test_engines_line_names_the_sync_path_and_the_endpoints_an_older_server_lacks():
    from forge_replay.runtime.report import engines_line

    engines = {"engines": 2, "restarts": 0, "weight_versions": ["1", "2"], "weight_sync": "distributed",
               "unsupported_endpoints": [], "health_monitors": 0, "router": "none"}
    line = engines_line(engines)
    assert "weight versions 1..2 (distributed)" in line and "not served" not in line
    engines["unsupported_endpoints"] = ["/begin_weight_update", "/flush_cache"]
    assert "not served: /begin_weight_update /flush_cache" in engines_line(engines)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_the_table_fits_80_columns(on_gpu):
    from rich.console import Console

    report = make_report(on_gpu=on_gpu)
    report.rollouts[0].loss, report.rollouts[0].tokens, report.rollouts[0].step_seconds = -0.123456, 1048576, 999.99
    console = Console(record=True, width=80)
    console.print(render_table(report))
    table = console.export_text().split("rollouts 3,")[0]
    rows = [line for line in table.splitlines() if line.strip()]
    assert max(len(line) for line in rows) <= 80
    assert len(rows) == 1 + 1 + 1 + len(report.rollouts), table  # title, one header line, rule, one line per step


def test_vlm_samples_trained_as_text_are_counted_and_said():
    """The builtin trainer trains a VLM sample's tokens; the report counts the samples whose images it ignored (issue 14)."""
    from rich.console import Console

    report = make_report()
    ranks = [rank_result(0, -3.0, 30, 1.0), rank_result(1, -1.0, 10, 1.0)]
    report.rollouts.append(combine_rank_results(3, batch(3, multimodal_ignored=5), ranks, 0.01, 1.0))
    report.rollouts.append(combine_rank_results(4, batch(4, multimodal_ignored=2), ranks, 0.01, 1.0))
    report.summary = summarize(report.rollouts, report.evals, 3.0)
    assert [r.multimodal_ignored_samples for r in report.rollouts] == [0, 0, 0, 5, 2]
    assert report.summary["multimodal_ignored_samples"] == 7
    console = Console(record=True, width=120)
    console.print(render_table(report))
    assert "multimodal inputs ignored in 7 sample(s)" in console.export_text()


def test_a_plot_that_cannot_be_written_is_a_warning_in_the_final_report(tmp_path):
    """A full disk at memory.png (here: a folder in its way) leaves a final report that says so; the run does not
    fail over it, so the exit status, the message and report.json agree (issue 25)."""
    from forge_replay.runtime.driver import ReportSaver

    (tmp_path / "memory.png").mkdir()
    report = make_report()
    report.partial, report.completed, report.planned = False, 3, 3
    assert ReportSaver(str(tmp_path)).save_final(report) is None
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["partial"] is False and doc["files"]["plot"] is None
    assert len(doc["warnings"]) == 1 and doc["warnings"][0].startswith("memory.png not written: ")


def test_a_report_that_cannot_be_written_is_the_failure_it_says(tmp_path):
    from forge_replay.runtime.driver import ReportSaver

    (tmp_path / "report.json").mkdir()
    report = make_report()
    problem = ReportSaver(str(tmp_path)).save_final(report)
    assert problem.startswith(f"cannot write the report to {tmp_path}")


def test_a_report_on_disk_mid_run_summarizes_the_steps_it_holds(tmp_path):
    """What SIGKILL leaves: the last report written after a step, whose summary covers its rollouts."""
    from forge_replay.runtime.driver import ReportSaver

    full = make_report()
    report = RunReport(job="t", mode="debug", world_size=2, device="cpu", num_params=10, started_at="now",
                       planned=3)
    saver = ReportSaver(str(tmp_path))
    saver.save(report)
    for step, record in enumerate(full.rollouts[:2]):
        report.rollouts.append(record)
        report.completed = step + 1
        saver.took = 0.0  # else the saver may skip a write that comes soon after the last one
        saver.save(report, step_done=True)
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["partial"] is True and doc["completed"] == 2
    assert doc["summary"]["rollouts"] == doc["completed"] and doc["summary"]["fallbacks"] == 1
