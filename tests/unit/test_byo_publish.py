"""What the entrypoint of a slime / miles job runs after the team's script (backends.publish): the memory probe's
report in report.json, progress.json and the progress ConfigMap, the way the builtin trainer's reaches the status."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.progress_report import PROGRESS_KEY, ProgressReport
from forge_replay.backends import launch, publish
from forge_replay.backends.local import package_root

GOLDEN = Path(__file__).parent / "golden" / "byo"

CUDA_PEAK = {"source": "cuda", "host": "node-1", "pid": 41, "device": "cuda:3", "peak_rss_gib": None,
             "peak_allocated_gib": 61.5, "peak_reserved_gib": 70.25}


def write_probe_files(folder: Path) -> None:
    """What the probe of two trainer processes and one node's GPU sampler leave behind (backends.probe)."""
    folder.mkdir(parents=True)
    (folder / "probe-node-1-41.json").write_text(json.dumps(CUDA_PEAK))
    (folder / "probe-node-1-42.json").write_text(json.dumps({**CUDA_PEAK, "pid": 42, "peak_allocated_gib": 12.0}))
    (folder / "gpus-node-1.json").write_text(json.dumps({"host": "node-1", "source": "nvml",
                                                        "peak_used_gib": {"0": 131.5, "3": 120.0}}))


def test_the_progress_document_is_what_the_operator_reads(tmp_path) -> None:
    """progress.json is parsed by the operator with api.progress_report.ProgressReport: every figure survives, each
    naming its source (cuda for the allocator's peak, nvml for the device-level one)."""
    write_probe_files(tmp_path / "probe")
    assert publish.publish(str(tmp_path), "job", "miles", "train.py", 0, 4, None, None) == []
    assert publish.PROGRESS_KEY == PROGRESS_KEY
    text = (tmp_path / PROGRESS_KEY).read_text()
    report = ProgressReport.model_validate_json(text)
    assert (report.completed, report.total, report.result.phase) == (4, 4, "Succeeded")
    memory = report.memory.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert memory == {"source": "cuda", "peakAllocatedGiB": 61.5, "peakReservedGiB": 70.25, "host": "node-1",
                      "pid": 41, "device": "cuda:3", "processes": 2,
                      "gpus": {"node-1": {"source": "nvml", "peakUsedGiB": {"0": 131.5, "3": 120.0}}}}
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["summary"]["memory_peak"]["peak_allocated_gib"] == 61.5 and written["exit_code"] == 0


def test_nothing_recorded_still_reports_the_outcome(tmp_path) -> None:
    assert publish.publish(str(tmp_path), "job", "slime", "run.py", 1, 3, None, None) == []
    report = ProgressReport.model_validate_json((tmp_path / PROGRESS_KEY).read_text())
    assert report.memory is None and report.completed == 0
    assert (report.result.phase, report.result.message) == ("Failed", "run.py exited with status 1")


def test_an_unreachable_api_server_is_a_problem_not_a_crash(tmp_path) -> None:
    problems = publish.publish(str(tmp_path), "job", "miles", "train.py", 0, 1, "job-progress",
                               ("https://127.0.0.1:9", "token", None, "ns"))
    assert len(problems) == 1 and "ConfigMap ns/job-progress" in problems[0]
    assert (tmp_path / "report.json").is_file()  # written before the patch was tried


@pytest.mark.parametrize("status", [0, 3])
def test_the_entrypoint_line_reports_and_keeps_the_scripts_exit_status(tmp_path, status) -> None:
    """The shell line the RayJob runs, run by a shell: the team's script, then the report, then its status."""
    spec = parse_job(yaml.safe_load((GOLDEN / "miles-debug.in.yaml").read_text())).spec
    workdir, results = tmp_path / "team", tmp_path / "results"
    workdir.mkdir()
    (workdir / spec.trainer.script).write_text(f"import sys\nprint('args', len(sys.argv))\nsys.exit({status})\n")
    write_probe_files(results / "probe")
    line = launch.entrypoint(spec, "/dumps", working_dir=str(workdir), results_dir=str(results), job_name="j")
    env = {**os.environ, "PYTHONPATH": package_root()}
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == status, done.stderr
    assert "memory report written" in done.stderr
    report = json.loads((results / "report.json").read_text())
    assert (report["exit_code"], report["backend"], report["planned"]) == (status, "miles", spec.replay.num_rollouts)
    assert report["summary"]["memory_peak"]["pid"] == 41
    assert (report["error"] is None) == (status == 0)


def test_publish_needs_nothing_but_the_standard_library(tmp_path) -> None:
    """The team's image may lack every dependency of ours (pydantic, kubernetes, ...), torch and numpy included."""
    import sys
    import textwrap

    write_probe_files(tmp_path / "probe")
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = ("pydantic", "yaml", "kopf", "kubernetes", "rich", "click", "torch", "numpy", "ray")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked in a team image: " + name)
        sys.meta_path.insert(0, Block())
        from forge_replay.backends.publish import main
        main(["--results", {str(tmp_path)!r}, "--exit-code", "0", "--backend", "slime", "--total", "2"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["memory_peak"]["processes"] == 2


@pytest.mark.parametrize("budget, phase", [(80.0, "Succeeded"), (64.0, "Failed")])
def test_the_memory_budget_of_a_slime_or_miles_job_is_checked_on_the_probes_peak(tmp_path, budget, phase) -> None:
    """Issue 25: spec.expect.maxPeakMemoryGiB of a foreign trainer is judged by the verdict's own check on the
    probe's peak CUDA reserved (70.25 GiB here); the result the operator reads carries it."""
    write_probe_files(tmp_path / "probe")
    limits = publish.Limits(max_peak_memory_gib=budget)
    assert publish.publish(str(tmp_path), "job", "slime", "train.py", 0, 4, None, None, limits) == []
    written = json.loads((tmp_path / "report.json").read_text())
    [check] = written["expectations"]
    assert (check["name"], check["passed"], check["observed"]) == ("maxPeakMemoryGiB", phase == "Succeeded", 70.25)
    report = ProgressReport.model_validate_json((tmp_path / PROGRESS_KEY).read_text())
    assert (report.result.phase, report.completed) == (phase, 4)
    assert [e.name for e in report.result.expectations] == ["maxPeakMemoryGiB"]
    if phase == "Failed":
        assert report.result.message.startswith("1 of 1 expectation(s) not met; first: maxPeakMemoryGiB")


def test_the_entrypoint_passes_the_memory_budget_to_the_publish_step() -> None:
    doc = yaml.safe_load((GOLDEN / "miles-debug.in.yaml").read_text())
    assert "--max-peak-memory-gib" not in launch.entrypoint(parse_job(doc).spec, "/dumps", results_dir="/r")
    doc["spec"]["expect"] = {"maxPeakMemoryGiB": 130}
    assert "--max-peak-memory-gib 130.0 --exit-code" in launch.entrypoint(parse_job(doc).spec, "/dumps",
                                                                        results_dir="/r")
