"""The memory frontier's search and report (issue 32), pure: which point of a ``spec.sweep`` runs next, what fits,
the frontier, report.json's ``sweep`` object, ``spec.expect.frontier``'s check and the table ``forge-replay run``
prints. The runtime runs the points (``forge_replay.api.sweep.point_job``) and records each one here.

A point fits when its outcome is neither outOfMemory nor failed and its peak is at most budgetGiB x (1 - headroom).
The frontier, for each combination of the other axes (a "line" along the last axis), is the largest value of the
last axis such that it and every smaller value fit (None when the smallest does not).

``grid`` measures every point, in grid order grouped by engine configuration; the frontier is then read off the measurements. ``frontier`` searches
each line, assuming what fits is monotone along it (a value fits when a larger one does, as memory grows with
tokens and with mem-fraction-static): it measures the smallest value, then bisects; once two points on the line
have a measured peak it fits peak = fixed + slope x value through the two largest, predicts the largest value
under the budget and measures there and at the next value; if that does not close the line (the curve is not
linear) it goes back to bisection. On a line of n values that is at most ceil(log2 n) + 3 points (bisection alone
takes 1 + ceil(log2 n); the prediction adds at most two, and never widens what is left to bisect).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from forge_replay.api.outcome import Outcome
from forge_replay.api.sweep import SweepSpec, Value, axis_values, engine_key, point_label, tidy
from forge_replay.verdict.compare import fmt
from forge_replay.verdict.reports import Check

FRONTIER_CHECK = "frontier"
"""The check spec.expect.frontier adds to status.expectations and report.json."""
NOT_FITTING = ("outOfMemory", "failed")
"""Outcomes that never fit, whatever peak was seen before."""


@dataclass(frozen=True)
class PointResult:
    """What one point measured. ``peak_gib`` is the peak the budget is compared with (per GPU; per trainer rank on
    CPU); None means the larger of the rank and engine peaks. ``predicted_gib`` is the search's prediction of it
    (``SweepSearch.record`` fills it in)."""

    values: dict[str, Value]
    outcome: Outcome
    peak_rank_gib: float | None = None
    """The largest trainer rank's peak (CUDA reserved on GPU, RSS on CPU)."""
    peak_engine_gib: float | None = None
    """The largest sglang engine's peak (None without engines)."""
    step_seconds: list[float] = field(default_factory=list)
    """Each rollout's step time."""
    predicted_gib: float | None = None
    message: str = ""
    """Why it ended as it did (an out-of-memory's where and how much, a failure's error)."""
    peak_gib: float | None = None

    @property
    def budget_peak_gib(self) -> float | None:
        """The peak compared with the budget."""
        if self.peak_gib is not None:
            return self.peak_gib
        peaks = [p for p in (self.peak_rank_gib, self.peak_engine_gib) if p is not None]
        return max(peaks) if peaks else None

    def fits(self, limit_gib: float) -> bool:
        """Whether the point fits under ``limit_gib`` (budget x (1 - headroom))."""
        peak = self.budget_peak_gib
        return self.outcome not in NOT_FITTING and peak is not None and peak <= limit_gib

    def to_dict(self, limit_gib: float) -> dict[str, Any]:
        """The point as report.json's ``sweep.points`` lists it."""
        out = asdict(self)
        out["peak_gib"] = self.budget_peak_gib
        out["fits"] = self.fits(limit_gib)
        return out


def _key(values: Mapping[str, Value], fields: list[str]) -> tuple[Value, ...]:
    return tuple(tidy(values[f]) for f in fields)


@dataclass
class _Line:
    """One combination of the other axes and the state of its search along the last axis."""

    at: dict[str, Value]
    values: list[Value]
    lo: int = -1
    """The largest index known to fit (-1: none yet); everything below it fits (monotone)."""
    hi: int = -1
    """The smallest index known not to fit (len(values): none yet)."""
    predicted: bool = False
    """Whether the one prediction round has been made."""
    pending: list[int] = field(default_factory=list)
    """Indexes the prediction round still has to measure."""

    @property
    def done(self) -> bool:
        return self.hi == self.lo + 1


