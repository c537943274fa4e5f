"""Trusted history on the results claim (issue 35): spec.expect.baseline.history compares a run with the last N
trusted runs of its identity, kept in their run folders under one results root.

The layout is the cluster's: every run writes its report.json into its own folder, ``<root>/<namespace>/<job>/<run>/``
on the results claim (the operator's ``naming.results_folder``); :func:`run_folders` finds the folders holding a
report.json at most :data:`MAX_DEPTH` levels under a root, so a flat root of run folders (``forge-replay run
--results ROOT/run-3``) reads the same way. A run is *trusted* when its report is usable
(:func:`forge_replay.verdict.reports.unusable_reason`: it finished, its figures are finite and it met its
expectations, enforced or in shadow) and no :data:`UNTRUSTED_FILE` marks it (``forge-replay report untrust``);
an untrusted run is listed, never a reference. Nothing here writes: the marker's content is :func:`untrust_marker`,
the command writes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from forge_replay.api.metrics import GATED_METRICS, MEASURED_METRICS, MEMORY_METRICS
from forge_replay.verdict.baseline import KEPT
from forge_replay.verdict.compare import number
from forge_replay.verdict.reports import (
    Check, ReportUnreadable, dumps_strict, parse_report, peak_memory_gib, read_report, unusable_reason,
)
from forge_replay.verdict.statistics import comparable_identity, history_content

REPORT_FILE = "report.json"
UNTRUSTED_FILE = "untrusted.json"
"""The marker ``forge-replay report untrust RUN`` writes into a run's folder (who, when, why); report.json is never
changed. Delete it to trust the run again."""
MAX_DEPTH = 3
"""How deep under a results root run folders are looked for: ``<namespace>/<job>/<run>`` on the claim."""
HISTORY_CHECK = "baseline.history"
SHOWN = 5
"""How many reference runs a check's message names (then how many more)."""


@dataclass(frozen=True)
class PastRun:
    """One run folder under a results root, as the history reads it."""

    folder: str
    """Relative to the root (``default/memtest/1a2b3c4d``)."""
    doc: dict | None
    """Its report.json, parsed (None when it cannot be read)."""
    started: datetime | None
    trusted: bool
    why: str
    """Why it is trusted or not, one line."""


def run_folders(root: str | Path) -> list[Path]:
    """The folders under ``root`` (at most :data:`MAX_DEPTH` levels down, hidden folders skipped) that hold a
    report.json, sorted; a run folder's own subfolders are not searched. Raises OSError when ``root`` cannot be
    listed."""
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            if depth == 0:
                raise
            return
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            if (path / REPORT_FILE).is_file():
                found.append(path)
            elif depth + 1 < MAX_DEPTH:
                walk(path, depth + 1)

    walk(Path(root), 0)
    return found


def started_at(doc: dict | None) -> datetime | None:
    """A report's ``started_at`` (RFC 3339) as an aware datetime, or None when it records none that parses."""
    text = (doc or {}).get("started_at")
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def read_marker(folder: str | Path) -> dict | None:
    """The :data:`UNTRUSTED_FILE` of a run folder, or None when there is none. A marker that cannot be read still
    marks the run (its presence is what counts)."""
    path = Path(folder) / UNTRUSTED_FILE
    if not path.exists():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"why": f"{UNTRUSTED_FILE} cannot be read ({exc})"}
    return marker if isinstance(marker, dict) else {"why": f"{UNTRUSTED_FILE} is not a JSON object"}


def trust(doc: dict, marker: dict | None) -> tuple[bool, str]:
    """Whether a run (its parsed report and its marker) is trusted, and why: marked untrusted by hand, not usable
    (did not finish, non-finite, failed its own expectations, enforced or in shadow), or without a start time to
    order it by."""
    if marker is not None:
        return False, (f"marked untrusted by {marker.get('by') or 'someone'} at {marker.get('at') or '?'}: "
                       f"{marker.get('why') or 'no reason given'}")
    why = unusable_reason(doc)
    if why:
        return False, why
    if started_at(doc) is None:
        return False, f"it records no start time (started_at {doc.get('started_at')!r}) to order it by"
    checks = doc.get("expectations")
    return True, (f"met its {len(checks)} expectation(s)" + (" (shadow mode)" if doc.get("enforced") is False else "")
                  if checks else "finished, with no expectation to meet")


def read_runs(root: str | Path, exclude: str | Path | None = None) -> list[PastRun]:
    """Every run folder under ``root`` (:func:`run_folders`) but ``exclude`` (the judged run's own), oldest first
    (by start time; those without one first, then by folder). Raises OSError when ``root`` cannot be listed."""
    skip = Path(exclude).resolve() if exclude else None
    runs = []
    for folder in run_folders(root):
        if skip is not None and folder.resolve() == skip:
            continue
        where = folder.relative_to(root).as_posix()
        try:
            doc = read_report(folder / REPORT_FILE)
        except ReportUnreadable as exc:
            runs.append(PastRun(where, None, None, False, str(exc).replace(str(folder / REPORT_FILE), REPORT_FILE)))
            continue
        trusted, why = trust(doc, read_marker(folder))
        runs.append(PastRun(where, doc, started_at(doc), trusted, why))
    floor = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(runs, key=lambda r: (r.started or floor, r.folder))


@dataclass(frozen=True)
class References:
    """The runs a history baseline is made of, and what was left out."""

    chosen: list[PastRun]
    trusted: int
    """Trusted runs of the identity before the judged run (``chosen`` is the last ``last`` of them)."""
    untrusted: int
    other_identity: int
    later: int
    """Runs of the identity that started after the judged run (never its references)."""


