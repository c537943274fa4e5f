"""The cross-field rules of spec.expect's bands, history and windows (issue 35), each with its CEL twin for the CRD,
as ``rules.CORE_RULES`` (``rules.recorder``): a band needs its width, ``peakPerRank`` gates a memory peak, a history
needs the results claim it is kept on, a window needs a bound and bounds that some value can pass."""

from __future__ import annotations

from forge_replay.api.metrics import MEMORY_METRICS
from forge_replay.api.names import Problem
from forge_replay.api.rules import CrossFieldRule, SpecParts, recorder

EXPECT_RULES: list[CrossFieldRule] = []
"""The rules of spec.expect.baseline.bands and spec.expect.windows, in order (after the core and BYO rules)."""
_rule = recorder(EXPECT_RULES)
_MEMORY_CEL = "[" + ", ".join(f"'{m}'" for m in MEMORY_METRICS) + "]"


def _bands(spec: SpecParts) -> list:
    return list(spec.expect.baseline.bands) if spec.expect and spec.expect.baseline else []


def _windows(spec: SpecParts) -> list:
    return list(getattr(spec.expect, "windows", None) or []) if spec.expect else []


@_rule(
    "expect.baseline",
    "!has(self.bands) || self.bands.all(b, has(b.rtol) || has(b.atol) || has(b.spread))",
    "spec.expect.baseline.bands: each band needs its width (rtol, atol or spread)",
    ".bands",
)
def _band_has_width(spec: SpecParts) -> list[Problem]:
    return [Problem(f"spec.expect.baseline.bands[{i}]", f"band of {b.metric} has no width: set rtol, atol or "
                    "spread (any of them; the widest wins)")
            for i, b in enumerate(_bands(spec)) if b.rtol is None and b.atol is None and b.spread is None]


@_rule(
    "expect.baseline",
    f"!has(self.bands) || self.bands.all(b, !has(b.over) || b.over != 'peakPerRank' || b.metric in {_MEMORY_CEL})",
    f"spec.expect.baseline.bands: over peakPerRank gates a memory peak ({', '.join(MEMORY_METRICS)})",
    ".bands",
)
def _peak_of_memory(spec: SpecParts) -> list[Problem]:
    return [Problem(f"spec.expect.baseline.bands[{i}].over", f"peakPerRank gates a memory peak "
                    f"({', '.join(MEMORY_METRICS)}), not {b.metric}")
            for i, b in enumerate(_bands(spec)) if b.over == "peakPerRank" and b.metric not in MEMORY_METRICS]


@_rule(
    "",
    "!has(self.expect) || !has(self.expect.baseline) || !has(self.expect.baseline.history) || "
    "(has(self.results) && has(self.results.claimName) && self.results.claimName != '')",
    "spec.expect.baseline.history: needs spec.results.claimName (the trusted runs are kept on the results claim)",
    ".expect.baseline.history",
)
def _history_on_the_results_claim(spec: SpecParts) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and getattr(b, "history", None) is not None and not spec.results.claim_name:
        return [Problem("spec.expect.baseline.history", "needs spec.results.claimName: the trusted runs it compares "
                        "with are the earlier runs' folders on the results claim (locally, forge-replay run "
                        "--results DIR reads them next to DIR)")]
    return []


@_rule(
    "expect",
    "!has(self.windows) || self.windows.all(w, has(w.atMost) || has(w.atLeast))",
    "spec.expect.windows: each window needs atMost, atLeast or both",
    ".windows",
)
def _window_has_bound(spec: SpecParts) -> list[Problem]:
    return [Problem(f"spec.expect.windows[{i}]", f"the window of {w.metric} checks nothing: set atMost, atLeast or "
                    "both")
            for i, w in enumerate(_windows(spec)) if w.at_most is None and w.at_least is None]


@_rule(
    "expect",
    "!has(self.windows) || self.windows.all(w, !has(w.atMost) || !has(w.atLeast) || w.atLeast <= w.atMost)",
    "spec.expect.windows: atLeast must not be over atMost",
    ".windows",
)
def _window_passable(spec: SpecParts) -> list[Problem]:
    return [Problem(f"spec.expect.windows[{i}].atLeast", f"{w.at_least:g} is over atMost {w.at_most:g}: no value "
                    "can pass")
            for i, w in enumerate(_windows(spec))
            if w.at_most is not None and w.at_least is not None and w.at_least > w.at_most]