class SweepSearch:
    """The search over a sweep's points: ``next_point()`` until it is None, ``record()`` each point's result.

    ``budget_gib`` is the resolved budget (spec.sweep.budgetGiB, or the device's total memory on GPU); a point fits
    under ``budget_gib x (1 - headroom)``. Points may be recorded that the search did not ask for (a resumed sweep's
    finished points): they count like its own."""

    def __init__(self, sweep: SweepSpec, budget_gib: float):
        if not budget_gib > 0:
            raise ValueError(f"the sweep's budget must be a positive number of GiB, not {budget_gib!r}")
        self.sweep = sweep
        self.budget_gib = float(budget_gib)
        self.limit_gib = self.budget_gib * (1 - sweep.headroom)
        self.fields = [a.field for a in sweep.axes]
        self._axis_values = [axis_values(a) for a in sweep.axes]
        last = self._axis_values[-1]
        self._lines = [_Line(dict(zip(self.fields[:-1], combo, strict=True)), last, hi=len(last))
                       for combo in itertools.product(*self._axis_values[:-1])]
        self._by_at = {tuple(line.at.values()): line for line in self._lines}
        self._results: dict[tuple[Value, ...], PointResult] = {}
        self._order: list[tuple[Value, ...]] = []
        self._predictions: dict[tuple[Value, ...], float] = {}
        self._engines: tuple[tuple[str, Value], ...] | None = None
        """The engine configuration of the point recorded last."""

    # -------------------------------------------------------------- the plan

    @property
    def grid_count(self) -> int:
        """How many points a full grid has."""
        return len(self._lines) * len(self._axis_values[-1])

    def next_point(self) -> dict[str, Value] | None:
        """The next point to measure, as {field: value}; None when the sweep is finished. Asking again before
        recording it gives the same point.

        Points that keep the engines of the point recorded last (the same ``engine_key``) come first, so that the
        engines start once per engine configuration: a grid runs in grid order grouped by engine configuration, a
        frontier search takes the next point of the first line that keeps the engines, else of the first line."""
        candidates = [(line, index) for line in self._lines for index in self._next_indexes(line)]
        if not candidates:
            return None
        line, index = next((c for c in candidates if engine_key(self._values(*c)) == self._engines), candidates[0])
        self._predict(line, index)
        return self._values(line, index)

    def _values(self, line: _Line, index: int) -> dict[str, Value]:
        return {**line.at, self.fields[-1]: line.values[index]}

    def _next_indexes(self, line: _Line) -> list[int]:
        """The indexes the line may measure next: every unmeasured one in a grid, else the search's one."""
        if self.sweep.search == "grid":
            return [i for i in range(len(line.values)) if self._result(line, i) is None]
        index = self._next_index(line)
        return [] if index is None else [index]

    def _next_index(self, line: _Line) -> int | None:
        while line.pending and not line.lo < line.pending[0] < line.hi:
            line.pending.pop(0)
        if line.done:
            return None
        if line.pending:
            return line.pending[0]
        if line.lo < 0:
            return 0
        if not line.predicted and len(self._peaks(line)) >= 2:
            line.predicted = True
            guess = self._largest_predicted_fit(line)
            line.pending = [i for i in (guess, guess + 1) if line.lo < i < line.hi]
            if line.pending:
                return line.pending[0]
        return (line.lo + line.hi) // 2

    def _peaks(self, line: _Line) -> list[tuple[float, float]]:
        """(value, peak) of the line's points that finished with a peak (fitting or over the budget)."""
        out = []
        for i, value in enumerate(line.values):
            result = self._result(line, i)
            if result is not None and result.outcome not in NOT_FITTING and result.budget_peak_gib is not None:
                out.append((float(value), result.budget_peak_gib))
        return out

    def _line_fit(self, line: _Line) -> tuple[float, float] | None:
        """(fixed, slope) of peak = fixed + slope x value through the line's two largest measured values."""
        peaks = self._peaks(line)
        if len(peaks) < 2:
            return None
        (x0, y0), (x1, y1) = peaks[-2:]
        slope = (y1 - y0) / (x1 - x0)
        return y0 - slope * x0, slope

    def _largest_predicted_fit(self, line: _Line) -> int:
        fit = self._line_fit(line)
        assert fit is not None
        fixed, slope = fit
        fitting = [i for i, v in enumerate(line.values) if fixed + slope * float(v) <= self.limit_gib]
        return max(fitting, default=-1)

    def _predict(self, line: _Line, index: int) -> None:
        fit = self._line_fit(line)
        if fit is not None:
            key = _key({**line.at, self.fields[-1]: line.values[index]}, self.fields)
            self._predictions[key] = fit[0] + fit[1] * float(line.values[index])

    # -------------------------------------------------------------- results

    def _result(self, line: _Line, index: int) -> PointResult | None:
        return self._results.get(_key({**line.at, self.fields[-1]: line.values[index]}, self.fields))

    def record(self, values: Mapping[str, Value], result: PointResult) -> PointResult:
        """Record one point's result (its prediction filled in); returns the result as recorded."""
        if set(values) != set(self.fields):
            raise ValueError(f"point {point_label(dict(values))} does not give exactly the sweep's fields "
                             f"({', '.join(self.fields)})")
        key = _key(values, self.fields)
        line = self._by_at.get(key[:-1])
        if line is None or key[-1] not in line.values:
            raise ValueError(f"point {point_label(dict(values))} is not a point of the sweep")
        if result.predicted_gib is None and key in self._predictions:
            result = replace(result, predicted_gib=self._predictions[key])
        if key not in self._results:
            self._order.append(key)
        self._engines = engine_key(dict(values))
        self._results[key] = result
        index = line.values.index(key[-1])
        if result.fits(self.limit_gib):
            if index < line.hi:  # a fit above a value that did not fit moves no frontier
                line.lo = max(line.lo, index)
        else:
            line.hi = min(line.hi, index)
            line.lo = min(line.lo, line.hi - 1)
        return result

    @property
    def results(self) -> list[PointResult]:
        """The recorded points, in the order they were recorded."""
        return [self._results[key] for key in self._order]

    def frontier(self) -> list[dict[str, Any]]:
        """For each combination of the other axes: ``at`` (their values), ``field`` (the last axis), ``value`` (the
        largest value of it that fits with every smaller one, or None) and ``complete`` (whether the line's search
        has finished: else ``value`` is the frontier so far)."""
        out = []
        for line in self._lines:
            if self.sweep.search == "grid":
                value, complete = self._grid_frontier(line)
            else:
                value = line.values[line.lo] if line.lo >= 0 else None
                complete = line.done
            out.append({"at": dict(line.at), "field": self.fields[-1], "value": value, "complete": complete})
        return out

    def _grid_frontier(self, line: _Line) -> tuple[Value | None, bool]:
        value = None
        for i, v in enumerate(line.values):
            result = self._result(line, i)
            if result is None:
                return value, False
            if not result.fits(self.limit_gib):
                return value, True
            value = v
        return value, True

    def summary(self) -> dict[str, Any]:
        """report.json's ``sweep``: the settings, every point measured (values, outcome, peaks, step times,
        predicted vs measured peak, whether it fits), the frontier, points run against a full grid's count."""
        return {
            "search": self.sweep.search,
            "axes": [{"field": f, "values": list(v)} for f, v in zip(self.fields, self._axis_values, strict=True)],
            "budget_gib": self.budget_gib,
            "headroom": self.sweep.headroom,
            "limit_gib": self.limit_gib,
            "points": [r.to_dict(self.limit_gib) for r in self.results],
            "frontier": self.frontier(),
            "points_run": len(self._order),
            "grid_points": self.grid_count,
            "finished": self.next_point() is None,
        }


