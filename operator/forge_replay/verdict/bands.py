"""Bands and windows (issue 35): figures that vary from run to run, gated against the statistics of the baseline's
runs (spec.expect.baseline.bands) or over a window of the run's own rollouts (spec.expect.windows).

Pure functions over parsed reports, returning :class:`~forge_replay.verdict.reports.Check`s. A band is two-sided,
``mean +/- max(rtol x |mean|, atol, spread x the runs' spread)``; a value (or a reference) that is not a finite
number is never within it. A miss says by how much and what differs between the run and its references
(:func:`forge_replay.verdict.explain.what_changed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from forge_replay.verdict.compare import fmt, number
from forge_replay.verdict.explain import what_changed
from forge_replay.verdict.reports import Check
from forge_replay.verdict.statistics import (
    Stats,
    baseline_runs,
    rank_peaks,
    reference,
    reference_environments,
    reference_peaks,
    rollout_value,
)


@dataclass(frozen=True)
class Band:
    """Where a value must lie: ``low`` to ``high`` around the references' mean."""

    low: float
    high: float


def band_of(ref: Stats, rtol: float | None, atol: float | None, spread: float | None) -> Band | None:
    """The band around ``ref``'s mean: half-width the widest of rtol x |mean|, atol, spread x ref.spread (an unset
    one counts 0). None when it is not finite (a reference or a width that is not a number accepts nothing)."""
    widths = [rtol * abs(ref.mean) if rtol is not None else 0.0, atol if atol is not None else 0.0,
              spread * ref.spread if spread is not None else 0.0]
    if not all(isinstance(w, (int, float)) and math.isfinite(w) for w in (*widths, ref.mean)):
        return None
    band = Band(ref.mean - max(widths), ref.mean + max(widths))
    return band if math.isfinite(band.low) and math.isfinite(band.high) else None


def within(value: float | None, band: Band | None) -> bool:
    """Whether ``value`` is a finite number inside ``band`` (never for NaN, an infinity, None or no band)."""
    value = number(value)
    return band is not None and value is not None and math.isfinite(value) and band.low <= value <= band.high


def measure(value: float | None, metric: str) -> str:
    """A figure with its unit: GiB for a memory peak, s for a time, four significant digits; others in full."""
    if number(value) is None or not math.isfinite(value):
        return fmt(value)
    if metric.endswith("_gib"):
        return f"{value:.4g} GiB"
    if metric.endswith("_seconds"):
        return f"{value:.4g} s"
    return fmt(value)


def label(metric: str) -> str:
    """How a message names a metric: ``peak reserved`` for peak_reserved_gib, ``step time`` for step_seconds."""
    if metric.endswith("_gib"):
        return metric[: -len("_gib")].replace("_", " ")
    if metric.endswith("_seconds"):
        return metric[: -len("_seconds")].replace("_", " ") + " time"
    return metric


def miss_line(value: float | None, band: Band | None, ref: Stats | None, metric: str, runs: int) -> str:
    """Why ``value`` is not within ``band``: by how much over or under, against how many runs."""
    what = f"{label(metric)} {measure(value, metric)}"
    if ref is None or band is None:
        return f"{what}: the baseline holds no finite {metric} here (nothing to compare with)"
    trusted = f"the band of {runs} trusted run{'s' if runs != 1 else ''}"
    span = f"{measure(band.low, metric)} .. {measure(band.high, metric)}, mean {measure(ref.mean, metric)}"
    value = number(value)
    if value is None:
        return f"{label(metric)}: not recorded by the run ({trusted} is {span})"
    if not math.isfinite(value):
        return f"{what}: not finite, never within {trusted} ({span})"
    over = value > band.high
    delta = value - band.high if over else band.low - value
    sign = "+" if over else "-"
    return f"{what}, {sign}{measure(delta, metric)} {'over' if over else 'under'} {trusted} ({span})"


def band_name(band) -> str:
    """The check of a band: ``baseline.<metric>.band``, or ``baseline.<metric>.peakPerRank``."""
    return f"baseline.{band.metric}.{'peakPerRank' if band.over == 'peakPerRank' else 'band'}"


