"""Per-job metrics (issue 33): labelled per job (namespace, name; never per rank or step), removed with the job, and
the chart's Grafana dashboard, whose every query parses (promql-parser, the Rust PromQL parser's Python binding) and
names only metrics the operator exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from forge_replay.controller import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "forge-replay-operator" / "files" / "grafana" / "forge-replay-jobs.json"

RUNNING = {
    "phase": "Running", "rollouts": {"completed": 3, "total": 8},
    "memory": {"source": "cuda", "peakAllocatedGiB": 71.5, "peakReservedGiB": 75.0, "rank": 3},
    "admissionTime": "2026-12-02T12:01:00Z", "firstStepTime": "2026-12-02T12:04:30Z",
    "conditions": [{"type": "Ready", "status": "False", "reason": "Running"}],
}
ENDED = {
    "phase": "Failed", "rollouts": {"completed": 2, "total": 4}, "outcome": "outOfMemory",
    "memory": {"source": "rss", "peakRssGiB": 3.25},
    "conditions": [{"type": "ExpectationsMet", "status": "False", "reason": "ExpectationsNotMet"}],
}
CREATED = "2026-12-02T12:00:00Z"

LABELS = [
    # (status, metric, {extra label values: value})
    (RUNNING, "forge_replay_job_phase", {("Running",): 1.0, ("Pending",): 0.0, ("Failed",): 0.0}),
    (RUNNING, "forge_replay_job_rollouts_done", {(): 3.0}),
    (RUNNING, "forge_replay_job_rollouts_planned", {(): 8.0}),
    (RUNNING, "forge_replay_job_peak_memory_bytes", {("cuda",): 71.5 * 2**30}),
    (RUNNING, "forge_replay_job_outcome", {}),  # none while it runs
    (RUNNING, "forge_replay_job_expectations_met", {}),  # no spec.expect
    (RUNNING, "forge_replay_job_admission_wait_seconds", {(): 60.0}),
    (RUNNING, "forge_replay_job_first_step_seconds", {(): 210.0}),
    (ENDED, "forge_replay_job_outcome", {("outOfMemory",): 1.0, ("fits",): 0.0, ("failed",): 0.0}),
    (ENDED, "forge_replay_job_expectations_met", {(): 0.0}),
    (ENDED, "forge_replay_job_peak_memory_bytes", {("rss",): 3.25 * 2**30}),
    (ENDED, "forge_replay_job_admission_wait_seconds", {}),  # never admitted (or before the field existed)
    ({"phase": "Pending"}, "forge_replay_job_rollouts_done", {}),
]


@pytest.mark.parametrize(("status", "metric", "wanted"), LABELS, ids=[f"{s['phase']}-{m}" for s, m, _ in LABELS])
def test_each_metric_of_a_status_with_its_labels(status, metric, wanted) -> None:
    samples = dict(metrics.job_samples(status, CREATED)[metric])
    for values, value in wanted.items():
        assert samples[values] == pytest.approx(value), (metric, values)
    if not wanted:
        assert samples == {}
    _, extra = metrics.JOB_METRICS[metric]
    assert all(len(values) == len(extra) for values in samples)


def test_series_are_per_job_and_go_when_the_job_is_forgotten() -> None:
    book = metrics.JOBS_BOOK
    book.set("team-a", "memtest", RUNNING, CREATED)
    book.set("team-b", "release", ENDED, CREATED)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(REGISTRY).decode())}
    for name, (_, extra) in metrics.JOB_METRICS.items():
        for sample in families[name].samples:
            assert set(sample.labels) == {"namespace", "name", *extra}, sample  # never a rank or a step
    ours = [s for s in families["forge_replay_job_rollouts_done"].samples if s.labels["namespace"] == "team-a"]
    assert [(s.labels["name"], s.value) for s in ours] == [("memtest", 3.0)]

    from forge_replay.controller.reconcile import Reconciler
    from forge_replay.controller.settings import OperatorSettings

    # kopf's DELETED event (handlers.on_job_event) and the resync's list of a job gone both forget it
    Reconciler(kube=None, settings=OperatorSettings()).forget("team-a", "memtest")  # type: ignore[arg-type]
    text = generate_latest(REGISTRY).decode()
    assert 'namespace="team-a"' not in text and 'namespace="team-b"' in text
    book.set("team-b", "release", None)


def exported_names() -> set[str]:
    """The series names this process's registry exports, by metric type (a counter's _total, a histogram's
    _bucket / _sum / _count)."""
    names = set(metrics.JOB_METRICS)
    for family in REGISTRY.collect():
        if not family.name.startswith("forge_replay_"):
            continue
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def selectors(node) -> list[str]:
    """Every metric name a parsed PromQL expression selects."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        return [node.name]
    found = []
    for attribute in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (str, int, float)):
            found += selectors(child)
    for arg in getattr(node, "args", None) or []:
        found += selectors(arg)
    return found


def test_every_dashboard_query_parses_and_names_only_exported_metrics() -> None:
    promql = pytest.importorskip("promql_parser", reason="promql-parser (dev extra) parses the dashboard's PromQL")
    import forge_replay.controller.reconcile  # noqa: F401  (every metric of the operator registered)

    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    used = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            try:
                tree = promql.parse(target["expr"])
            except Exception as error:  # the parser's own message names the position
                raise AssertionError(f"panel {panel['title']!r}: {target['expr']!r} does not parse: {error}") from None
            names = selectors(tree)
            assert names, target["expr"]
            assert set(names) <= exported, f"panel {panel['title']!r} names {set(names) - exported}: not exported"
            used |= set(names)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # Grafana's label_values(METRIC, label)
            metric = variable["definition"].split("(", 1)[1].split(",", 1)[0].strip()
            assert metric in exported, variable
    assert set(metrics.JOB_METRICS) <= used, f"not on the dashboard: {set(metrics.JOB_METRICS) - used}"


def test_a_query_naming_an_unknown_metric_is_caught() -> None:
    promql = pytest.importorskip("promql_parser")
    names = selectors(promql.parse('sum by (phase) (forge_replay_job_phases{namespace=~"a"}) / on() vector(1)'))
    assert names == ["forge_replay_job_phases"] and "forge_replay_job_phases" not in exported_names()
    with pytest.raises(Exception):
        promql.parse("sum by (phase (forge_replay_job_phase)")
