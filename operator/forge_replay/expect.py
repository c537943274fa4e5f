"""The release-validation verdict: a run's report.json against ``spec.expect`` (and a baseline report).

Pure functions over report dicts (report.json as parsed): ``forge-replay run``, the in-cluster runtime and
``forge-replay report compare`` all decide with these, so they always agree. Each check is a :class:`Check`;
one that cannot be decided (a baseline that cannot be read, a rollout the baseline lacks, a figure the report
does not carry) is a failed check saying why, never a silent pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BASELINE_KEY = "report.json"
"""The data key of a baseline ConfigMap (spec.expect.baseline.configMapName)."""

ENVIRONMENT_KEYS = ("seed", "torch", "transformers", "forge_replay", "device", "world_size", "deterministic")
"""What report.json's ``environment`` records for a baseline comparison to be meaningful."""


@dataclass(frozen=True)
class Check:
    """One expectation: ``observed`` against ``limit`` (for a baseline, the baseline's value).

    A baseline miss names the first ``rollout`` id and the ``metric`` that differ. The field names are the
    same in report.json and in ``status.expectations``."""

    name: str
    passed: bool
    observed: float | None = None
    limit: float | None = None
    rollout: int | None = None
    metric: str | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_status(self) -> dict[str, Any]:
        """For status.expectations and the progress ConfigMap: JSON cannot carry NaN or infinities (the
        message still says them); None fields are left out."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        for key in ("observed", "limit"):
            if isinstance(out.get(key), float) and not math.isfinite(out[key]):
                del out[key]
        return out


class BaselineUnreadable(Exception):
    """A baseline report that cannot be used; the message names the file and why."""


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
        if _number(self.observed) is None or _number(self.baseline) is None:
            return None
        return abs(self.observed - self.baseline)


# ------------------------------------------------------------------------------------------ figures


def peak_memory_gib(rollouts: list[dict]) -> float | None:
    """The figure ``maxPeakMemoryGiB`` limits: the highest peak CUDA *reserved* of any rank on GPU, the peak
    RSS on CPU, over the given rollout records; None when none carries memory."""
    peaks = [_rank_peak(mem) for record in rollouts for mem in record.get("memory") or []]
    known = [p for p in peaks if p is not None]
    return max(known) if known else None


def _rank_peak(mem: dict) -> float | None:
    reserved = mem.get("peak_reserved_gib")
    return reserved if reserved is not None else mem.get("peak_rss_gib")


def over_memory_budget(record: dict, limit: float | None) -> str | None:
    """Why one step's record is over ``maxPeakMemoryGiB`` (checked after every step), or None."""
    peak = peak_memory_gib([record])
    if limit is None or peak is None or peak <= limit:
        return None
    return (f"peak memory {peak:.3f} GiB at rollout {record.get('rollout_id')} is over spec.expect.maxPeakMemoryGiB "
            f"{limit:g}: the run was stopped early")


# ------------------------------------------------------------------------------------------ verdict


def check_report(report: dict, expect, baseline: dict | None = None, baseline_problem: str | None = None,
                 ) -> list[Check]:
    """Every check ``expect`` (an ``ExpectSpec``) asks for, in the order they are listed in the API:
    maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond, then one ``baseline.<metric>`` per metric.

    ``baseline`` is the baseline report; ``baseline_problem`` why it could not be read (then every baseline
    check fails with it)."""
    if expect is None:
        return []
    rollouts = report.get("rollouts") or []
    summary = report.get("summary") or {}
    checks = []
    if expect.max_peak_memory_gib is not None:
        checks.append(_at_most("maxPeakMemoryGiB", peak_memory_gib(rollouts), expect.max_peak_memory_gib,
                               "peak memory (GiB, " + _memory_source(rollouts) + ")"))
    if expect.max_fallbacks is not None:
        fallbacks = summary.get("fallbacks")
        if fallbacks is None:
            fallbacks = sum(bool(r.get("fallback_used")) for r in rollouts)
        checks.append(_at_most("maxFallbacks", fallbacks, expect.max_fallbacks, "rollouts trained on rollout 0's file"))
    if expect.min_tokens_per_second is not None:
        checks.append(_at_least("minTokensPerSecond", summary.get("tokens_per_second"), expect.min_tokens_per_second,
                                "training tokens per second"))
    if expect.baseline is not None:
        b = expect.baseline
        if baseline_problem is not None or baseline is None:
            why = baseline_problem or "no baseline report was given"
            checks += [Check(f"baseline.{m}", False, metric=m, message=f"baseline cannot be used: {why}")
                       for m in b.metrics]
        else:
            checks += compare_reports(report, baseline, b.metrics, b.rtol, b.atol)
    return checks