# ------------------------------------------------------------------------------------------ spec.expect.frontier


def _frontier_of(summary: Mapping[str, Any], at: Mapping[str, Value]) -> dict[str, Any] | None:
    want = {k: tidy(v) for k, v in at.items()}
    return next((f for f in summary.get("frontier") or []
                 if {k: tidy(v) for k, v in (f.get("at") or {}).items()} == want), None)


def frontier_check(expect_frontier: list[Any], search: SweepSearch | Mapping[str, Any]) -> Check:
    """spec.expect.frontier against a sweep (a SweepSearch, or report.json's ``sweep``): passed when, for every
    entry, the frontier at ``at`` is complete and at least the value in ``fits``. ``observed`` and ``limit`` are the
    first failing entry's (or the only entry's) frontier and required value."""
    summary = search.summary() if isinstance(search, SweepSearch) else search
    if not summary:
        return Check(FRONTIER_CHECK, False, message="the run's report has no sweep: no frontier to check")
    lines, failed = [], []
    first: tuple[float | None, float] | None = None
    for entry in expect_frontier:
        at = dict(entry.get("at") or {} if isinstance(entry, Mapping) else entry.at)
        fits = dict(entry["fits"] if isinstance(entry, Mapping) else entry.fits)
        [(field_name, required)] = fits.items()
        where = f"{field_name} at {point_label(at)}" if at else field_name
        found = _frontier_of(summary, at)
        value = found.get("value") if found else None
        if found is None or not found.get("complete"):
            ok, why = False, "not searched to the end" if found else "not part of the sweep"
            text = f"{where}: frontier {why} (required >= {fmt(tidy(required))})"
        else:
            ok = value is not None and value >= required
            text = (f"{where}: frontier {fmt(value) if value is not None else 'none (the smallest value does not fit)'}"
                    f" {'>=' if ok else '<'} {fmt(tidy(required))}")
        lines.append(text)
        if not ok:
            failed.append(text)
        if first is None or (not ok and len(failed) == 1):
            first = (float(value) if value is not None else None, float(required))
    observed, limit = first if first is not None else (None, None)
    return Check(FRONTIER_CHECK, not failed, observed, limit,
                 message="; ".join(failed if failed else lines) or "no frontier required")


