"""`forge-replay report compare|baseline`: compare two run reports, or turn one into a baseline ConfigMap.

The comparison is :mod:`forge_replay.expect`'s, the one ``forge-replay run`` and the operator's verdict use.
"""

from __future__ import annotations

import re
import sys

import click

from forge_replay.api.models import DNS1123_SUBDOMAIN, ROLLOUT_METRICS, BaselineSpec
from forge_replay.expect import (
    BASELINE_KEY, BaselineUnreadable, compare_reports, environment_differences, first_failure, parse_report,
    read_report, rollout_differences,
)

EXIT_OK, EXIT_DIFFERENT, EXIT_UNUSABLE = 0, 3, 2
CONFIGMAP_LIMIT = 1024 * 1024
"""The API server refuses a ConfigMap whose data is over 1 MiB (etcd's object size)."""

_DEFAULTS = BaselineSpec.model_fields


@click.group()
def report() -> None:
    """Compare run reports (report.json) and turn one into a baseline ConfigMap for spec.expect.baseline."""


@report.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--metrics", multiple=True, metavar="NAME[,NAME]",
              help=f"Per-rollout metrics to compare (default {','.join(_DEFAULTS['metrics'].default_factory())}); "
              f"any of {', '.join(ROLLOUT_METRICS)}.")
@click.option("--rtol", type=float, default=_DEFAULTS["rtol"].default, show_default=True,
              help="Relative tolerance: |A - B| <= atol + rtol * |B|.")
@click.option("--atol", type=float, default=_DEFAULTS["atol"].default, show_default=True, help="Absolute tolerance.")
def compare(a: str, b: str, metrics: tuple[str, ...], rtol: float, atol: float) -> None:
    """Compare report A (a run) with report B (its baseline) rollout by rollout.

    Prints each rollout's metrics in both and their difference, and warns when the two recorded a different
    seed, versions, device, world size or deterministic settings. Exit status: 0 every rollout of A is within
    the tolerances of B; 3 one is not, or B has no entry for it; 2 a report cannot be read or an option is bad.
    """
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    names = [m for item in metrics for m in item.split(",") if m] or _DEFAULTS["metrics"].default_factory()
    unknown = [m for m in names if m not in ROLLOUT_METRICS]
    if unknown or rtol < 0 or atol < 0:
        err(f"--metrics {', '.join(unknown)}: not a per-rollout metric ({', '.join(ROLLOUT_METRICS)})" if unknown
            else "--rtol and --atol must not be negative")
        sys.exit(EXIT_UNUSABLE)
    try:
        run, base = read_report(a), read_report(b)
    except BaselineUnreadable as exc:
        err(str(exc))
        sys.exit(EXIT_UNUSABLE)
    for line in environment_differences(run, base):
        err(f"warning: {line}")
    from rich.console import Console

    Console().print(_table(a, b, run, base, names, rtol, atol))
    extra = sorted({r["rollout_id"] for r in base["rollouts"]} - {r["rollout_id"] for r in run["rollouts"]})
    if extra:
        click.echo(f"{b} also holds rollouts {extra}, which {a} did not replay (not compared)")
    checks = compare_reports(run, base, names, rtol, atol)
    miss = first_failure(checks)
    if miss is None:
        click.echo(f"{a} matches {b}: {', '.join(names)} within rtol {rtol:g} / atol {atol:g} "
                   f"on all {len(run['rollouts'])} rollouts")
        return
    err(f"{a} differs from {b}: {miss.name}: {miss.message}")
    sys.exit(EXIT_DIFFERENT)


def _table(a: str, b: str, run: dict, base: dict, names: list[str], rtol: float, atol: float):
    """One row per rollout and metric: A, B, |A - B|, and whether it is within the tolerances."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"A {a}\nB {b}", show_edge=False)
    for column in ("rollout", "metric", "A", "B", "|A-B|"):
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    table.add_column("")
    for d in rollout_differences(run, base, names, rtol, atol):
        table.add_row(str(d.rollout), d.metric, _num(d.observed), _num(d.baseline), _num(d.abs_diff),
                      Text("ok", style="green") if d.within else Text("DIFFERS", style="bold red"))
    return table


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.8g}" if isinstance(value, float) else str(value)


@report.command()
@click.argument("report_file", metavar="REPORT.json", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="The ConfigMap's name (spec.expect.baseline.configMapName).")
@click.option("--namespace", default=None, help="Its namespace (default: none written, kubectl's or Argo CD's).")
def baseline(report_file: str, name: str, namespace: str | None) -> None:
    """Print a ConfigMap holding REPORT.json under the data key report.json, ready to commit to Git.

    Refused (exit 2): a report that cannot be read, one of a run that failed, stopped early or trained nothing,
    a name that is not a DNS-1123 subdomain, or a report over the 1 MiB a ConfigMap holds (put it on a PVC and
    use spec.expect.baseline.claimName + path).
    """
    err = lambda msg: click.echo(msg, err=True)  # noqa: E731
    problem = None
    if not (len(name) <= 253 and re.fullmatch(DNS1123_SUBDOMAIN, name)):
        problem = f"--name {name!r}: not a ConfigMap name (a DNS-1123 subdomain: lowercase letters, digits, '-', '.')"
    try:
        with open(report_file, encoding="utf-8") as fh:
            text = fh.read()
        doc = parse_report(text, report_file)
    except OSError as exc:
        problem = problem or f"{report_file}: cannot be read: {exc.strerror or exc}"
    except BaselineUnreadable as exc:
        problem = problem or str(exc)
    else:
        problem = problem or not_a_baseline(doc, report_file, len(text.encode("utf-8")))
    if problem:
        err(problem)
        sys.exit(EXIT_UNUSABLE)
    click.echo(baseline_configmap(text, doc, name, namespace), nl=False)


def not_a_baseline(doc: dict, where: str, size: int) -> str | None:
    """Why a parsed report is no baseline: a run that failed, stopped early or trained nothing; too large."""
    if doc.get("error") or doc.get("partial") or doc.get("stopped_early"):
        why = doc.get("error") or doc.get("stopped_early") or f"{doc.get('completed')} of {doc.get('planned')} rollouts"
        return f"{where}: the run did not finish ({why}); a baseline is the report of a run that did"
    if not doc["rollouts"]:
        return f"{where}: no rollout was trained; nothing to compare against"
    if size > CONFIGMAP_LIMIT - 4096:
        return (f"{where}: {size} bytes, more than a ConfigMap holds (1 MiB); copy it to a PVC and use "
                "spec.expect.baseline.claimName + path")
    return None


def baseline_configmap(text: str, doc: dict, name: str, namespace: str | None) -> str:
    """The ConfigMap YAML: the report verbatim under BASELINE_KEY, labelled with the job it came from."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    metadata: dict = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/part-of": "forge-replay", "forgereplay.io/baseline": "true"}
    env = doc.get("environment") or {}
    metadata["annotations"] = {
        "forgereplay.io/baseline-of": str(doc.get("job")),
        "forgereplay.io/recorded-at": str(doc.get("started_at")),
        "forgereplay.io/environment": ", ".join(f"{k}={env[k]}" for k in sorted(env) if k != "deterministic"),
    }
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
          "data": {BASELINE_KEY: text if text.endswith("\n") else text + "\n"}}
    return yaml.dump(cm, Dumper=_Dumper, sort_keys=False, width=4096)