def _memory_source(rollouts: list[dict]) -> str:
    first = next((m for r in rollouts for m in r.get("memory") or []), {})
    return "CUDA reserved" if first.get("peak_reserved_gib") is not None else "RSS"


def _at_most(name: str, observed: float | None, limit: float, what: str) -> Check:
    if _number(observed) is None:
        return Check(name, False, None, limit, message=f"{what}: not recorded by the run (nothing to check)")
    passed = observed <= limit
    return Check(name, passed, observed, limit,
                 message=f"{what} {_fmt(observed)} {'<=' if passed else '>'} {_fmt(limit)}")


def _at_least(name: str, observed: float | None, limit: float, what: str) -> Check:
    if _number(observed) is None:
        return Check(name, False, None, limit, message=f"{what}: not recorded by the run (nothing to check)")
    passed = observed >= limit
    return Check(name, passed, observed, limit,
                 message=f"{what} {_fmt(observed)} {'>=' if passed else '<'} {_fmt(limit)}")


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
                            f"{replayed} rollouts (largest difference {_fmt(worst.abs_diff or 0.0)} at rollout "
                            f"{worst.rollout})"))
    return checks


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
                rows.append(Difference(rid, metric, mine, None, False,
                                       f"the baseline has no entry for rollout {rid}"))
                continue
            base = other.get(metric)
            rows.append(_difference(rid, metric, mine, base, rtol, atol))
    return rows


def _difference(rid: int, metric: str, mine: Any, base: Any, rtol: float, atol: float) -> Difference:
    if _number(mine) is None or _number(base) is None:
        where = "the run" if _number(mine) is None else "the baseline"
        return Difference(rid, metric, _number(mine), _number(base), False, f"is not a number in {where}")
    if math.isfinite(mine) and math.isfinite(base):
        within = abs(mine - base) <= atol + rtol * abs(base)
    else:
        within = mine == base  # the same infinity; NaN never matches
    relation = "within" if within else "differs beyond"
    return Difference(rid, metric, mine, base, within,
                      f"{_fmt(mine)} vs baseline {_fmt(base)} ({relation} rtol {rtol:g} / atol {atol:g})")


def first_failure(checks: list[Check]) -> Check | None:
    """The first failed check (what a condition message names), or None when all passed."""
    return next((c for c in checks if not c.passed), None)


def failure_line(check: Check) -> str:
    """A failed check as one line: ``baseline.loss: rollout 3: loss 0.51 vs baseline 0.5 (...)``."""
    return f"{check.name}: {check.message}"


# ------------------------------------------------------------------------------------------ files


def read_report(path: str | Path) -> dict:
    """A report.json as a dict; raises BaselineUnreadable naming the file and why."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineUnreadable(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return parse_report(text, str(path))


def parse_report(text: str, where: str) -> dict:
    """report.json text as a dict with a list of rollouts; raises BaselineUnreadable naming ``where``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BaselineUnreadable(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rollouts"), list):
        raise BaselineUnreadable(f"{where}: not a forge-replay report.json (no 'rollouts' list)")
    if not all(isinstance(r, dict) and isinstance(r.get("rollout_id"), int) for r in doc["rollouts"]):
        raise BaselineUnreadable(f"{where}: a rollout entry without an integer rollout_id")
    return doc


def environment_differences(report: dict, baseline: dict) -> list[str]:
    """What the two reports recorded differently among seed, versions, device, world size and deterministic
    settings (a comparison across them may differ for that reason alone); one line each."""
    mine, theirs = report.get("environment") or {}, baseline.get("environment") or {}
    if not mine or not theirs:
        missing = "the run" if not mine else "the baseline"
        return [f"{missing} recorded no environment (seed, versions, device, world size): cannot tell whether "
                "the two runs are comparable"]
    return [f"{key}: {mine.get(key)!r} here, {theirs.get(key)!r} in the baseline"
            for key in ENVIRONMENT_KEYS if mine.get(key) != theirs.get(key)]


# ------------------------------------------------------------------------------------------ helpers


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _fmt(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
