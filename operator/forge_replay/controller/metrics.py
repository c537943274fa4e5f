"""Prometheus metrics of the operator (served on --metrics-port, scraped at /metrics): its own (reconciles, errors,
jobs by phase, time to launch) and one set per job (``JOB_METRICS``, labelled namespace and name: never per rank or
step), removed when the job is deleted."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, get_args

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from forge_replay.api.outcome import Outcome
from forge_replay.api.status import PHASES

RECONCILES = Counter(
    "forge_replay_operator_reconciles_total", "Reconciles of ForgeReplayJobs, by what triggered them.", ["trigger"]
)
ERRORS = Counter(
    "forge_replay_operator_reconcile_errors_total", "Reconciles that raised, by error class.", ["error"]
)
JOBS = Gauge("forge_replay_operator_jobs", "ForgeReplayJobs seen by this operator, by phase.", ["phase"])
TIME_TO_LAUNCH = Histogram(
    "forge_replay_operator_time_to_launch_seconds",
    "From the ForgeReplayJob's creation to its RayJob's creation.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
API_REQUESTS = Counter(
    "forge_replay_operator_api_requests_total",
    "Kubernetes API requests sent by the reconcile function (kopf's own watches not included).",
    ["verb", "resource"],
)


class PhaseBook:
    """Phase of every job this process has seen; feeds the jobs-by-phase gauge."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            JOBS.labels(phase=phase).set(0)

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self._phases.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = phase
            counts = {p: 0 for p in PHASES}
            for value in self._phases.values():
                counts[value] = counts.get(value, 0) + 1
            for phase_name, count in counts.items():
                JOBS.labels(phase=phase_name).set(count)


JOB_LABELS = ("namespace", "name")
OUTCOMES: tuple[str, ...] = get_args(Outcome)
GIB = 2**30

JOB_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "forge_replay_job_phase": ("1 for the job's phase, 0 for the others.", ("phase",)),
    "forge_replay_job_rollouts_done": ("Rollouts trained, as the runtime last published them.", ()),
    "forge_replay_job_rollouts_planned": ("Rollouts the job trains (status.rollouts.total).", ()),
    "forge_replay_job_peak_memory_bytes": (
        "The job's memory peak over all ranks and steps: CUDA memory allocated on GPUs (source cuda), the trainer "
        "process's resident set on CPU (source rss).", ("source",)),
    "forge_replay_job_outcome": (
        "Once the run ended: 1 for its outcome (fits, overBudget, outOfMemory, failed), 0 for the others.",
        ("outcome",)),
    "forge_replay_job_expectations_met": (
        "With spec.expect, once checked: 1 when every expectation is met, 0 when one is not.", ()),
    "forge_replay_job_admission_wait_seconds": (
        "From the job's creation to its admission (status.admissionTime: Kueue admitted its RayJob; without a "
        "queue, its RayJob was created).", ()),
    "forge_replay_job_first_step_seconds": (
        "From the job's admission to the first rollout trained (status.firstStepTime).", ()),
}
"""Every per-job metric: name -> (help, labels beyond namespace and name). The chart's Grafana dashboard names only
these and the operator's own (tests/unit/test_job_metrics.py)."""


def job_samples(status: dict[str, Any], created: str | None) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The per-job samples of one job's status (camelCase, as written): metric -> [(extra label values, value)].
    ``created`` is the job's metadata.creationTimestamp. A figure the status does not hold yet has no sample."""
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name in JOB_METRICS}
    phase = status.get("phase")
    if phase:
        out["forge_replay_job_phase"] = [((p,), 1.0 if p == phase else 0.0) for p in PHASES]
    rollouts = status.get("rollouts") or {}
    if rollouts:
        out["forge_replay_job_rollouts_done"] = [((), float(rollouts.get("completed") or 0))]
        out["forge_replay_job_rollouts_planned"] = [((), float(rollouts.get("total") or 0))]
    memory = status.get("memory") or {}
    peak = memory.get("peakAllocatedGiB") if memory.get("peakAllocatedGiB") is not None else memory.get("peakRssGiB")
    if peak is not None:
        source = memory.get("source") or ("cuda" if memory.get("peakAllocatedGiB") is not None else "rss")
        out["forge_replay_job_peak_memory_bytes"] = [((source,), float(peak) * GIB)]
    if status.get("outcome"):
        out["forge_replay_job_outcome"] = [((o,), 1.0 if o == status["outcome"] else 0.0) for o in OUTCOMES]
    met = next((c for c in status.get("conditions") or [] if c.get("type") == "ExpectationsMet"), {})
    if met.get("status") in ("True", "False"):
        out["forge_replay_job_expectations_met"] = [((), 1.0 if met["status"] == "True" else 0.0)]
    admitted, first = _time(status.get("admissionTime")), _time(status.get("firstStepTime"))
    if admitted is not None and _time(created) is not None:
        out["forge_replay_job_admission_wait_seconds"] = [((), max(0.0, (admitted - _time(created)).total_seconds()))]
    if first is not None and (admitted or _time(created)) is not None:
        since = admitted or _time(created)
        out["forge_replay_job_first_step_seconds"] = [((), max(0.0, (first - since).total_seconds()))]
    return out


class JobBook:
    """The per-job samples of every job this process has seen, served by ``collect`` (a prometheus_client
    collector): a job's series go with it when it is forgotten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], dict[str, list[tuple[tuple[str, ...], float]]]] = {}

    def set(self, namespace: str, name: str, status: dict[str, Any] | None, created: str | None = None) -> None:
        """Record the job's status (None: the job is gone, its series are removed)."""
        with self._lock:
            if status is None:
                self._jobs.pop((namespace, name), None)
            else:
                self._jobs[(namespace, name)] = job_samples(status, created)

    def known(self, namespaces: tuple[str, ...] = ()) -> set[tuple[str, str]]:
        """The (namespace, name) of every job with series, in ``namespaces`` (all when empty)."""
        with self._lock:
            return {key for key in self._jobs if not namespaces or key[0] in namespaces}

    def collect(self):
        """One gauge family per metric of JOB_METRICS, a sample per job (and extra label value)."""
        with self._lock:
            jobs = dict(self._jobs)
        for metric, (text, extra) in JOB_METRICS.items():
            family = GaugeMetricFamily(metric, text, labels=[*JOB_LABELS, *extra])
            for (namespace, name), samples in sorted(jobs.items()):
                for values, value in samples[metric]:
                    family.add_metric([namespace, name, *values], value)
            yield family


JOBS_BOOK = JobBook()
REGISTRY.register(JOBS_BOOK)


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def count_request(verb: str, resource: str) -> None:
    """Kube client hook: one API request sent."""
    API_REQUESTS.labels(verb=verb, resource=resource).inc()


def serve(port: int) -> None:
    """Start the /metrics HTTP endpoint in a background thread."""
    start_http_server(port)