def references(runs: list[PastRun], identity: dict | None, last: int, before: datetime | None = None) -> References:
    """The last ``last`` trusted runs (by start time) of ``identity`` (report.json's; compared without the job's name
    and the memory-only trainer settings: :func:`forge_replay.verdict.statistics.comparable_identity`) among
    ``runs``, started before ``before`` when given; and the counts of those left out."""
    mine = comparable_identity(identity)
    same, untrusted, other, later = [], 0, 0, 0
    for run in runs:
        if run.doc is not None and (mine is None or comparable_identity(run.doc.get("identity")) != mine):
            other += 1
        elif not run.trusted:
            untrusted += 1
        elif before is not None and run.started >= before:
            later += 1
        else:
            same.append(run)
    return References(same[-last:], len(same), untrusted, other, later)


@dataclass(frozen=True)
class HistoryBaseline:
    """What spec.expect.baseline.history gives the verdict: the baseline of the references (None when there is
    none), why it could not be read (or None), and the check ``baseline.history`` naming them."""

    baseline: dict | None
    problem: str | None
    check: Check


def history_baseline(report: dict, root: str | Path, last: int,
                     own_folder: str | Path | None = None) -> HistoryBaseline:
    """The baseline of the last ``last`` trusted runs of ``report``'s identity under ``root`` (excluding
    ``own_folder``; only runs that started before ``report``): their statistics (:func:`history_content`), read as a
    several-run baseline is. No such run yet: no baseline and no problem, the check passes saying that this run
    starts the history (its metrics and bands are not compared; its other expectations are)."""
    try:
        runs = read_runs(root, own_folder)
    except OSError as exc:
        problem = f"the results root {root} holding the history cannot be read: {exc.strerror or exc}"
        return HistoryBaseline(None, problem, Check(HISTORY_CHECK, False, limit=last, message=problem))
    refs = references(runs, report.get("identity"), last, started_at(report))
    left = [f"{n} {what}" for n, what in ((refs.untrusted, "untrusted"), (refs.other_identity, "of another identity"),
                                          (refs.later, "started later")) if n]
    skipped = f"; left out: {', '.join(left)}" if left else ""
    if not refs.chosen:
        return HistoryBaseline(None, None, Check(
            HISTORY_CHECK, True, 0, last, message=f"no trusted run of this identity under {root} yet{skipped}: this "
            "run starts the history (its metrics and bands were not compared)"))
    content = history_content([r.doc for r in refs.chosen], GATED_METRICS, MEMORY_METRICS, KEPT, MEASURED_METRICS)
    content = parse_report(dumps_strict(content), f"the history under {root}")  # read as a baseline ConfigMap is
    names = [f"{r.folder} ({r.doc.get('started_at')})" for r in reversed(refs.chosen)]
    if len(names) > SHOWN:
        names = names[:SHOWN] + [f"and {len(names) - SHOWN} more"]
    n = len(refs.chosen)
    return HistoryBaseline(content, None, Check(
        HISTORY_CHECK, True, n, last, message=f"compared with the last {n} of {refs.trusted} trusted run(s) of this "
        f"identity under {root}: {', '.join(names)}{skipped}"))


# ------------------------------------------------------------------------------------------ listing and marking


def identity_key(doc: dict | None) -> str:
    """A short fingerprint of a report's comparable identity (runs with one key are runs of one identity), "-"
    when it records none."""
    ident = comparable_identity((doc or {}).get("identity"))
    if ident is None:
        return "-"
    canonical = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:8]


def key_figures(doc: dict | None) -> dict:
    """What ``report history`` shows of a run: rollouts trained, the last rollout's loss, the peak memory
    (``maxPeakMemoryGiB``'s figure) and the mean step time; None where the report does not record it."""
    rollouts = (doc or {}).get("rollouts") or []
    steps = [v for v in (number(r.get("step_seconds")) for r in rollouts) if v is not None and math.isfinite(v)]
    return {"rollouts": len(rollouts), "loss": number(rollouts[-1].get("loss")) if rollouts else None,
            "peak_gib": peak_memory_gib(rollouts, (doc or {}).get("summary")),
            "step_seconds": math.fsum(steps) / len(steps) if steps else None}


def replays(identity: dict) -> str:
    """What a run of ``identity`` (report.json's) replays, in a few words: mode, dumps, model, backend."""
    if not identity:
        return "no identity recorded (a report of an older version)"
    model = identity.get("model") or {}
    shown = (f"config {model['config_sha256'][:8]}" if model.get("config_sha256")
             else f"{model.get('claim_name')}:{model.get('path')}")
    trainer = identity.get("trainer") or {}
    return (f"{identity.get('mode')} replay of {identity.get('dumps_path')}, model {shown}, "
            f"{trainer.get('backend', 'builtin')} trainer, lr {trainer.get('learning_rate')}")


def history_rows(runs: list[PastRun]) -> list[dict]:
    """One row per run for ``forge-replay report history``: folder, job, identity key, mode and dumps, start,
    trusted and why, and the key figures."""
    rows = []
    for run in runs:
        doc = run.doc or {}
        ident = doc.get("identity") or {}
        rows.append({"run": run.folder, "job": doc.get("job"), "identity": identity_key(run.doc),
                     "replays": replays(ident),
                     "started_at": doc.get("started_at"), "trusted": run.trusted, "why": run.why,
                     **key_figures(run.doc)})
    return rows


def untrust_marker(by: str, at: str, why: str) -> dict:
    """The content of :data:`UNTRUSTED_FILE`: who marked the run, when (RFC 3339) and why."""
    return {"untrusted": True, "by": by, "at": at, "why": why}
