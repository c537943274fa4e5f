"""`forge-replay report compare|baseline|history|untrust`: compare two run reports, turn reports into a baseline
ConfigMap, list the runs of a results root (trusted or not, and why), mark one run untrusted by hand.

The comparison is :mod:`forge_replay.verdict.checks`', the one ``forge-replay run`` and the operator's verdict use;
what a usable report is, :func:`forge_replay.verdict.reports.unusable_reason` says for every caller.
"""

from __future__ import annotations

import sys

import click

from forge_replay.api.metrics import GATED_METRICS, MEASURED_METRICS, MEMORY_METRICS
from forge_replay.api.spec_parts import ROLLOUT_METRICS, BaselineSpec
from forge_replay.verdict.baseline import (
    ANNOTATIONS_LIMIT, CONFIGMAP_LIMIT, KEPT, applied_size, baseline_configmap, baseline_content, name_problems,
    several_runs_problems, to_yaml,
)
from forge_replay.verdict.checks import compare_reports, first_failure
from forge_replay.verdict.compare import fmt, fmt_rel, rollout_differences
from forge_replay.verdict.identity import environment_differences, identity_differences
from forge_replay.verdict.reports import BASELINE_KEY, ReportUnreadable, read_report, unusable_reason
from forge_replay.verdict.statistics import history_content

EXIT_OK, EXIT_DIFFERENT, EXIT_UNUSABLE = 0, 3, 2

_DEFAULTS = BaselineSpec.model_fields


@click.group()
def report() -> None:
    """Compare run reports (report.json), turn them into a baseline ConfigMap for spec.expect.baseline, list the
    trusted history of a results root and mark a run untrusted."""


def tolerances(metrics: tuple[str, ...], rtol: float, atol: float) -> tuple[BaselineSpec | None, list[str]]:
    """The options as spec.expect.baseline's model validates them (finite tolerances >= 0, known metrics, at
    least one): the spec, or the problems, each naming its option."""
    from pydantic import ValidationError

    fields: dict = {"rtol": rtol, "atol": atol}
    if metrics:
        fields["metrics"] = [m.strip() for item in metrics for m in item.split(",") if m.strip()]
    try:
        return BaselineSpec.model_validate(fields), []
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            option = f"--{error['loc'][0]}" if error["loc"] else "options"
            value = fields.get(error["loc"][0]) if error["loc"] else None
            if option == "--metrics" and isinstance(value, list) and len(error["loc"]) > 1:
                value = value[error["loc"][1]]
                message = f"not a per-rollout metric ({', '.join(ROLLOUT_METRICS)})"
            elif option == "--metrics" and not value:
                message = "names no metric (give at least one, or leave --metrics out for the default)"
            else:
                message = error["msg"]
            problems.append(f"{option} {value!r}: {message}")
        return None, problems


@report.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--metrics", multiple=True, metavar="NAME[,NAME]",
              help=f"Per-rollout metrics to compare (default {','.join(_DEFAULTS['metrics'].default_factory())}); "
              f"any of {', '.join(ROLLOUT_METRICS)}.")
@click.option("--rtol", type=float, default=_DEFAULTS["rtol"].default, show_default=True,
              help="Relative tolerance: |A - B| <= atol + rtol * |B| (finite, >= 0).")
@click.option("--atol", type=float, default=_DEFAULTS["atol"].default, show_default=True,
              help="Absolute tolerance (finite, >= 0).")
@click.option("--allow-different", is_flag=True,
              help="Compare even when A and B replayed another mode or model (warned, not failed).")
