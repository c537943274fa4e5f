"""The memory frontier's search (issue 32) against synthetic peak curves whose frontier brute force knows: the
frontier it finds, the points it spends (at most ceil(log2 n) + 3 on an axis of n >= 8 values), out-of-memory
points, report.json's ``sweep``, spec.expect.frontier's check and the table."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_replay.api.sweep import SweepSpec, engine_key, grid_points
from forge_replay.verdict.checks import check_report
from forge_replay.verdict.sweep import PointResult, SweepSearch, frontier_check, sweep_table

MBT = "trainer.microBatchTokens"
LEN = "replay.stretch.maxTokens"


def spec(lengths, search="frontier", micro=None, headroom=0.0):
    axes = [{"field": LEN, "values": list(lengths)}]
    if micro is not None:
        axes.insert(0, {"field": MBT, "values": list(micro)})
    return SweepSpec.model_validate({"axes": axes, "search": search, "headroom": headroom, "maxPoints": 1024})


def run(sweep, budget, peak_of, oom_at=None):
    """Drive the search to its end; ``peak_of(values)`` is the synthetic peak, ``oom_at(values)`` whether the point
    runs out of memory (recorded with no peak). Returns the search and the points in the order run."""
    search, order = SweepSearch(sweep, budget), []
    while (values := search.next_point()) is not None:
        assert search.next_point() == values  # asking again gives the same point
        order.append(values)
        if oom_at is not None and oom_at(values):
            search.record(values, PointResult(values, "outOfMemory", message="CUDA out of memory"))
        else:
            peak = peak_of(values)
            search.record(values, PointResult(values, "fits", peak_rank_gib=peak, step_seconds=[0.5, 0.25]))
        assert len(order) <= search.grid_count
    return search, order


def brute_force(sweep, budget, peak_of, oom_at=None):
    """The frontier of each line from every point measured independently: the largest value of the last axis that
    fits with every smaller one."""
    limit = budget * (1 - sweep.headroom)
    out = {}
    for values in grid_points(sweep):
        at = tuple(v for f, v in values.items() if f != LEN)
        fits = not (oom_at is not None and oom_at(values)) and peak_of(values) <= limit
        frontier, broken = out.get(at, (None, False))
        if not broken and fits:
            out[at] = (values[LEN], False)
        else:
            out[at] = (frontier, True)
    return {at: frontier for at, (frontier, _) in out.items()}


def found(search):
    return {tuple(f["at"].values()): f["value"] for f in search.frontier()}


def bound(n):
    return math.ceil(math.log2(n)) + 3 if n >= 8 else n


LENGTHS = [1024 * 2**k for k in range(10)]  # 1k .. 512k: 10 values


@pytest.mark.parametrize("budget", [0.5, 1.0, 3.0, 20.0, 60.0, 200.0])
def test_linear_curve_is_closed_by_the_prediction(budget):
    peak = lambda v: 1.0 + 1e-4 * v[LEN]  # noqa: E731
    search, order = run(spec(LENGTHS), budget, peak)
    assert found(search) == brute_force(spec(LENGTHS), budget, peak)
    assert len(order) <= 4  # the smallest, the midpoint, the prediction and the value above it
    predicted = [p for p in search.summary()["points"] if p["predicted_gib"] is not None]
    assert bool(predicted) == (len(order) > 2) and all(p["predicted_gib"] == pytest.approx(p["peak_gib"]) for p in predicted)


def test_convex_curve_falls_back_to_bisection():
    peak = lambda v: 1.0 + (v[LEN] / 1024) ** 2 / 100  # noqa: E731  (quadratic attention: the line under-predicts)
    budget = 300.0
    search, order = run(spec(LENGTHS), budget, peak)
    assert found(search) == brute_force(spec(LENGTHS), budget, peak) == {(): 131072}
    assert len(order) <= bound(len(LENGTHS))
    assert any(p["predicted_gib"] is not None and p["predicted_gib"] < p["peak_gib"] - 1
               for p in search.summary()["points"])  # the prediction was wrong, and the report shows it


def test_out_of_memory_points_do_not_fit_and_the_search_goes_on():
    peak = lambda v: 1.0 + 1e-4 * v[LEN]  # noqa: E731
    oom = lambda v: v[LEN] >= 65536  # noqa: E731  (the allocator gives up before the budget is reached)
    search, order = run(spec(LENGTHS), 100.0, peak, oom)
    assert found(search) == brute_force(spec(LENGTHS), 100.0, peak, oom) == {(): 32768}
    points = search.summary()["points"]
    assert any(p["outcome"] == "outOfMemory" and not p["fits"] and p["peak_gib"] is None for p in points)
    assert len(order) <= bound(len(LENGTHS))


def test_nothing_fits_after_one_point_and_everything_fits():
    peak = lambda v: 1.0 + 1e-4 * v[LEN]  # noqa: E731
    search, order = run(spec(LENGTHS), 0.5, peak)
    assert found(search) == {(): None} and len(order) == 1
    search, order = run(spec(LENGTHS), 1000.0, peak)
    assert found(search) == {(): LENGTHS[-1]} and len(order) <= 3


def test_headroom_lowers_the_limit():
    peak = lambda v: v[LEN] / 1024  # noqa: E731  (1 GiB per 1k tokens)
    assert found(run(spec(LENGTHS), 64.0, peak)[0]) == {(): 65536}
    assert found(run(spec(LENGTHS, headroom=0.05), 64.0, peak)[0]) == {(): 32768}


def test_grid_measures_every_point_in_order():
    sweep = spec([1, 2, 3, 4], search="grid", micro=[1024, 2048])
    peak = lambda v: v[MBT] / 1024 * v[LEN]  # noqa: E731
    search, order = run(sweep, 4.0, peak)
    assert order == grid_points(sweep)
    assert found(search) == brute_force(sweep, 4.0, peak) == {(1024,): 4, (2048,): 2}
    summary = search.summary()
    assert (summary["points_run"], summary["grid_points"], summary["finished"]) == (8, 8, True)


def engine_starts(order):
    """How many times the engines start running the points in this order (once more each time their key changes)."""
    keys = [engine_key(v) for v in order]
    return sum(1 for i, key in enumerate(keys) if i == 0 or key != keys[i - 1])


@pytest.mark.parametrize("search", ["grid", "frontier"])
def test_points_sharing_the_engines_run_together(search):
    mem = "rollout.engineArgs.mem-fraction-static"
    sweep = SweepSpec.model_validate({"search": search, "maxPoints": 64, "headroom": 0, "axes": [
        {"field": MBT, "values": [1024, 2048]}, {"field": mem, "values": [0.5, 0.6, 0.7]},
        {"field": LEN, "values": LENGTHS}]})
    peak = lambda v: v[mem] * 100 + v[MBT] / 1024 * v[LEN] / 4096  # noqa: E731
    search_run, order = run(sweep, 130.0, peak)
    assert engine_starts(order) == 3  # one per mem-fraction-static value, though it is not the first axis
    assert {tuple(f["at"].values()): f["value"] for f in search_run.frontier()} == {
        (m, f): max(v for v in LENGTHS if peak({MBT: m, mem: f, LEN: v}) <= 130.0)
        for m in (1024, 2048) for f in (0.5, 0.6, 0.7)}


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 40),
    lines=st.integers(1, 3),
    increments=st.lists(st.floats(0, 10, allow_nan=False), min_size=40, max_size=40),
    curvature=st.sampled_from([0.0, 0.0, 0.05, 1.0]),
    budget=st.floats(0.1, 400, allow_nan=False),
    oom_from=st.one_of(st.none(), st.integers(0, 40)),
    search=st.sampled_from(["frontier", "frontier", "grid"]),
)
def test_the_frontier_is_brute_forces_within_the_bound(n, lines, increments, curvature, budget, oom_from, search):
    """Any monotone peak curve (linear, convex, flat stretches, steps), out-of-memory from some value on, one to
    three lines: the frontier equals brute force's, no point runs twice, and frontier spends at most
    ceil(log2 n) + 3 points per line on n >= 8 values."""
    lengths = list(range(1, n + 1))
    micro = [1, 2, 3][:lines]
    sweep = spec(lengths, search=search, micro=micro)
    base = [sum(increments[:i + 1]) for i in range(n)]

    def peak(v):
        i = v[LEN] - 1
        return v[MBT] * (0.5 + base[i] + curvature * i * i)

    oom = (lambda v: v[LEN] - 1 >= oom_from) if oom_from is not None else None  # noqa: E731
    found_search, order = run(sweep, budget, peak, oom)
    assert found(found_search) == brute_force(sweep, budget, peak, oom)
    assert len({tuple(p.values()) for p in order}) == len(order)
    per_line = [sum(1 for p in order if p[MBT] == m) for m in micro]
    if search == "grid":
        assert per_line == [n] * lines
    else:
        assert all(count <= bound(n) for count in per_line), per_line
    assert all(f["complete"] for f in found_search.frontier())


def test_expect_frontier_check():
    sweep = spec(LENGTHS, micro=[1024, 2048])
    peak = lambda v: v[MBT] / 1024 * v[LEN] / 1024  # noqa: E731  (GiB)
    search, _ = run(sweep, 64.0, peak)
    assert found(search) == {(1024,): 65536, (2048,): 32768}
    ok = frontier_check([{"at": {MBT: 1024}, "fits": {LEN: 65536}}, {"at": {MBT: 2048}, "fits": {LEN: 32768}}],
                        search)
    assert ok.passed and ok.name == "frontier"
    short = frontier_check([{"at": {MBT: 1024}, "fits": {LEN: 65536}}, {"at": {MBT: 2048}, "fits": {LEN: 65536}}],
                           search.summary())  # report.json's sweep works too
    assert not short.passed and (short.observed, short.limit) == (32768, 65536)
    assert short.message == f"{LEN} at {{{MBT}: 2048}}: frontier 32768 < 65536"
    missing = frontier_check([{"at": {MBT: 4096}, "fits": {LEN: 1024}}], search)
    assert not missing.passed and "not part of the sweep" in missing.message
    expect = SimpleNamespace(frontier=[{"at": {MBT: 1024}, "fits": {LEN: 65536}}], outcome=None,
                             max_peak_memory_gib=None, max_fallbacks=None, min_tokens_per_second=None, baseline=None)
    report = {"partial": False, "rollouts": [], "summary": {}, "sweep": search.summary()}
    assert check_report(report, expect, records_losses=False) == [ok.__class__(
        "frontier", True, 65536, 65536, message=f"{LEN} at {{{MBT}: 1024}}: frontier 65536 >= 65536")]
    [no_sweep] = check_report({**report, "sweep": None}, expect, records_losses=False)
    assert not no_sweep.passed and "no sweep" in no_sweep.message


def test_an_unfinished_sweep_fails_the_check_and_shows_its_frontier_so_far():
    sweep = spec(LENGTHS)
    search = SweepSearch(sweep, 10.0)
    values = search.next_point()
    search.record(values, PointResult(values, "fits", peak_rank_gib=1.0))
    assert search.frontier() == [{"at": {}, "field": LEN, "value": 1024, "complete": False}]
    check = frontier_check([{"fits": {LEN: 1024}}], search)
    assert not check.passed and "not searched to the end" in check.message
    assert "(so far)" in sweep_table(search.summary())


def test_a_point_outside_the_sweep_is_refused():
    search = SweepSearch(spec(LENGTHS), 10.0)
    with pytest.raises(ValueError, match="not a point of the sweep"):
        search.record({LEN: 3000}, PointResult({LEN: 3000}, "fits", peak_rank_gib=1.0))
    with pytest.raises(ValueError, match="exactly the sweep's fields"):
        search.record({MBT: 1024}, PointResult({MBT: 1024}, "fits", peak_rank_gib=1.0))


def test_failed_points_do_not_fit_and_engine_peaks_count():
    assert not PointResult({}, "failed", peak_rank_gib=1.0).fits(10.0)
    assert not PointResult({}, "fits").fits(10.0)  # no peak recorded: nothing says it fits
    assert not PointResult({}, "fits", peak_rank_gib=1.0, peak_engine_gib=11.0).fits(10.0)
    assert PointResult({}, "fits", peak_rank_gib=1.0, peak_engine_gib=11.0, peak_gib=9.0).fits(10.0)


def test_sweep_table_lists_points_and_frontier():
    sweep = spec([1024, 2048], micro=[1])
    search, _ = run(sweep, 2.0, lambda v: v[LEN] / 1024)
    table = sweep_table(search.summary())
    lines = table.splitlines()
    assert lines[0].split()[:3] == [MBT, LEN, "outcome"]
    assert f"frontier of {LEN} at {{{MBT}: 1}}: 2048" in table
    assert "2 points run of a full grid's 2 (search: frontier)" in table
