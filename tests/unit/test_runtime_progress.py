"""Progress publishing: always to the results dir; a ConfigMap failure is logged, never fatal."""

from __future__ import annotations

import json
import logging

from forge_replay.api.models import MemoryPeak
from forge_replay.api.progress import ProgressReport
from forge_replay.runtime.progress import ProgressPublisher


def test_progress_is_written_as_camel_case_json(tmp_path):
    publisher = ProgressPublisher(str(tmp_path))
    publisher.publish(ProgressReport(completed=2, total=5, fallbacks=1,
                                     memory=MemoryPeak(peak_allocated_gib=1.5, rank=3)))
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["completed"] == 2 and data["total"] == 5 and data["fallbacks"] == 1
    assert data["memory"] == {"peakAllocatedGiB": 1.5, "rank": 3}
    assert data["updatedAt"].endswith("Z")
    assert ProgressReport.model_validate(data).completed == 2  # the operator reads it back with the same model


def test_configmap_failure_is_logged_and_counted_not_raised(tmp_path, caplog):
    # Outside a cluster there is no in-cluster config: the real kubernetes client fails to load it.
    publisher = ProgressPublisher(str(tmp_path), configmap="job-progress", namespace="ns")
    with caplog.at_level(logging.WARNING):
        publisher.publish(ProgressReport(completed=1, total=1))
    assert publisher.failures == 1
    assert "cannot patch ConfigMap ns/job-progress" in caplog.text
    assert json.loads((tmp_path / "progress.json").read_text())["completed"] == 1
