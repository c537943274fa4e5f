"""Prometheus metrics of the operator (served on --metrics-port, scraped at /metrics)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

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


def count_request(verb: str, resource: str) -> None:
    """Kube client hook: one API request sent."""
    API_REQUESTS.labels(verb=verb, resource=resource).inc()


def serve(port: int) -> None:
    """Start the /metrics HTTP endpoint in a background thread."""
    start_http_server(port)
