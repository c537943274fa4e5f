"""The verdict as a run uses it (``forge-replay run``, the in-cluster runtime): the baseline checked before Ray,
the checks of ``spec.expect`` once the run has ended, the exit decision and the verdict table.

The decisions are :mod:`forge_replay.verdict.checks`' pure functions; this module reads the baseline file and
formats.
"""

from __future__ import annotations

import logging

from forge_replay.verdict.checks import Check, check_report, unmet_line
from forge_replay.verdict.compare import fmt
from forge_replay.verdict.identity import another_job, environment_differences, identity_differences, identity_of
from forge_replay.verdict.reports import ReportUnreadable, read_usable

log = logging.getLogger(__name__)


def baseline_problem(path: str | None, spec) -> str | None:
    """Why the baseline of ``spec.expect`` cannot be used at ``path`` (checked before Ray starts: unreadable, not
    usable, or of another mode or model unless allowed), or None."""
    if spec.expect is None or spec.expect.baseline is None:
        return "given a baseline, but the job has no spec.expect.baseline (metrics, rtol, atol)" if path else None
    if getattr(spec.expect.baseline, "history", None) is not None:
        return ("given a baseline, but spec.expect.baseline.history compares with the trusted runs next to the "
                "results folder (leave --baseline out)") if path else None
    if path is None:
        b = spec.expect.baseline
        where = f"ConfigMap {b.config_map_name}" if b.config_map_name else f"{b.path} on PVC {b.claim_name}"
        return f"spec.expect.baseline names {where}: pass --baseline FILE with that report.json"
    try:
        baseline = read_usable(path)
    except ReportUnreadable as exc:
        return f"baseline {exc}"
    other = another_job({"identity": identity_of("", spec)}, baseline, spec.expect.baseline.allow_different)
    return f"baseline {path} is of another job: {other}" if other else None  # it would fail baseline.identity


def unusable_baseline(spec, baseline_path: str | None) -> list[dict] | None:
    """In a cluster, before Ray: the failed baseline checks when the mounted baseline (a PVC path the operator
    cannot read ahead) cannot be used, so the run stops before it trains; None when it can (or there is none)."""
    if spec.expect is None or spec.expect.baseline is None:
        return None
    problem = baseline_problem(baseline_path, spec)
    if problem is None:
        return None
    from forge_replay.api.spec_parts import ExpectSpec

    return [c.to_dict() for c in check_report({}, ExpectSpec(baseline=spec.expect.baseline), None, problem,
                                              records_losses=False)]


def verdict(report: dict, spec, baseline_path: str | None, history_root: str | None = None,
            results_dir: str | None = None) -> tuple[list[Check], list[str]]:
    """The checks of ``spec.expect`` on a finished run's report, and the warnings that go with them (a baseline
    of another environment or identity). A baseline that cannot be used fails its checks.

    With spec.expect.baseline.history the baseline is the last N trusted runs of the report's identity under
    ``history_root`` (the results root; ``results_dir``, the run's own folder, is not one of them):
    :func:`forge_replay.verdict.history.history_baseline`."""
    expect = spec.expect
    baseline = problem = history = None
    warnings: list[str] = []
    if expect is not None and expect.baseline is not None and getattr(expect.baseline, "history", None) is not None:
        if history_root is None:
            problem = "no results root holding the history was given to the runtime (spec.results.claimName)"
        else:
            from forge_replay.verdict.history import history_baseline

            found = history_baseline(report, history_root, expect.baseline.history.last, results_dir)
            baseline, problem, history = found.baseline, found.problem, found.check
    elif expect is not None and expect.baseline is not None:
        if baseline_path is None:
            problem = "no baseline report was given to the runtime"
        else:
            try:
                baseline = read_usable(baseline_path)
            except ReportUnreadable as exc:
                problem = str(exc)
        if baseline is not None:
            blocking, different = identity_differences(report, baseline)
            warnings = [f"baseline {baseline_path}: {line} (differences may come from this alone)"
                        for line in (blocking if expect.baseline.allow_different else []) + different
                        + environment_differences(report, baseline)]
            for line in warnings:
                log.warning("%s", line)
    return check_report(report, expect, baseline, problem, history=history), warnings


def unmet(report) -> str | None:
    """One line naming the first failed expectation of a finished run's report (``RunReport``), or None when every
    expectation was met (or none was asked for): the CLI exits 3 and the in-cluster runtime fails on it."""
    return unmet_line(report.expectations)


def render_verdict(checks: list[dict]):
    """A rich table: one row per expectation, after the run's table."""
    from rich.table import Table
    from rich.text import Text

    failed = sum(not c["passed"] for c in checks)
    table = Table(title="expectations: " + ("all met" if not failed else f"{failed} of {len(checks)} NOT met"),
                  show_edge=False)
    for name in ("check", "observed", "limit / baseline", "result"):
        table.add_column(name, justify="left" if name == "check" else "right", no_wrap=name != "result")
    for c in checks:
        table.add_row(
            c["name"], fmt(c.get("observed")), fmt(c.get("limit")),
            Text("passed", style="green") if c["passed"] else Text(f"FAILED: {c['message']}", style="bold red"),
        )
    return table
