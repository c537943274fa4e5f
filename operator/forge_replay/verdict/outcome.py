"""A run's outcome, as a memory test reads it, from its report (report.json as parsed): one function, so the
runtime, the slime / miles publish step, ``forge-replay run``'s exit status and the operator agree.

fits: finished, and under spec.expect.maxPeakMemoryGiB when given; overBudget: its peak above that limit (a run
the budget check stopped early too); outOfMemory: the report records an out-of-memory (``out_of_memory``); failed:
anything else that did not finish.
"""

from __future__ import annotations

from forge_replay.verdict.reports import Check, peak_memory_gib

OUTCOME_CHECK = "outcome"
"""The check spec.expect.outcome adds: the run's outcome must be the expected one."""


def outcome_of(report: dict, max_peak_memory_gib: float | None = None) -> str:
    """fits, overBudget, outOfMemory or failed (see the module's docstring)."""
    if report.get("out_of_memory"):
        return "outOfMemory"
    if max_peak_memory_gib is not None:
        peak = peak_memory_gib(report.get("rollouts") or [], report.get("summary") or {})
        if peak is not None and peak > max_peak_memory_gib:
            return "overBudget"
    if report.get("partial", True) or report.get("error"):
        return "failed"
    return "fits"


def outcome_check(outcome: str, expected: str) -> Check:
    """spec.expect.outcome: passed when the run's ``outcome`` is ``expected``."""
    if outcome == expected:
        return Check(OUTCOME_CHECK, True, message=f"the run's outcome is {outcome}, as expected")
    return Check(OUTCOME_CHECK, False, message=f"the run's outcome is {outcome}; spec.expect.outcome is {expected}")


def outcome_expected(expectations: list[dict] | None) -> bool:
    """Whether report.json's ``expectations`` hold a passed ``outcome`` check: the run ended as spec.expect.outcome
    said it must (an outOfMemory that was expected is then a success, exit 0)."""
    return any(c.get("name") == OUTCOME_CHECK and c.get("passed") for c in expectations or [])