def band_checks(report: dict, baseline: dict, bands: list) -> list[Check]:
    """One check per band of spec.expect.baseline.bands: ``baseline.<metric>.band`` every rollout within the band
    of the baseline's same rollout, or ``baseline.<metric>.peakPerRank`` each rank's peak within the band of that
    rank's peaks. Failed at the first miss, saying by how much and what changed."""
    runs = baseline_runs(baseline)
    changed = what_changed(report.get("environment") or {}, reference_environments(baseline))
    suffix = f"; {changed}" if changed else ""
    checks = []
    for b in bands:
        if b.over == "peakPerRank":
            checks.append(_peak_check(report, baseline, b, runs, suffix))
            continue
        name, metric = band_name(b), b.metric
        theirs = {r.get("rollout_id"): r for r in baseline.get("rollouts") or []}
        rollouts = report.get("rollouts") or []
        if not rollouts:
            checks.append(Check(name, False, metric=metric, message="the run replayed no rollout: nothing to compare"))
            continue
        miss, widest = None, None
        for record in rollouts:
            rid, value = record.get("rollout_id"), rollout_value(record, metric)
            ref = reference(theirs.get(rid), metric, runs)
            band = band_of(ref, b.rtol, b.atol, b.spread) if ref is not None else None
            if not within(value, band):
                miss = Check(name, False, number(value), band.high if band else None, rid, metric,
                             f"rollout {rid}: {miss_line(value, band, ref, metric, runs)}{suffix}")
                break
            distance = abs(value - ref.mean)
            if widest is None or distance > widest[0]:
                widest = (distance, rid, value, band)
        if miss is not None:
            checks.append(miss)
            continue
        _, rid, value, band = widest
        checks.append(Check(name, True, value, band.high, metric=metric,
                            message=f"{label(metric)} within the band of {runs} trusted run(s) on all {len(rollouts)} "
                            f"rollouts (farthest from the mean at rollout {rid}: {measure(value, metric)}, band "
                            f"{measure(band.low, metric)} .. {measure(band.high, metric)})"))
    return checks


def _peak_check(report: dict, baseline: dict, b, runs: int, suffix: str) -> Check:
    name, metric = band_name(b), b.metric
    mine, theirs = rank_peaks(report.get("rollouts") or [], metric), reference_peaks(baseline, metric)
    if not mine:
        return Check(name, False, metric=metric, message=f"{label(metric)}: no rank's peak recorded by the run")
    if not theirs:
        return Check(name, False, metric=metric, message=f"the baseline holds no per-rank peak of {metric} (make it "
                     "with forge-replay report baseline of several reports, or --statistics)")
    for rank in sorted(mine, key=lambda r: (len(r), r)):
        ref = theirs.get(rank)
        band = band_of(ref, b.rtol, b.atol, b.spread) if ref is not None else None
        if ref is None:
            return Check(name, False, mine[rank], metric=metric,
                         message=f"rank {rank}: the baseline holds no peak of this rank (its runs had ranks "
                         f"{', '.join(sorted(theirs))})")
        if not within(mine[rank], band):
            return Check(name, False, mine[rank], band.high if band else None, metric=metric,
                         message=f"rank {rank}: {miss_line(mine[rank], band, ref, metric, runs)}{suffix}")
    top = max(mine, key=lambda r: mine[r])
    return Check(name, True, mine[top], metric=metric,
                 message=f"{label(metric)} peak of each of {len(mine)} rank(s) within the band of {runs} trusted "
                 f"run(s) (highest {measure(mine[top], metric)} on rank {top})")


# ------------------------------------------------------------------------------------------ windows

STATISTIC = {"mean": lambda v: math.fsum(v) / len(v), "max": max, "min": min}


def window_checks(report: dict, windows: list) -> list[Check]:
    """One ``window.<statistic>.<metric>`` check per spec.expect.windows entry: the statistic of the metric over
    the run's last ``last`` rollouts (all when unset) within atMost / atLeast. A window with a value that is not
    recorded or not finite fails."""
    rollouts = report.get("rollouts") or []
    checks = []
    for w in windows:
        name = f"window.{w.statistic}.{w.metric}"
        chosen = rollouts[-w.last:] if w.last else rollouts
        where = (f"the last {w.last} rollouts" if w.last else "the run") + (
            f" ({chosen[0].get('rollout_id')}..{chosen[-1].get('rollout_id')})" if chosen else "")
        if w.last and len(chosen) < w.last:
            where += f"; only {len(chosen)} were replayed"
        values = [rollout_value(r, w.metric) for r in chosen]
        bad = next(((r.get("rollout_id"), v) for r, v in zip(chosen, values) if v is None or not math.isfinite(v)),
                   None)
        if not chosen or bad is not None:
            why = "the run replayed no rollout" if not chosen else (
                f"rollout {bad[0]}: {w.metric} is {'not recorded' if bad[1] is None else fmt(bad[1])}")
            checks.append(Check(name, False, metric=w.metric, message=f"{w.statistic} of {w.metric} over {where}: "
                                f"{why} (nothing to check)"))
            continue
        value = STATISTIC[w.statistic](values)
        fails = [f"> atMost {fmt(w.at_most)}" for _ in [0] if w.at_most is not None and value > w.at_most]
        fails += [f"< atLeast {fmt(w.at_least)}" for _ in [0] if w.at_least is not None and value < w.at_least]
        bounds = ", ".join(f"{k} {fmt(v)}" for k, v in (("atLeast", w.at_least), ("atMost", w.at_most))
                           if v is not None)
        checks.append(Check(name, not fails, value, w.at_most if w.at_most is not None else w.at_least,
                            metric=w.metric, message=f"{w.statistic} of {label(w.metric)} over {where} "
                            f"{measure(value, w.metric)} " + ("; ".join(fails) if fails else f"within {bounds}")))
    return checks
