"""The sweep runtime's pure parts: sweep.json kept for the same spec and set aside for another, status.sweep and
the frontier's line from report.json's ``sweep``, frontier.png's series."""

from __future__ import annotations

import json

from forge_replay.api import parse_job
from forge_replay.runtime.sweep import SweepState, frontier_line, load_state, sweep_identity, sweep_progress
from forge_replay.runtime.sweep_plot import plot_series

SUMMARY = {
    "search": "frontier", "axes": [{"field": "trainer.microBatchTokens", "values": [512, 1024, 2048]}],
    "budget_gib": 2.0, "headroom": 0.0, "limit_gib": 2.0,
    "points": [{"values": {"trainer.microBatchTokens": 512}, "outcome": "fits", "peak_gib": 1.0, "fits": True},
               {"values": {"trainer.microBatchTokens": 2048}, "outcome": "outOfMemory", "peak_gib": None,
                "fits": False}],
    "frontier": [{"at": {}, "field": "trainer.microBatchTokens", "value": 512, "complete": False}],
    "points_run": 2, "grid_points": 3, "finished": False,
}


def job(budget: float = 2.0, suspend: bool = False):
    return parse_job({"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "s"},
                      "spec": {"suspend": suspend,
                               "replay": {"mode": "debug", "dumps": {"claimName": "d", "path": "x.pt"}, "numRollouts": 2},
                               "model": {"claimName": "m", "path": "m"}, "trainer": {"gpusPerNode": 0},
                               "sweep": {"axes": [{"field": "trainer.microBatchTokens", "values": [512, 1024]}],
                                         "budgetGiB": budget}}})


def test_finished_points_are_kept_for_the_same_spec_and_set_aside_for_another(tmp_path):
    identity = sweep_identity(job())
    assert sweep_identity(job(suspend=True)) == identity  # a suspended and resumed job continues
    state = SweepState(identity, [{"index": 1, "values": {"trainer.microBatchTokens": 512}, "result": {}}], 1)
    state.save(str(tmp_path))
    (tmp_path / "points" / "01").mkdir(parents=True)
    assert load_state(str(tmp_path), identity) == state
    other = sweep_identity(job(budget=3.0))
    assert other != identity
    assert load_state(str(tmp_path), other).points == []  # another spec starts over, the old state kept aside
    assert json.loads((tmp_path / "sweep.previous.json").read_text())["points"] == state.points
    assert (tmp_path / "points.previous" / "01").is_dir() and not (tmp_path / "points").exists()


def test_status_sweep_and_the_frontier_line_come_from_the_summary():
    progress = sweep_progress(SUMMARY)
    doc = progress.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert doc["pointsDone"] == 2 and doc["gridPoints"] == 3 and doc["outOfMemory"] == 1 and not doc["finished"]
    assert doc["frontier"] == [{"at": {}, "field": "trainer.microBatchTokens", "value": 512.0, "complete": False}]
    assert doc["summary"] == "microBatchTokens <= 512 (so far)"


def test_the_plot_draws_each_line_with_its_out_of_memory_points():
    swept, lines = plot_series(SUMMARY)
    assert swept == "trainer.microBatchTokens"
    assert lines == [("peak", 512, [(512.0, 1.0, "fits"), (2048.0, None, "outOfMemory")])]
