"""A baseline from several runs of one identity (issue 35): per rollout and metric the runs' mean, min, max, spread
and count, and per rank the run's memory peaks, as ``forge-replay report baseline A.json B.json ...`` writes them.

Pure functions over parsed reports. The baseline keeps the one-run layout (:mod:`.baseline`): the column of a
metric holds the runs' mean, so an exact comparison reads it as it reads a one-run baseline; ``<metric>.min``,
``<metric>.max`` and ``<metric>.spread`` (max - min) are written only for a metric whose runs differ on some rollout,
``<metric>.runs`` only where not every run recorded it (a baseline stays small: a column that would repeat the mean,
or the run count, is left out and read back as such by :func:`reference`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from forge_replay.verdict.compare import number

FORMAT_RUNS = "forge-replay-baseline/v2"
MEMORY_ONLY_SETTINGS = ("gradient_checkpointing",)
"""Trainer settings of report.json's identity that change memory but not the numbers: runs that differ in them are
still runs of one identity (the regression explanation names them, from ``environment``)."""
STATISTICS = ("min", "max", "spread", "runs")


@dataclass(frozen=True)
class Stats:
    """One metric over the reference runs: their mean, min, max, spread (max - min) and how many recorded it."""

    mean: float
    min: float
    max: float
    spread: float
    runs: int

    def to_dict(self) -> dict:
        return asdict(self)


def stats_of(values: list) -> Stats | None:
    """The statistics of the finite numbers among ``values`` (None when there is none). The mean of equal values is
    that value exactly (an exact comparison with a deterministic run's baseline stays exact)."""
    finite = [v for v in (number(x) for x in values) if v is not None and math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    mean = low if low == high else math.fsum(finite) / len(finite)
    return Stats(mean, low, high, high - low, len(finite))


# ------------------------------------------------------------------------------------------ figures of one run


def rollout_value(record: dict, metric: str) -> float | None:
    """``metric`` of one rollout record: the field itself, or for a memory figure of the rollout's per-rank
    ``memory`` entries (peak_reserved_gib, ...) the highest of any rank. None when not recorded."""
    memory = record.get("memory")
    if isinstance(memory, list) and any(isinstance(m, dict) and metric in m for m in memory):
        known = [v for v in (number(m.get(metric)) for m in memory if isinstance(m, dict)) if v is not None]
        return max(known) if known else None
    return number(record.get(metric))


def rank_peaks(rollouts: list[dict], metric: str) -> dict[str, float]:
    """Per rank (its number as a string, as JSON keys are), the highest ``metric`` of the run's ``memory`` entries."""
    peaks: dict[str, float] = {}
    for record in rollouts:
        for mem in record.get("memory") or []:
            value = number(mem.get(metric)) if isinstance(mem, dict) else None
            if value is None or not math.isfinite(value):
                continue
            rank = str(mem.get("rank"))
            peaks[rank] = value if rank not in peaks else max(peaks[rank], value)
    return peaks


# ------------------------------------------------------------------------------------------ one identity


def comparable_identity(identity: dict | None) -> dict | None:
    """What makes runs comparable: report.json's ``identity`` without the job's name and without the
    MEMORY_ONLY_SETTINGS of its trainer."""
    if not isinstance(identity, dict):
        return None
    out = {k: v for k, v in identity.items() if k != "job"}
    if isinstance(out.get("trainer"), dict):
        out["trainer"] = {k: v for k, v in out["trainer"].items() if k not in MEMORY_ONLY_SETTINGS}
    return out


def identity_problem(doc: dict, where: str, first: dict, first_where: str) -> str | None:
    """Why ``doc`` (at ``where``) is not a run of the identity of ``first`` (at ``first_where``), naming the fields
    that differ; None when it is one."""
    mine, theirs = comparable_identity(doc.get("identity")), comparable_identity(first.get("identity"))
    if mine is None:
        return f"{where}: it records no identity (an older version's report): cannot tell what it replayed"
    if mine == theirs:
        return None
    fields = [f"{k} {theirs.get(k)!r} -> {mine.get(k)!r}" for k in sorted(set(mine) | set(theirs or {}))
              if k != "trainer" and mine.get(k) != (theirs or {}).get(k)]
    a, b = mine.get("trainer") or {}, (theirs or {}).get("trainer") or {}
    fields += [f"trainer.{k} {b.get(k)!r} -> {a.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return f"{where}: a run of another identity than {first_where} ({'; '.join(fields)})"


# ------------------------------------------------------------------------------------------ the baseline


MEASURED_DIGITS = 6
"""Significant digits kept of a measurement's statistics (step times, memory): 1 ms of 1000 s, 0.1 MiB of 100 GiB.
A measurement varies from run to run far more; the numbers a debug replay reproduces keep every digit."""


def rounded(stats: Stats | None, digits: int | None) -> Stats | None:
    """``stats`` with its figures to ``digits`` significant digits (unchanged when None)."""
    if stats is None or digits is None:
        return stats
    r = lambda x: float(f"{x:.{digits}g}")  # noqa: E731
    return Stats(r(stats.mean), r(stats.min), r(stats.max), r(r(stats.max) - r(stats.min)), stats.runs)


def history_content(docs: list[dict], metrics: tuple[str, ...], memory_metrics: tuple[str, ...], kept: tuple,
                    measured: tuple[str, ...] = ()) -> dict:
    """The baseline of several usable runs of one identity (the caller checked both): the newest run's ``kept``
    fields, ``runs`` and ``history`` (each run's job, start and environment, oldest first), per rollout the statistics
    of every metric any run recorded (those of ``measured`` metrics to MEASURED_DIGITS), and ``peaks``: per memory
    metric and rank, the statistics of the runs' peaks."""
    ordered = sorted(docs, key=lambda d: str(d.get("started_at") or ""))
    newest = ordered[-1]
    out = {"format": FORMAT_RUNS, **{k: newest.get(k) for k in kept}}
    out["expectations"] = [{"name": c.get("name"), "passed": c.get("passed")} for c in newest.get("expectations") or []]
    out["runs"] = len(ordered)
    out["history"] = [{"job": d.get("job"), "started_at": d.get("started_at"), "environment": d.get("environment")}
                      for d in ordered]
    by_id = [{r["rollout_id"]: r for r in d["rollouts"]} for d in ordered]
    ids = sorted(set().union(*by_id))
    out["summary"] = {"rollouts": len(ids), "all_finite": True}
    columns: dict[str, list] = {"rollout_id": ids}
    for metric in metrics:
        digits = MEASURED_DIGITS if metric in measured else None
        rows = [rounded(stats_of([rollout_value(runs[i], metric) for runs in by_id if i in runs]), digits) for i in ids]
        if all(s is None for s in rows):
            continue
        columns[metric] = [s.mean if s else None for s in rows]
        if any(s is not None and s.spread for s in rows):
            for stat in ("min", "max", "spread"):
                columns[f"{metric}.{stat}"] = [getattr(s, stat) if s else None for s in rows]
        if any(s is None or s.runs != len(ordered) for s in rows):
            columns[f"{metric}.runs"] = [s.runs if s else 0 for s in rows]
    out["rollouts"] = columns
    peaks = {}
    for metric in memory_metrics:
        per_run = [rank_peaks(d["rollouts"], metric) for d in ordered]
        ranks = sorted(set().union(*per_run), key=lambda r: (len(r), r))
        if ranks:
            peaks[metric] = {r: rounded(stats_of([p.get(r) for p in per_run]), MEASURED_DIGITS).to_dict()
                             for r in ranks}
    out["peaks"] = peaks
    return out


def reference(record: dict | None, metric: str, runs: int) -> Stats | None:
    """The statistics of ``metric`` in one rollout record of a baseline: a several-run baseline's columns, or one
    run's value (spread 0; ``runs`` is the baseline's run count). None when the baseline has no finite value."""
    if record is None:
        return None
    mean = rollout_value(record, metric)
    if mean is None or not math.isfinite(mean):
        return None
    low, high = number(record.get(f"{metric}.min")), number(record.get(f"{metric}.max"))
    low = mean if low is None else low
    high = mean if high is None else high
    spread = number(record.get(f"{metric}.spread"))
    count = number(record.get(f"{metric}.runs"))
    return Stats(mean, low, high, high - low if spread is None else spread, runs if count is None else int(count))


def baseline_runs(baseline: dict) -> int:
    """How many runs a baseline stands for: a several-run baseline's ``runs``, else 1."""
    runs = number(baseline.get("runs"))
    return int(runs) if runs is not None and runs >= 1 else 1


def reference_environments(baseline: dict) -> list[dict]:
    """The environments of a baseline's runs (its ``history``, or its own ``environment``), oldest first."""
    history = baseline.get("history")
    if isinstance(history, list) and history:
        return [h.get("environment") or {} for h in history if isinstance(h, dict)]
    return [baseline.get("environment") or {}]


def reference_peaks(baseline: dict, metric: str) -> dict[str, Stats]:
    """Per rank, the statistics of the baseline runs' peaks of ``metric``: a several-run baseline's ``peaks``, or
    one run's own (from its rollouts' memory entries)."""
    peaks = baseline.get("peaks")
    if isinstance(peaks, dict):
        return {rank: Stats(**s) for rank, s in (peaks.get(metric) or {}).items()}
    return {rank: Stats(v, v, v, 0.0, 1) for rank, v in rank_peaks(baseline.get("rollouts") or [], metric).items()}
