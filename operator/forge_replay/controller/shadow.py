"""The operator's side of shadow mode (:mod:`forge_replay.verdict.shadow`): an unmet spec.expect with
``enforce: false`` leaves the job's phase as its run ended (Succeeded: Ready, Argo CD Healthy) and says the verdict in
``ExpectationsMet=False`` with reason ``ExpectationsNotMetShadow``. Kept out of ``controller.status`` (at its size
limit), which asks these two functions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from forge_replay.verdict.shadow import SHADOW_REASON, enforced, shadow_line

EXPECTATIONS_NOT_MET = "ExpectationsNotMet"
"""The reason of ``ExpectationsMet=False`` for an enforced verdict that failed (the job fails)."""


def fails_the_job(expect: Any, unmet: str | None) -> bool:
    """Whether the run's unmet expectation (``unmet``: the first failed check, None when met) fails the job."""
    return unmet is not None and enforced(expect)


def shadowed(condition: Any, expect: Any) -> Any:
    """``ExpectationsMet`` (a condition with status, reason, message) as shadow mode says it: a False with reason
    ExpectationsNotMet becomes reason ExpectationsNotMetShadow, its message saying it was not enforced; any other
    condition (met, pending, a baseline that cannot be read) is returned as it is."""
    if enforced(expect) or condition.status != "False" or condition.reason != EXPECTATIONS_NOT_MET:
        return condition
    return replace(condition, reason=SHADOW_REASON, message=shadow_line(condition.message))
