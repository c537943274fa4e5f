"""Progress publishing: always to the results dir; a ConfigMap failure is logged, never fatal."""

from __future__ import annotations

import json
import logging

from forge_replay.api import MemoryPeak
from forge_replay.api.progress_report import ProgressReport
from forge_replay.runtime.progress_publish import ProgressPublisher


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


def _config(results_dir):
    from forge_replay.api import parse_job
    from forge_replay.api.runtime_config import RuntimeConfig
    from tests.unit.spec_factory import debug_job

    return RuntimeConfig(job=parse_job(debug_job()), results_dir=str(results_dir), progress_configmap=None)


def test_the_result_is_recorded_on_top_of_the_last_progress(tmp_path):
    ProgressPublisher(str(tmp_path)).publish(ProgressReport(completed=3, total=4, fallbacks=1))
    from forge_replay.runtime.progress_publish import record_result

    record_result(_config(tmp_path), "Failed", "rollout 3: run/rollout_3.pt: missing")
    report = ProgressReport.model_validate_json((tmp_path / "progress.json").read_text())
    assert (report.completed, report.total, report.fallbacks) == (3, 4, 1)
    assert report.result.phase == "Failed" and "rollout_3.pt" in report.result.message
    assert report.result.finished_at.endswith("Z")


def test_the_result_is_recorded_even_without_earlier_progress(tmp_path):
    from forge_replay.runtime.progress_publish import record_result

    record_result(_config(tmp_path / "fresh"), "Succeeded")
    report = ProgressReport.model_validate_json((tmp_path / "fresh" / "progress.json").read_text())
    assert report.result.phase == "Succeeded" and report.completed == 0 and report.total >= 1


def test_progress_names_what_the_memory_figure_measures(tmp_path):
    # On CPU the peak is RSS: progress.json (and so the status) said peakAllocatedGiB.
    from tests.unit.test_report import make_report

    from forge_replay.runtime.report import memory_peak, progress_memory

    publisher = ProgressPublisher(str(tmp_path))
    publisher.publish(ProgressReport(completed=3, total=3, memory=progress_memory(memory_peak(make_report().rollouts))))
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["memory"] == {"source": "rss", "peakRssGiB": 4.0, "rank": 0, "device": "cpu"}
    gpu = progress_memory(memory_peak(make_report(on_gpu=True).rollouts)).model_dump(by_alias=True, exclude_none=True)
    assert {k: v for k, v in gpu.items() if k != "device"} == {
        "source": "cuda", "peakAllocatedGiB": 4.0, "peakReservedGiB": 5.0, "rank": 0}
    assert gpu["device"].startswith("cuda")
    assert progress_memory(None) is None
