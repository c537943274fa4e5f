"""The parts of spec.expect that gate figures varying from run to run (issue 35): a two-sided band around the
statistics of the baseline's runs (:class:`BandSpec`, spec.expect.baseline.bands), those runs taken from the
results claim's trusted history (:class:`HistorySpec`, spec.expect.baseline.history), and a check over a window of the
run's rollouts (:class:`WindowSpec`, spec.expect.windows). Their cross-field rules are ``expect_rules``';
``forge_replay.verdict.bands`` decides them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from forge_replay.api.base import ApiModel, FiniteFloat, Int
from forge_replay.api.metrics import GATED_METRICS

MAX_WINDOW = 1_000_000
MAX_HISTORY = 100
"""The most trusted runs ``baseline.history.last`` may ask for (each is a report.json read when the run ends)."""


class BandSpec(ApiModel):
    """A two-sided band around the mean of the baseline's runs: within mean +/- max(rtol x |mean|, atol,
    spread x the runs' spread). A value that is not finite is never within it."""

    metric: Literal[GATED_METRICS] = Field(  # type: ignore[valid-type]
        description="The figure gated: a per-rollout metric of report.json, a step time, or a memory peak "
        "(peak_reserved_gib, peak_allocated_gib, peak_rss_gib: per rollout the highest of any rank).",
    )
    over: Literal["perRollout", "peakPerRank"] = Field(
        default="perRollout",
        description="perRollout: every rollout against the same rollout of the baseline; peakPerRank (memory "
        "peaks only): each rank's peak over the run against the baseline runs' peaks of that rank.",
    )
    rtol: FiniteFloat | None = Field(default=None, ge=0, description="Half-width relative to |mean| (0.02: 2 %).")
    atol: FiniteFloat | None = Field(default=None, ge=0, description="Half-width in the metric's unit (GiB, s).")
    spread: FiniteFloat | None = Field(
        default=None, ge=0, description="Half-width as a multiple of the baseline runs' spread (max - min)."
    )


class HistorySpec(ApiModel):
    """The baseline as the last ``last`` trusted runs of the job's identity kept on the results claim (a run is trusted
    when it met its expectations: ``forge_replay.verdict.history``)."""

    last: Int = Field(
        default=5, ge=1, le=MAX_HISTORY,
        description="How many trusted runs of the same identity (the newest first) make the references.",
    )


class WindowSpec(ApiModel):
    """A check over the run's rollouts: a statistic of a metric over the last ``last`` rollouts (all of them when
    unset) at most and / or at least a value."""

    metric: Literal[GATED_METRICS] = Field(  # type: ignore[valid-type]
        description="The figure checked (as in spec.expect.baseline.bands[].metric).",
    )
    statistic: Literal["mean", "max", "min"] = Field(
        default="mean", description="What is checked of the window: its mean, its maximum or its minimum."
    )
    last: Int | None = Field(
        default=None, ge=1, le=MAX_WINDOW, description="The window: the run's last this many rollouts (unset: all)."
    )
    at_most: FiniteFloat | None = Field(default=None, alias="atMost", description="The statistic must be <= this.")
    at_least: FiniteFloat | None = Field(default=None, alias="atLeast", description="The statistic must be >= this.")
