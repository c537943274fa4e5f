"""A run's per-rollout metrics against a baseline's, rollout by rollout (pure functions over parsed reports).

Numbers are shown with :func:`fmt`, Python's shortest round-trip form, so two different numbers never print the
same; each difference carries its absolute and relative size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    """One rollout's metric in the run and in the baseline; ``within`` the tolerances or not."""

    rollout: int
    metric: str
    observed: float | None
    baseline: float | None
    within: bool
    note: str = ""

    @property
    def abs_diff(self) -> float | None:
        if number(self.observed) is None or number(self.baseline) is None:
            return None
        return abs(self.observed - self.baseline)

    @property
    def rel_diff(self) -> float | None:
        """|run - baseline| / |baseline|; None when either is missing, inf when only the baseline is 0."""
        diff = self.abs_diff
        if diff is None:
            return None
        if self.baseline == 0:
            return 0.0 if diff == 0 else math.inf
        return diff / abs(self.baseline)


def rollout_differences(report: dict, baseline: dict, metrics: list[str], rtol: float, atol: float,
                        ) -> list[Difference]:
    """Every replayed rollout's metrics against the baseline's entry for the same rollout id, in the run's
    order (rollout by rollout, metric by metric)."""
    theirs = {r.get("rollout_id"): r for r in baseline.get("rollouts") or []}
    rows = []
    for record in report.get("rollouts") or []:
        rid = record.get("rollout_id")
        other = theirs.get(rid)
        for metric in metrics:
            mine = record.get(metric)
            if other is None:
                rows.append(Difference(rid, metric, number(mine), None, False,
                                       f"the baseline has no entry for rollout {rid}"))
                continue
            rows.append(_difference(rid, metric, mine, other.get(metric), rtol, atol))
    return rows


def _difference(rid: int, metric: str, mine: Any, base: Any, rtol: float, atol: float) -> Difference:
    if number(mine) is None or number(base) is None:
        where = "the run" if number(mine) is None else "the baseline"
        return Difference(rid, metric, number(mine), number(base), False, f"is not a number in {where}")
    if not (math.isfinite(mine) and math.isfinite(base)):  # NaN and infinities never match anything
        where = "the run" if not math.isfinite(mine) else "the baseline"
        return Difference(rid, metric, mine, base, False, f"{fmt(mine)} vs baseline {fmt(base)} (not finite in "
                          f"{where})")
    within = abs(mine - base) <= atol + rtol * abs(base)
    d = Difference(rid, metric, mine, base, within)
    relation = "within" if within else "differs beyond"
    return Difference(rid, metric, mine, base, within,
                      f"{fmt(mine)} vs baseline {fmt(base)} (difference {fmt(d.abs_diff)}, relative "
                      f"{fmt_rel(d.rel_diff)}; {relation} rtol {rtol:g} / atol {atol:g})")


def number(value: Any) -> float | None:
    """``value`` when it is an int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def fmt(value: Any) -> str:
    """A number in its shortest round-trip form (``repr``): two different floats never print alike."""
    if value is None:
        return "-"
    return repr(value) if isinstance(value, float) else str(value)


def fmt_rel(value: float | None) -> str:
    """A relative difference, three significant digits (``3.7e-09``)."""
    return "-" if value is None else f"{value:.3g}"
