"""A baseline: what a later run is compared with, as a ConfigMap that GitOps can apply.

The ConfigMap holds what a comparison needs and nothing more (:func:`baseline_content`): the run's verdict
fields, identity, environment and per-rollout metrics as columns. A 1000-rollout baseline is about 120 KB, so
client-side ``kubectl apply`` (which copies the object into its last-applied annotation, capped at 256 KiB) and
Argo CD's default sync apply it.
"""

from __future__ import annotations

import json
import re

from forge_replay.verdict.identity import another_job, identity_of
from forge_replay.verdict.reports import BASELINE_KEY, ReportUnreadable, parse_report, unusable_reason, usable_or_raise
from forge_replay.verdict.statistics import identity_problem

CONFIGMAP_LIMIT = 1024 * 1024
"""The API server refuses a ConfigMap whose data is over 1 MiB (etcd's object size)."""
ANNOTATIONS_LIMIT = 262144
"""The API server refuses an object whose annotations together exceed 256 KiB; client-side ``kubectl apply``
copies the whole object into ``kubectl.kubernetes.io/last-applied-configuration``."""
FORMAT = "forge-replay-baseline/v1"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A namespace name (at most 63 characters)."""

KEPT = ("job", "mode", "world_size", "device", "started_at", "partial", "completed", "planned", "error",
        "interrupted", "stopped_early", "identity", "environment")
"""The top-level fields of report.json a baseline keeps (with the rollouts' metrics and a verdict summary)."""


def baseline_content(doc: dict, metrics: tuple[str, ...]) -> dict:
    """A usable report reduced to what a comparison reads: KEPT, the expectations' names and outcome, the
    summary's rollout count and finiteness, and per rollout ``rollout_id`` and ``metrics`` as columns."""
    out = {"format": FORMAT, **{k: doc.get(k) for k in KEPT}}
    out["expectations"] = [{"name": c.get("name"), "passed": c.get("passed")} for c in doc.get("expectations") or []]
    summary = doc.get("summary") or {}
    out["summary"] = {"rollouts": len(doc["rollouts"]), "all_finite": summary.get("all_finite", True)}
    present = [m for m in metrics if any(m in r for r in doc["rollouts"])]
    out["rollouts"] = {name: [r.get(name) for r in doc["rollouts"]] for name in ("rollout_id", *present)}
    return out


def several_runs_problems(docs: list[tuple[str, dict]]) -> list[str]:
    """Why the reports (``(where, parsed report)``) cannot make one baseline, one line each naming its file: a
    report that is no baseline (:func:`not_a_baseline`), a run of another identity than the first usable one
    (:func:`forge_replay.verdict.statistics.identity_problem`: the job's name does not count), or a run given
    twice."""
    problems, first, seen = [], None, {}
    for where, doc in docs:
        why = not_a_baseline(doc, where)
        if why:
            problems.append(why)
            continue
        run = (doc.get("job"), doc.get("started_at"))
        if run in seen:
            problems.append(f"{where}: the same run as {seen[run]} (job {run[0]}, started {run[1]})")
            continue
        seen[run] = where
        if first is None:
            first = (where, doc)
            continue
        other = identity_problem(doc, where, first[1], first[0])
        if other:
            problems.append(other)
    return problems


def baseline_text(content: dict) -> str:
    """The baseline as strict JSON: top-level fields one per line, each rollout column on one line."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v, allow_nan=False, sort_keys=True)}"
             for k, v in content.items() if k != "rollouts"]
    columns = [f"    {json.dumps(k)}: {json.dumps(v, allow_nan=False)}" for k, v in content["rollouts"].items()]
    return "{\n" + ",\n".join(lines + ['  "rollouts": {\n' + ",\n".join(columns) + "\n  }"]) + "\n}\n"


def not_a_baseline(doc: dict, where: str) -> str | None:
    """Why a parsed report is no baseline (:func:`unusable_reason`), naming ``where``; None when it is one."""
    why = unusable_reason(doc)
    return f"{where}: {why}; a baseline is the report of a run that finished and met its expectations" if why else None


def configmap_problem(configmap: dict | None, namespace: str, name: str, spec=None) -> str | None:
    """Why the ConfigMap of spec.expect.baseline (as read from the API server; None when absent) cannot give the
    runtime its baseline: missing, no report.json key, not a report, not usable (:func:`unusable_reason`), or
    (given the job's ``spec``) of another mode or model unless allowed; None when it can. The operator asks this
    before it creates anything."""
    where = f"ConfigMap {namespace}/{name} (spec.expect.baseline.configMapName)"
    if configmap is None:
        return (f"{where} does not exist; create it (forge-replay report baseline REPORT.json --name {name}) "
                "or fix the name")
    text = (configmap.get("data") or {}).get(BASELINE_KEY)
    if not text:
        return f"{where} has no data key {BASELINE_KEY}"
    try:
        doc = usable_or_raise(parse_report(text, f"{where} key {BASELINE_KEY}"), f"{where} key {BASELINE_KEY}")
    except ReportUnreadable as exc:
        return str(exc)
    if spec is None:
        return None
    other = another_job({"identity": identity_of("", spec)}, doc, spec.expect.baseline.allow_different)
    return f"{where} key {BASELINE_KEY} is of another job: {other}" if other else None


def name_problems(name: str, namespace: str | None) -> list[str]:
    """What the API server would refuse in the ConfigMap's name (DNS-1123 subdomain) or namespace (label)."""
    from forge_replay.api.names import DNS1123_SUBDOMAIN

    problems = []
    if not (len(name) <= 253 and re.fullmatch(DNS1123_SUBDOMAIN, name)):
        problems.append(f"--name {name!r}: not a ConfigMap name (a DNS-1123 subdomain: lowercase letters, digits, "
                        "'-', '.')")
    if namespace is not None and not (len(namespace) <= 63 and re.fullmatch(DNS1123_LABEL, namespace)):
        problems.append(f"--namespace {namespace!r}: not a namespace name (a DNS-1123 label: at most 63 lowercase "
                        "letters, digits and '-')")
    return problems


def baseline_configmap(content: dict, name: str, namespace: str | None) -> dict:
    """The ConfigMap: :func:`baseline_text` under BASELINE_KEY, labelled and annotated with the job it came from."""
    metadata: dict = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/part-of": "forge-replay", "forgereplay.io/baseline": "true"}
    env = content.get("environment") or {}
    metadata["annotations"] = {
        "forgereplay.io/baseline-of": str(content.get("job")),
        "forgereplay.io/recorded-at": str(content.get("started_at")),
        "forgereplay.io/environment": ", ".join(f"{k}={env[k]}" for k in sorted(env)
                                                if not isinstance(env[k], (dict, list))),
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {BASELINE_KEY: baseline_text(content)}}


def applied_size(configmap: dict) -> int:
    """The bytes client-side ``kubectl apply`` writes into the last-applied annotation for ``configmap``
    (its compact JSON)."""
    return len(json.dumps(configmap, separators=(",", ":")).encode("utf-8"))


def to_yaml(configmap: dict) -> str:
    """The ConfigMap as YAML, its report a readable block."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(configmap, Dumper=_Dumper, sort_keys=False, width=4096)