# ------------------------------------------------------------------------------------------ the table


def sweep_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """The table's rows (a header first): one per point measured, in order."""
    axes = [a["field"] for a in summary.get("axes") or []]
    rows = [[*axes, "outcome", "peak GiB", "predicted GiB", "rank GiB", "engine GiB", "step s", "fits"]]
    for p in summary.get("points") or []:
        steps = p.get("step_seconds") or []
        rows.append([*(str(p["values"].get(a, "")) for a in axes), str(p.get("outcome")), _gib(p.get("peak_gib")),
                     _gib(p.get("predicted_gib")), _gib(p.get("peak_rank_gib")), _gib(p.get("peak_engine_gib")),
                     f"{sum(steps) / len(steps):.2f}" if steps else "-", "yes" if p.get("fits") else "no"])
    return rows


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def sweep_table(summary: Mapping[str, Any]) -> str:
    """report.json's ``sweep`` as the plain-text table ``forge-replay run`` prints at its end: the points, then the
    frontier of each line and the points run against the full grid's."""
    rows = sweep_rows(summary)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    text.append("")
    limit = summary.get("limit_gib")
    text.append(f"budget {fmt(summary.get('budget_gib'))} GiB, headroom {fmt(summary.get('headroom'))}: a point fits "
                f"at <= {_gib(limit)} GiB without running out of memory")
    for f in summary.get("frontier") or []:
        where = f" at {point_label(f['at'])}" if f.get("at") else ""
        value = f.get("value")
        shown = "none (the smallest value does not fit)" if value is None else fmt(value)
        text.append(f"frontier of {f['field']}{where}: {shown}{'' if f.get('complete') else ' (so far)'}")
    text.append(f"{summary.get('points_run')} points run of a full grid's {summary.get('grid_points')} "
                f"(search: {summary.get('search')})")
    return "\n".join(text)
