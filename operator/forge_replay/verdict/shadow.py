"""Shadow mode (issue 35): ``spec.expect.enforce: false`` computes and records the verdict (report.json's
``expectations``, status.expectations, ``ExpectationsMet=False`` with reason :data:`SHADOW_REASON`) while the job
still succeeds, so that a team rolls a new gate out without blocking releases, then enforces it.

It covers every check of spec.expect, the expected outcome's too: a run that fits where ``outcome: outOfMemory`` is
expected succeeds in shadow mode. It does not turn a run that failed into a success: one that ran out of memory
(without spec.expect.outcome expecting it) or crashed fails as it would without spec.expect. ``forge-replay run``
(:func:`forge_replay.runtime.run_inputs.exit_status`), the in-cluster runtime and the operator
(``forge_replay.controller.shadow``) all decide with :func:`enforced`.
"""

from __future__ import annotations

SHADOW_REASON = "ExpectationsNotMetShadow"
"""The reason of ``ExpectationsMet=False`` for a verdict recorded in shadow mode (the job is not failed by it)."""


def enforced(expect) -> bool:
    """Whether a failed check of ``expect`` (an ``ExpectSpec``, or None) fails the job: spec.expect.enforce, true
    unless it is set false."""
    return expect is None or getattr(expect, "enforce", True) is not False


def shadow_line(why: str) -> str:
    """The line that says a verdict was not met but not enforced either."""
    return f"shadow mode (spec.expect.enforce: false), not enforced: {why}"
