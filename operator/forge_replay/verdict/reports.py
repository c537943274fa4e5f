"""report.json as the verdict reads it: parsing, strict JSON, the one definition of a usable report, the record of
one check (:class:`Check`) and the memory figure ``maxPeakMemoryGiB`` limits (:func:`peak_memory_gib`).

A report is *usable* (as a baseline, or as either side of ``report compare``) when :func:`unusable_reason` says
None; ``report baseline``, ``report compare``, ``run --baseline``, the in-cluster runtime and the operator's
baseline check all ask it, so they cannot disagree.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BASELINE_KEY = "report.json"
"""The data key of a baseline ConfigMap (spec.expect.baseline.configMapName)."""

FINITE_METRICS = ("loss", "grad_norm")
"""The per-rollout figures a run must keep finite: a NaN or infinite one fails check ``finiteMetrics``."""


class ReportUnreadable(Exception):
    """A report that cannot be used; the message names the file and why."""


# ------------------------------------------------------------------------------------------ checks and figures
# The verdict's record of one check (report.json's ``expectations``) and the memory figure a report carries: here,
# below :mod:`.checks` and :mod:`.outcome`, which both read them.


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



def peak_memory_gib(rollouts: list[dict], summary: dict | None = None) -> float | None:
    """The figure ``maxPeakMemoryGiB`` limits: the highest peak CUDA *reserved* of any rank on GPU, the peak
    RSS on CPU, over the given rollout records; without per-rollout memory (a slime / miles run: the memory
    probe's report), the summary's ``memory_peak``. None when nothing carries memory."""
    peaks = [_rank_peak(mem) for record in rollouts for mem in record.get("memory") or []]
    known = [p for p in peaks if p is not None]
    if known:
        return max(known)
    return _rank_peak((summary or {}).get("memory_peak") or {})


def _rank_peak(mem: dict) -> float | None:
    reserved = mem.get("peak_reserved_gib")
    return reserved if reserved is not None else mem.get("peak_rss_gib")



# ------------------------------------------------------------------------------------------ reading


def read_report(path: str | Path) -> dict:
    """A report.json (or a baseline's) as a dict; raises ReportUnreadable naming the file and why."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportUnreadable(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return parse_report(text, str(path))


def parse_report(text: str, where: str) -> dict:
    """report.json text as a dict whose ``rollouts`` is a list of records with integer ``rollout_id``s.

    A baseline (:func:`forge_replay.verdict.baseline.baseline_content`) holds its rollouts as columns
    (``{"rollout_id": [...], "loss": [...]}``); they are turned back into records here. Bare ``NaN`` /
    ``Infinity`` tokens (reports of older versions) are read as the floats they stand for, so that the
    verdict can refuse them by name. Raises ReportUnreadable naming ``where``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ReportUnreadable(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ReportUnreadable(f"{where}: not a forge-replay report.json (not a JSON object)")
    rollouts = doc.get("rollouts")
    if isinstance(rollouts, dict):
        rollouts = doc["rollouts"] = _rows(rollouts, where)
    if not isinstance(rollouts, list):
        raise ReportUnreadable(f"{where}: not a forge-replay report.json (no 'rollouts' list)")
    for i, record in enumerate(rollouts):
        rid = record.get("rollout_id") if isinstance(record, dict) else None
        if isinstance(rid, bool) or not isinstance(rid, int):
            raise ReportUnreadable(f"{where}: rollouts[{i}]: rollout_id {rid!r} is not an integer")
    return doc


def _rows(columns: dict, where: str) -> list[dict]:
    ids = columns.get("rollout_id")
    if not isinstance(ids, list) or not all(isinstance(v, list) and len(v) == len(ids) for v in columns.values()):
        raise ReportUnreadable(f"{where}: 'rollouts' columns must be lists of one length, with a rollout_id column")
    return [{name: values[i] for name, values in columns.items()} for i in range(len(ids))]


# ------------------------------------------------------------------------------------------ strict JSON


def non_finite_metrics(record: dict) -> dict[str, str]:
    """The FINITE_METRICS of one rollout record that are not finite, as ``{"grad_norm": "nan"}``: the floats
    themselves (a report before it is written) or the record's ``non_finite`` flags (a report as written)."""
    found = dict(record.get("non_finite") or {})
    for metric in FINITE_METRICS:
        value = record.get(metric)
        if isinstance(value, float) and not math.isfinite(value):
            found[metric] = repr(value)
    return found


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None, so that it is strict JSON (RFC 8259: Go's
    encoding/json and jq refuse bare NaN / Infinity). Say what was replaced next to it: see
    :func:`non_finite_metrics` and the report's summary."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps_strict(doc: Any, **kw) -> str:
    """``json.dumps`` of :func:`strict` ``(doc)``; never writes NaN or Infinity."""
    return json.dumps(strict(doc), allow_nan=False, **kw)


# ------------------------------------------------------------------------------------------ usable


def unusable_reason(doc: dict) -> str | None:
    """Why a parsed report cannot serve as a baseline or be compared, or None when it can.

    Usable means: the run finished (not partial, every planned rollout trained, no error, not interrupted, not
    stopped early), trained at least one rollout, its loss and grad norm are finite everywhere, its own
    expectations (if any) did not fail, and it names its job."""
    if doc.get("error") or doc.get("interrupted"):
        return f"the run did not finish ({doc.get('error') or 'interrupted by ' + str(doc.get('interrupted'))})"
    if doc.get("stopped_early"):
        return f"the run was stopped early ({doc['stopped_early']})"
    if doc.get("partial") is not False:
        how = (f"{doc.get('completed')} of {doc.get('planned')} rollouts" if "partial" in doc
               else "it does not say partial: false")
        return f"the run did not finish ({how}; a finished run's report says partial: false)"
    if not doc.get("rollouts"):
        return "no rollout was trained; nothing to compare"
    bad = [(r["rollout_id"], m, v) for r in doc["rollouts"] for m, v in non_finite_metrics(r).items()]
    if bad or (doc.get("summary") or {}).get("all_finite") is False:
        first = f": rollout {bad[0][0]} {bad[0][1]} is {bad[0][2]}" if bad else ""
        return f"the run has non-finite values ({len(bad)} in loss / grad_norm{first})"
    failed = [c.get("name") for c in doc.get("expectations") or [] if isinstance(c, dict) and not c.get("passed")]
    if failed:
        return f"its own expectations failed ({', '.join(map(str, failed))})"
    job = doc.get("job")
    if not isinstance(job, str) or not job:
        return "it names no job (no 'job' field)"
    return None


def usable_or_raise(doc: dict, where: str) -> dict:
    """``doc`` when :func:`unusable_reason` finds nothing; else ReportUnreadable naming ``where``."""
    why = unusable_reason(doc)
    if why is not None:
        raise ReportUnreadable(f"{where}: {why}")
    return doc


def read_usable(path: str | Path) -> dict:
    """:func:`read_report`, then :func:`usable_or_raise`."""
    return usable_or_raise(read_report(path), str(path))
