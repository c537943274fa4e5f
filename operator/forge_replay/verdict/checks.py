"""The release-validation verdict: a run's report.json against ``spec.expect`` (and a baseline report).

Pure functions over report dicts (report.json as parsed): ``forge-replay run``, the in-cluster runtime and
``forge-replay report compare`` all decide with these, so they always agree. Each check is a :class:`Check`;
one that cannot be decided (a baseline that cannot be used, a rollout the baseline lacks, a figure the report
does not carry) is a failed check saying why, never a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge_replay.verdict.bands import band_checks, band_name, window_checks
from forge_replay.verdict.compare import fmt, fmt_rel, number, rollout_differences
from forge_replay.verdict.identity import another_job
from forge_replay.verdict.outcome import outcome_check, outcome_of
from forge_replay.verdict.reports import (  # noqa: F401 - Check and peak_memory_gib are read from here too
    FINITE_METRICS,
    Check,
    non_finite_metrics,
    peak_memory_gib,
    unusable_reason,
)

FINITE_CHECK = "finiteMetrics"
"""The check every run with spec.expect gets: loss and grad norm finite on every rollout."""
IDENTITY_CHECK = "baseline.identity"
"""Fails when the baseline replayed another mode or model (unless allowed)."""


@dataclass(frozen=True)
class Limits:
    """spec.expect's limits where pydantic is not installed (the slime / miles publish step in the team's
    image): the attributes of ``ExpectSpec`` that :func:`check_report` reads."""

    max_peak_memory_gib: float | None = None
    max_fallbacks: int | None = None
    min_tokens_per_second: float | None = None
    baseline: Any = None
    outcome: str | None = None
    """spec.expect.outcome: fits or outOfMemory."""
    windows: tuple = ()
    enforce: bool = True
    """spec.expect.enforce: false records the verdict without failing the job (:mod:`.shadow`)."""


# ------------------------------------------------------------------------------------------ figures


def over_memory_budget(record: dict, limit: float | None) -> str | None:
    """Why one step's record is over ``maxPeakMemoryGiB`` (checked after every step), or None."""
    peak = peak_memory_gib([record])
    if limit is None or peak is None or peak <= limit:
        return None
    return (f"peak memory {peak:.3f} GiB at rollout {record.get('rollout_id')} is over spec.expect.maxPeakMemoryGiB "
            f"{limit:g}: the run was stopped early")


# ------------------------------------------------------------------------------------------ verdict


def check_report(report: dict, expect, baseline: dict | None = None, baseline_problem: str | None = None,
                 records_losses: bool = True, history: Check | None = None) -> list[Check]:
    """Every check ``expect`` (an ``ExpectSpec``) asks for: ``finiteMetrics`` (any expectation brings it: a run
    whose loss or grad norm went NaN or infinite passes no gate), then in the order the API lists them
    maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond, and for a baseline ``baseline.identity`` when the
    baseline replayed another mode or model, then one ``baseline.<metric>`` per metric and one per band
    (:func:`.bands.band_checks`), then one ``window.<statistic>.<metric>`` per window (:func:`.bands.window_checks`).

    ``baseline`` is the baseline report (one that is not usable, :func:`unusable_reason`, fails every baseline
    check saying why); ``baseline_problem`` why it could not be read. ``records_losses``: False for a slime /
    miles run, whose report (the memory probe's) holds no losses to check.

    ``frontier`` (spec.expect.frontier) reads the report's ``sweep`` (``verdict.sweep.frontier_check``).
    ``history``: for spec.expect.baseline.history, the check ``baseline.history`` naming the trusted runs the baseline
    is made of (:mod:`.history`), first of the baseline's checks; passed with neither a baseline nor a problem, the
    run starts the history and its metrics and bands are not compared.

    ``outcome`` (spec.expect.outcome) comes last: the report's ``outcome``, or :func:`outcome_of` it. A run that ran
    out of memory did not finish: it is judged on its outcome alone (no check at all without spec.expect.outcome)."""
    if expect is None:
        return []
    expected = getattr(expect, "outcome", None)
    outcome = report.get("outcome") or outcome_of(report, expect.max_peak_memory_gib)
    if outcome == "outOfMemory":
        return [outcome_check(outcome, expected)] if expected else []
    rollouts = report.get("rollouts") or []
    summary = report.get("summary") or {}
    checks = [finite_check(report)] if records_losses else []
    if expect.max_peak_memory_gib is not None:
        checks.append(_at_most("maxPeakMemoryGiB", peak_memory_gib(rollouts, summary), expect.max_peak_memory_gib,
                               "peak memory (GiB, " + _memory_source(rollouts, summary) + ")"))
    if expect.max_fallbacks is not None:
        fallbacks = summary.get("fallbacks")
        if fallbacks is None and rollouts:
            fallbacks = sum(bool(r.get("fallback_used")) for r in rollouts)
        checks.append(_at_most("maxFallbacks", fallbacks, expect.max_fallbacks, "rollouts trained on rollout 0's file"))
    if expect.min_tokens_per_second is not None:
        checks.append(_at_least("minTokensPerSecond", summary.get("tokens_per_second"), expect.min_tokens_per_second,
                                "training tokens per second"))
    if expect.baseline is not None:
        b = expect.baseline
        # the first trusted run of its identity starts the history: nothing to compare with yet
        starts = history is not None and history.passed and baseline is None and baseline_problem is None
        if history is not None:
            checks.append(history)
        if baseline_problem is None and baseline is None and not starts:
            baseline_problem = "no baseline report was given"
        if baseline_problem is None and baseline is not None:
            why = unusable_reason(baseline)
            baseline_problem = f"the baseline report: {why}" if why else None
        bands = getattr(b, "bands", None) or []
        if starts:
            pass
        elif baseline_problem is not None:
            names = [f"baseline.{m}" for m in b.metrics] + [band_name(band) for band in bands]
            checks += [Check(n, False, metric=n.split(".")[1], message=f"baseline cannot be used: {baseline_problem}")
                       for n in names]
        else:
            other = another_job(report, baseline, b.allow_different)
            if other:
                checks.append(Check(IDENTITY_CHECK, False, message=f"the baseline is of another job: {other}"))
            checks += compare_reports(report, baseline, b.metrics, b.rtol, b.atol)
            checks += band_checks(report, baseline, bands)
    checks += window_checks(report, getattr(expect, "windows", None) or [])
    if getattr(expect, "frontier", None):
        from forge_replay.verdict.sweep import frontier_check  # a sweep's alone: the team's image never needs it

        checks.append(frontier_check(expect.frontier, report.get("sweep") or {}))
    if expected:
        checks.append(outcome_check(outcome, expected))
    return checks


