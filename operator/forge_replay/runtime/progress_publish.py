"""Publishing progress where the operator (and a person) can read it.

Every update is written to ``<results_dir>/progress.json`` and, in-cluster, patched into the data
key ``progress.json`` of the ConfigMap ``<job>-progress`` (the runtime's ServiceAccount may only
get/patch that one ConfigMap). A failure to publish is logged and counted, never fatal.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from forge_replay.api.progress_report import PROGRESS_KEY, ProgressReport, RunResult
from forge_replay.dumps.writing import now_rfc3339, write_atomically

log = logging.getLogger(__name__)

SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def progress_json(report: ProgressReport) -> str:
    """The JSON document both the file and the ConfigMap carry (camelCase, like the status)."""
    return json.dumps(report.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)


class ProgressPublisher:
    """Writes each :class:`ProgressReport` to the results dir and, when configured, a ConfigMap."""

    def __init__(self, results_dir: str | None, configmap: str | None = None, namespace: str | None = None):
        self.path = Path(results_dir) / PROGRESS_KEY if results_dir else None
        self.configmap = configmap
        self.namespace = namespace
        self.failures = 0
        self._core = None

    def publish(self, report: ProgressReport) -> None:
        if report.updated_at is None:
            report = report.model_copy(update={"updated_at": now_rfc3339()})
        text = progress_json(report)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self.path, text)
            except OSError as exc:
                self.failures += 1
                log.warning("cannot write progress to %s: %s", self.path, exc)
        if self.configmap:
            try:
                self._patch_configmap(text)
            except Exception as exc:  # noqa: BLE001 - publishing must never stop training
                self.failures += 1
                log.warning(
                    "cannot patch ConfigMap %s/%s with progress (the run continues): %s",
                    self.namespace, self.configmap, exc,
                )

    def image_digests(self) -> dict:
        """The Ray pods' image digests the operator recorded into the progress ConfigMap
        (``forge_replay.api.images``), by role; empty without a ConfigMap (a local run has no image), before the
        operator recorded them, or when it cannot be read (logged: they explain a regression, never gate one)."""
        from forge_replay.api.images import IMAGES_KEY, read_images

        if not self.configmap:
            return {}
        try:
            data = self._client().read_namespaced_config_map(self.configmap, self.namespace).data or {}
        except Exception as exc:  # noqa: BLE001 - like publishing, reading the digests is never fatal
            log.warning("cannot read the image digests from ConfigMap %s/%s: %s", self.namespace, self.configmap, exc)
            return {}
        images = read_images(data.get(IMAGES_KEY))
        if not images:
            log.info("ConfigMap %s/%s holds no image digests (%s): report.json records none",
                     self.namespace, self.configmap, IMAGES_KEY)
        return images

    def _client(self):
        if self._core is None:
            from kubernetes import client, config

            config.load_incluster_config()
            self._core = client.CoreV1Api()
            if self.namespace is None:
                self.namespace = SERVICEACCOUNT_NAMESPACE.read_text().strip()
        return self._core

    def _patch_configmap(self, text: str) -> None:
        self._client().patch_namespaced_config_map(self.configmap, self.namespace, {"data": {PROGRESS_KEY: text}})


def record_result(config, phase: str, message: str = "", expectations: list[dict] | None = None,
                  outcome: str | None = None, out_of_memory: dict | None = None) -> None:
    """Publish how the run ended on top of its last progress report, so the operator can read the outcome
    from the progress ConfigMap after KubeRay deleted the RayJob (never fatal, like every publish).
    ``expectations``: the verdict's checks as report.json holds them (``forge_replay.verdict.checks.Check``);
    ``outcome``: fits, overBudget, outOfMemory or failed; ``out_of_memory``: report.json's record of it."""
    from forge_replay.verdict.checks import Check
    publisher = ProgressPublisher(config.results_dir, config.progress_configmap, config.job.metadata.namespace)
    last = ProgressReport(total=config.job.spec.replay.num_rollouts)
    if publisher.path is not None and publisher.path.exists():
        try:
            last = ProgressReport.model_validate_json(publisher.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("cannot read the last progress from %s (the result is published alone): %s", publisher.path, exc)
    verdict = None if expectations is None else [Check(**c).to_status() for c in expectations]
    result = RunResult(phase=phase, message=message[-4000:], finished_at=now_rfc3339(), expectations=verdict,
                       outcome=outcome, out_of_memory=out_of_memory)
    publisher.publish(last.model_copy(update={"result": result, "updated_at": None}))