def compare(a: str, b: str, metrics: tuple[str, ...], rtol: float, atol: float, allow_different: bool) -> None:
    """Compare report A (a run) with report B (its baseline) rollout by rollout.

    Prints each rollout's metrics in both, their difference and relative difference, and warns when the two
    recorded another job, dumps, trainer settings, seed, versions, device, world size, thread settings or
    deterministic settings. Exit status: 0 every rollout of A is within the tolerances of B; 3 one is not, B has
    no entry for it, or A and B replayed another mode or model (without --allow-different); 2 a report cannot be
    read or is not usable (a run that did not finish, stopped early, has non-finite values, failed its own
    expectations or names no job), or an option is bad.
    """
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    spec, problems = tolerances(metrics, rtol, atol)
    docs = []
    for side, path in (("A", a), ("B", b)):
        try:
            docs.append(read_report(path))
        except ReportUnreadable as exc:
            problems.append(f"{side}: {exc}")
            continue
        why = unusable_reason(docs[-1])
        if why:
            problems.append(f"{side}: {path}: not usable for a comparison: {why}")
    if problems:
        for line in problems:
            err(line)
        sys.exit(EXIT_UNUSABLE)
    run, base = docs
    names, rtol, atol = list(spec.metrics), spec.rtol, spec.atol
    blocking, warnings = identity_differences(run, base)
    for line in (blocking if allow_different else []) + warnings + environment_differences(run, base):
        err(f"warning: {line}")
    from rich.console import Console

    Console().print(_table(a, b, run, base, names, rtol, atol))
    extra = sorted({r["rollout_id"] for r in base["rollouts"]} - {r["rollout_id"] for r in run["rollouts"]})
    if extra:
        click.echo(f"{b} also holds rollouts {extra}, which {a} did not replay (not compared)")
    if blocking and not allow_different:
        err(f"{a} and {b} are not runs of one job: {'; '.join(blocking)} (--allow-different compares anyway)")
        sys.exit(EXIT_DIFFERENT)
    miss = first_failure(compare_reports(run, base, names, rtol, atol))
    if miss is None:
        click.echo(f"{a} matches {b}: {', '.join(names)} within rtol {rtol:g} / atol {atol:g} "
                   f"on all {len(run['rollouts'])} rollouts")
        return
    err(f"{a} differs from {b}: {miss.name}: {miss.message}")
    sys.exit(EXIT_DIFFERENT)