def finite_check(report: dict) -> Check:
    """``finiteMetrics``: loss and grad norm finite on every rollout; failed at the first that is not."""
    bad = [(r.get("rollout_id"), metric, value) for r in report.get("rollouts") or []
           for metric, value in non_finite_metrics(r).items()]
    if bad:
        rid, metric, value = bad[0]
        rollouts = sorted({b[0] for b in bad})
        return Check(FINITE_CHECK, False, rollout=rid, metric=metric,
                     message=f"rollout {rid}: {metric} is {value} ({len(bad)} non-finite value(s) of "
                     f"{'/'.join(FINITE_METRICS)} in rollouts {rollouts}): the training diverged")
    return Check(FINITE_CHECK, True, message=f"{'/'.join(FINITE_METRICS)} finite on every rollout")


def _memory_source(rollouts: list[dict], summary: dict) -> str:
    first = next((m for r in rollouts for m in r.get("memory") or []), None) or summary.get("memory_peak") or {}
    return "CUDA reserved" if first.get("peak_reserved_gib") is not None else "RSS"


def _at_most(name: str, observed: float | None, limit: float, what: str) -> Check:
    if number(observed) is None:
        return Check(name, False, None, limit, message=f"{what}: not recorded by the run (nothing to check)")
    passed = observed <= limit
    return Check(name, passed, observed, limit,
                 message=f"{what} {fmt(observed)} {'<=' if passed else '>'} {fmt(limit)}")


def _at_least(name: str, observed: float | None, limit: float, what: str) -> Check:
    if number(observed) is None:
        return Check(name, False, None, limit, message=f"{what}: not recorded by the run (nothing to check)")
    passed = observed >= limit
    return Check(name, passed, observed, limit,
                 message=f"{what} {fmt(observed)} {'>=' if passed else '<'} {fmt(limit)}")


def compare_reports(report: dict, baseline: dict, metrics: list[str], rtol: float, atol: float) -> list[Check]:
    """One ``baseline.<metric>`` check per metric over every rollout the run replayed: failed at the first
    rollout whose value is not within ``atol + rtol * |baseline|`` (or that the baseline lacks)."""
    rows = rollout_differences(report, baseline, metrics, rtol, atol)
    replayed = len(report.get("rollouts") or [])
    checks = []
    for metric in metrics:
        mine = [d for d in rows if d.metric == metric]
        if not mine:
            checks.append(Check(f"baseline.{metric}", False, metric=metric,
                                message="the run replayed no rollout: nothing to compare with the baseline"))
            continue
        miss = next((d for d in mine if not d.within), None)
        if miss is not None:
            checks.append(Check(f"baseline.{metric}", False, miss.observed, miss.baseline, miss.rollout, metric,
                                f"rollout {miss.rollout}: {metric} {miss.note}"))
            continue
        worst = max(mine, key=lambda d: d.abs_diff or 0.0)
        checks.append(Check(f"baseline.{metric}", True, worst.observed, worst.baseline, metric=metric,
                            message=f"{metric} within rtol {rtol:g} / atol {atol:g} of the baseline on all "
                            f"{replayed} rollouts (largest difference {fmt(worst.abs_diff or 0.0)}, relative "
                            f"{fmt_rel(worst.rel_diff)}, at rollout {worst.rollout})"))
    return checks


def first_failure(checks: list[Check]) -> Check | None:
    """The first failed check (what a condition message names), or None when all passed."""
    return next((c for c in checks if not c.passed), None)


def unmet_line(expectations: list[dict] | None) -> str | None:
    """One line naming the first failed check of report.json's ``expectations``, or None when every one passed (or
    none was asked for): ``forge-replay run`` exits 3 on it, the runtime and the publish step fail the job."""
    failed = [c for c in expectations or [] if not c["passed"]]
    if not failed:
        return None
    return (f"{len(failed)} of {len(expectations)} expectation(s) not met; first: {failed[0]['name']}: "
            f"{failed[0]['message']}")


def missing_verdict(expect_set: bool, expectations: list[dict] | None, finished: bool, detail: str = "") -> str | None:
    """The unmet line of a run that finished with ``spec.expect`` set but recorded no verdict on it (never a silent
    pass): "the run recorded no verdict" and the caller's ``detail`` (what it read); None when the run recorded
    one, none was asked for, or the run did not finish. The operator and ``forge-replay run`` both decide with it."""
    if not expect_set or not finished or expectations is not None:
        return None
    return f"the run recorded no verdict{detail}"
