"""The runtime's side of the verdict (issue 17): what the run records for a baseline comparison, the
deterministic settings of debug mode, and the checks of ``spec.expect`` once the run has ended.

The decisions are :mod:`forge_replay.expect`'s pure functions; this module gathers their inputs (versions, the
baseline file) and prints the verdict table.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata

from forge_replay.expect import BaselineUnreadable, Check, check_report, environment_differences, read_report

log = logging.getLogger(__name__)

CUBLAS_WORKSPACE = ":4096:8"
"""CUBLAS_WORKSPACE_CONFIG that makes cuBLAS deterministic (torch's reproducibility notes, CUDA >= 10.2)."""


def make_deterministic(use_gpu: bool, warn_only: bool = True) -> dict:
    """Turn on torch's deterministic settings in this process (a trainer rank, before its first CUDA call) and
    say which were on. ``warn_only``: an op without a deterministic implementation warns instead of failing."""
    import torch

    on: dict = {"use_deterministic_algorithms": True, "warn_only": warn_only}
    if use_gpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        on["cublas_workspace_config"] = os.environ["CUBLAS_WORKSPACE_CONFIG"]
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        on["cudnn_deterministic"] = True
        on["cudnn_benchmark"] = False
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    on["use_deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    on["warn_only"] = torch.is_deterministic_algorithms_warn_only_enabled()
    return on


def environment(seed: int, device: str, world_size: int, deterministic: dict | None) -> dict:
    """report.json's ``environment``: what a baseline comparison needs to be meaningful."""
    from forge_replay import __version__

    return {
        "seed": seed,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "forge_replay": __version__,
        "device": device,
        "world_size": world_size,
        "deterministic": deterministic or {},
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def baseline_problem(path: str | None, spec) -> str | None:
    """Why the baseline of ``spec.expect`` cannot be used at ``path`` (checked before Ray starts), or None."""
    if spec.expect is None or spec.expect.baseline is None:
        return "given a baseline, but the job has no spec.expect.baseline (metrics, rtol, atol)" if path else None
    if path is None:
        b = spec.expect.baseline
        where = f"ConfigMap {b.config_map_name}" if b.config_map_name else f"{b.path} on PVC {b.claim_name}"
        return f"spec.expect.baseline names {where}: pass --baseline FILE with that report.json"
    try:
        read_report(path)
    except BaselineUnreadable as exc:
        return f"baseline {exc}"
    return None


def unusable_baseline(spec, baseline_path: str | None) -> list[dict] | None:
    """In a cluster, before Ray: the failed baseline checks when the mounted baseline (a PVC path the operator
    cannot read ahead) cannot be used, so the run stops before it trains; None when it can (or there is none)."""
    if spec.expect is None or spec.expect.baseline is None:
        return None
    problem = baseline_problem(baseline_path, spec)
    if problem is None:
        return None
    from forge_replay.api.models import ExpectSpec

    return [c.to_dict() for c in check_report({}, ExpectSpec(baseline=spec.expect.baseline), None, problem)]


def verdict(report: dict, spec, baseline_path: str | None) -> list[Check]:
    """The checks of ``spec.expect`` on a finished run's report; a baseline that cannot be read fails its checks."""
    expect = spec.expect
    baseline = problem = None
    if expect is not None and expect.baseline is not None:
        if baseline_path is None:
            problem = "no baseline report was given to the runtime"
        else:
            try:
                baseline = read_report(baseline_path)
            except BaselineUnreadable as exc:
                problem = str(exc)
        if baseline is not None:
            for line in environment_differences(report, baseline):
                log.warning("baseline %s: %s (differences may come from this alone)", baseline_path, line)
    return check_report(report, expect, baseline, problem)


def unmet(report) -> str | None:
    """One line naming the first failed expectation of a finished run's report (``RunReport``), or None when every
    expectation was met (or none was asked for): the CLI exits 3 and the in-cluster runtime fails on it."""
    failed = [c for c in report.expectations or [] if not c["passed"]]
    if not failed:
        return None
    first = failed[0]
    return (f"{len(failed)} of {len(report.expectations)} expectation(s) not met; first: {first['name']}: "
            f"{first['message']}")


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
            c["name"], _cell(c.get("observed")), _cell(c.get("limit")),
            Text("passed", style="green") if c["passed"] else Text(f"FAILED: {c['message']}", style="bold red"),
        )
    return table


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)