def _table(a: str, b: str, run: dict, base: dict, names: list[str], rtol: float, atol: float):
    """One row per rollout and metric: A, B, |A - B|, |A - B| / |B|, and whether it is within the tolerances."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"A {a}\nB {b}", show_edge=False)
    for column in ("rollout", "metric", "A", "B", "|A-B|", "rel"):
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    table.add_column("")
    for d in rollout_differences(run, base, names, rtol, atol):
        table.add_row(str(d.rollout), d.metric, fmt(d.observed), fmt(d.baseline), fmt(d.abs_diff),
                      fmt_rel(d.rel_diff), Text("ok", style="green") if d.within else Text("DIFFERS", style="bold red"))
    return table


@report.command()
@click.argument("report_files", metavar="REPORT.json...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="The ConfigMap's name (spec.expect.baseline.configMapName).")
@click.option("--namespace", default=None, help="Its namespace (default: none written, kubectl's or Argo CD's).")
@click.option("--statistics", is_flag=True,
              help="Write the per-rollout statistics, step times and memory peaks of a several-run baseline even for "
              "one report (a band of spec.expect.baseline.bands on memory or step time needs them).")
def baseline(report_files: tuple[str, ...], name: str, namespace: str | None, statistics: bool) -> None:
    """Print a ConfigMap holding what a comparison needs of REPORT.json (data key report.json: its verdict fields,
    identity, environment and per-rollout metrics), ready to commit to Git.

    Several reports of one identity (the replayed data, model and the settings that change the numbers; the job's
    name does not count) make one baseline of their statistics: per rollout and metric (step times and memory
    too) the runs' mean, min, max, spread and count, and per rank the runs' memory peaks, which the bands of
    spec.expect.baseline read. One report (without --statistics) makes the one-run baseline.

    Refused (exit 2), naming the file: a report that cannot be read or is not usable (a run that did not finish,
    stopped early, has non-finite values, failed its own expectations or names no job), a run of another identity
    or given twice, a name or namespace the API server refuses, or a baseline over the 1 MiB a ConfigMap holds
    (put the report on a PVC and use spec.expect.baseline.claimName + path). One over 256 KiB is printed with a
    warning: apply it server-side.
    """
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    problems = name_problems(name, namespace)
    docs = []
    for path in report_files:
        try:
            docs.append((path, read_report(path)))
        except ReportUnreadable as exc:
            problems.append(str(exc))
    problems += several_runs_problems(docs)
    if problems:
        for line in problems:
            err(line)
        sys.exit(EXIT_UNUSABLE)
    if len(docs) == 1 and not statistics:
        content = baseline_content(docs[0][1], ROLLOUT_METRICS)
    else:
        content = history_content([doc for _, doc in docs], GATED_METRICS, MEMORY_METRICS, KEPT, MEASURED_METRICS)
    configmap = baseline_configmap(content, name, namespace)
    size = len(configmap["data"][BASELINE_KEY].encode("utf-8"))
    what = ", ".join(report_files)
    if size > CONFIGMAP_LIMIT - 4096:
        err(f"{what}: its baseline is {size} bytes, more than a ConfigMap holds (1 MiB); copy the report to a "
            "PVC and use spec.expect.baseline.claimName + path")
        sys.exit(EXIT_UNUSABLE)
    if applied_size(configmap) > ANNOTATIONS_LIMIT - 4096:
        err(f"warning: {name}: {applied_size(configmap)} bytes, over what client-side `kubectl apply` can record in "
            "its last-applied annotation (256 KiB): apply it server-side (kubectl apply --server-side; Argo CD "
            "ServerSideApply=true; Flux always does)")
    click.echo(to_yaml(configmap), nl=False)


@report.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
def history(directory: str) -> None:
    """List the runs under DIR, a results root (a copy of the results claim: <namespace>/<job>/<run>/report.json, or
    a folder of run folders), oldest first: each run's folder, job, identity key (runs with one key are runs of one
    identity; the job's name and gradient checkpointing do not count; a line per key says what it replays), when it
    started, its key figures (rollouts, last loss, peak memory, mean step time) and whether it is trusted, or why
    not.

    A run is trusted when it met its expectations (enforced or in shadow) and no untrusted.json marks it
    (forge-replay report untrust); spec.expect.baseline.history compares a run with the last N trusted runs of its
    identity. Exit status: 0, or 2 when DIR cannot be read.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from forge_replay.verdict.history import history_rows, read_runs

    try:
        runs = read_runs(directory)
    except OSError as exc:
        click.echo(f"{directory}: cannot be read: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_UNUSABLE)
    if not runs:
        click.echo(f"{directory}: no run folder (a folder holding report.json) under it")
        return
    table = Table(title=f"runs under {directory}, oldest first", show_edge=False)
    for column in ("run", "job", "identity", "started", "rollouts", "last loss", "peak GiB", "step s", "trusted"):
        table.add_column(column, justify="right" if column in ("rollouts", "last loss", "peak GiB", "step s")
                         else "left", overflow="fold", no_wrap=column in ("identity", "started"))
    rows = history_rows(runs)
    for row in rows:
        trusted = Text("yes", style="green") if row["trusted"] else Text(f"NO: {row['why']}", style="bold red")
        table.add_row(row["run"], str(row["job"]), row["identity"], str(row["started_at"]), str(row["rollouts"]),
                      *(f"{v:.4g}" if v is not None else "-" for v in (row["loss"], row["peak_gib"],
                                                                       row["step_seconds"])), trusted)
    Console(width=max(160, Console().width)).print(table)
    for key, replays in sorted({(r["identity"], r["replays"]) for r in rows}):
        click.echo(f"identity {key}: {replays}")
    trusted_runs = sum(r.trusted for r in runs)
    click.echo(f"{len(runs)} run(s), {trusted_runs} trusted, {len(runs) - trusted_runs} not")


@report.command()
@click.argument("run", metavar="RUN", type=click.Path())
@click.option("--why", required=True, help="Why the run must never be a reference (kept in the marker).")
@click.option("--by", default=None, help="Who marks it (default: this user).")
def untrust(run: str, why: str, by: str | None) -> None:
    """Mark the run in folder RUN (or its report.json) untrusted by hand: it stays listed by `report history`, and is
    never a reference of spec.expect.baseline.history. Writes RUN/untrusted.json (who, when, why); report.json is
    never changed. Delete untrusted.json to trust the run again. Exit status: 0, or 2 when RUN holds no report.json or
    cannot be written.
    """
    import getpass
    import json
    from pathlib import Path

    from forge_replay.dumps.writing import now_rfc3339, write_atomically
    from forge_replay.verdict.history import REPORT_FILE, UNTRUSTED_FILE, read_marker, untrust_marker

    folder = Path(run)
    if folder.name == REPORT_FILE and folder.is_file():
        folder = folder.parent
    if not (folder / REPORT_FILE).is_file():
        click.echo(f"{run}: not a run folder (it holds no {REPORT_FILE})", err=True)
        sys.exit(EXIT_UNUSABLE)
    if not why.strip():
        click.echo("--why: say why the run must not be trusted", err=True)
        sys.exit(EXIT_UNUSABLE)
    before = read_marker(folder)
    try:
        who = by or getpass.getuser()
    except (KeyError, OSError):
        who = "unknown"
    marker = untrust_marker(who, now_rfc3339(), why.strip())
    try:
        write_atomically(folder / UNTRUSTED_FILE, json.dumps(marker, indent=1) + "\n")
    except OSError as exc:
        click.echo(f"{folder / UNTRUSTED_FILE}: cannot be written: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_UNUSABLE)
    again = f" (it was already, by {before.get('by')} at {before.get('at')}: replaced)" if before else ""
    click.echo(f"{folder}: marked untrusted by {who}{again}; it is never a reference of spec.expect.baseline.history")
