"""A slime / miles job that ran out of memory (issue 31): what the memory probe records in every Ray worker
(backends.probe: the memory cgroup's OOM kill baseline, torch's OOM observer) and what the publish step makes of it
and of the job's log (backends.out_of_memory, backends.publish), up to the status the operator writes.

The kernel's kill is real: a process joins a memory cgroup made for the test (cgroup v1 under this process's own,
as root; the test removes it) and outgrows its limit. Ray's memory monitor's error is Ray's own class with the
message Ray 2.60.0's monitor produced on this machine (/tmp/issue31/ray_memmon.out), printed as Python prints a
traceback's last line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.progress_report import PROGRESS_KEY, ProgressReport
from forge_replay.backends import launch, out_of_memory, probe, publish
from forge_replay.backends.local import package_root

GOLDEN = Path(__file__).parent / "golden" / "byo"

# ray.exceptions.OutOfMemoryError's message from Ray 2.60.0's memory monitor (RAY_memory_usage_threshold=0.2 on this
# host; /tmp/issue31/ray_memmon.out), the object store's statistics left out.
RAY_MONITOR_MESSAGE = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
    "4dc47e801b46dfaaa60b38205a63ebdf03e789f5dfee4eae83d51c3d) was 4.73GB used / 23.54GB limit (0.200834)\n"
    "OOM kill reason: Memory usage 5079146496B exceeded threshold of 5055212032B (20.0% of 25276059648B limit)\n"
    "\nRay killed 1 worker(s) based on the killing policy\nConsidered workers: [\nSelected to kill: "
    "(Actor(e7337374e0dd9c240212968e01000000): job ID=01000000, lease ID=0000, task name=Rank.__init__, required "
    "resources={}, pid=10883, actual memory used=1.55GB, worker ID=228f5e97)\n]\n")


# ----------------------------------------------------------------------------- the memory cgroup


def test_the_memory_cgroup_of_this_process_and_of_a_container(tmp_path) -> None:
    found = probe.memory_cgroup(Path("/proc/self/cgroup").read_text())
    if found is None:
        pytest.skip("no memory cgroup readable here")
    folder, version = found
    figures = probe.cgroup_figures(folder, version)
    assert isinstance(figures["oom_kill"], int)
    # In a container the host's path is not mounted; the container's own cgroup is the mount's root (runc).
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
    (v2 / "memory.max").write_text("17179869184\n")
    (v2 / "memory.peak").write_text("17179860992\n")
    assert probe.memory_cgroup("0::/kubepods.slice/pod-x/cri-containerd-1.scope\n", str(v2)) == (str(v2), 2)
    assert probe.cgroup_figures(str(v2), 2) == {"oom_kill": 2, "limit_bytes": 16 * 2**30,
                                                "max_usage_bytes": 17179860992}
    (v2 / "memory.max").write_text("max\n")
    assert probe.cgroup_figures(str(v2), 2)["limit_bytes"] is None


def test_the_first_worker_of_a_cgroup_records_the_baseline(tmp_path) -> None:
    if probe.memory_cgroup(Path("/proc/self/cgroup").read_text()) is None:
        pytest.skip("no memory cgroup readable here")
    first = probe.record_cgroup(str(tmp_path))
    [written] = tmp_path.glob("cgroup-*.json")
    again = probe.record_cgroup(str(tmp_path), Path("/proc/self/cgroup").read_text())
    assert again == first == json.loads(written.read_text()) and list(tmp_path.glob("cgroup-*.json")) == [written]
    assert probe.watch_cgroup(str(tmp_path), first) is None  # no kill since
    assert out_of_memory.kernel_record(str(tmp_path)) is None


def _child_cgroup(name: str, limit: int) -> Path:
    text = Path("/proc/self/cgroup").read_text()
    own = next((line.split(":", 2)[2] for line in text.splitlines() if line.split(":")[1] == "memory"), None)
    parent = Path("/sys/fs/cgroup/memory", (own or "").lstrip("/"))
    if os.geteuid() != 0 or own is None or not (parent / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup v1 memory controller (a child cgroup of this process's own)")
    child = parent / name
    child.mkdir()
    (child / "memory.limit_in_bytes").write_text(str(limit))
    return child


def _remove_cgroup(child: Path) -> None:
    for _ in range(50):
        left = (child / "cgroup.procs").read_text().split()
        if not left:
            break
        for pid in left:
            (child.parent / "cgroup.procs").write_text(pid)
        time.sleep(0.1)
    child.rmdir()


def test_publish_reports_the_kernels_kill_of_a_worker(tmp_path) -> None:
    """A stand-in of a team's trainer process starts as Ray starts its workers (the setup hook first), then outgrows
    its cgroup's 64 MiB: the kernel kills it (SIGKILL, nothing of its own written), and the cgroup's oom_kill count,
    read against the baseline the first worker's hook recorded, says so: to a surviving worker's probe (its file
    is what the publish step on another node reads) and to the publish step on the same node (before the cgroup is
    removed)."""
    limit = 64 * 2**20
    child = _child_cgroup(f"forge-replay-test-{os.getpid()}", limit)
    results = tmp_path / "results"
    folder = results / publish.PROBE_FOLDER
    join = lambda: (child / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
    env = {**os.environ, probe.PROBE_DIR_ENV: str(folder), "PYTHONPATH": package_root(),
           probe.INTERVAL_ENV: "0.1"}
    hook = "from forge_replay.backends.probe import setup_hook; setup_hook()\n"
    # Another worker of the same cgroup that survives (an idle Ray worker, another rank): its probe sees the kill.
    survivor = subprocess.Popen([sys.executable, "-c", hook + "import sys; sys.stdin.read()"], env=env,
                                stdin=subprocess.PIPE, preexec_fn=join)
    try:
        wait = time.monotonic() + 60
        while not list(folder.glob("cgroup-*.json")) and time.monotonic() < wait:
            time.sleep(0.1)
        done = subprocess.run([sys.executable, "-c", hook + "held = [b'x' * 2**20 for _ in range(256)]\n"],
                              env=env, timeout=120, capture_output=True, preexec_fn=join)
        assert done.returncode == -signal.SIGKILL, done.stderr
        [baseline] = folder.glob("cgroup-*.json")
        assert json.loads(baseline.read_text())["cgroup"] == str(child)
        while not list(folder.glob("oomkill-*.json")) and time.monotonic() < wait:
            time.sleep(0.1)
        seen = out_of_memory.kernel_record(str(folder), host="the-head-on-another-node")  # its file alone
        assert seen is not None and seen["how_much"]["limit_bytes"] == limit, list(folder.iterdir())
        # The team's script saw its worker die and exited 1; the publish step runs on the same node.
        assert publish.main(["--results", str(results), "--exit-code", "1", "--backend", "slime",
                             "--script", "train.py", "--total", "4", "--log", os.devnull]) == 0
    finally:
        survivor.communicate(timeout=30)
        _remove_cgroup(child)
    report = json.loads((results / "report.json").read_text())
    record = report["out_of_memory"]
    assert (report["outcome"], record["signal"]) == ("outOfMemory", "kernelOomKiller")
    assert record["how_much"]["limit_bytes"] == limit and record["how_much"]["max_usage_bytes"] == limit
    assert f"killed 1 process(es) in memory cgroup {child}" in record["message"]
    progress = ProgressReport.model_validate_json((results / PROGRESS_KEY).read_text())  # as the operator reads it
    assert progress.result.outcome == "outOfMemory" and progress.result.out_of_memory.signal == "kernelOomKiller"
    assert progress.result.out_of_memory.how_much.limit_bytes == limit
    assert progress.result.message.startswith("train.py exited with status 1: out of memory (kernelOomKiller)")


def test_a_kill_seen_by_a_surviving_worker_on_another_node_is_read_from_its_file(tmp_path) -> None:
    baseline = {"host": "gpu-7", "cgroup": "/sys/fs/cgroup/memory", "version": 1, "oom_kill": 0,
                "limit_bytes": 16 * 2**30, "max_usage_bytes": 10 * 2**30}
    (tmp_path / "cgroup-gpu-7-abc.json").write_text(json.dumps(baseline))
    (tmp_path / "oomkill-gpu-7-abc.json").write_text(json.dumps(
        {**baseline, "oom_kill": 1, "baseline": 0, "max_usage_bytes": 16 * 2**30, "seen_at": "2026-12-02T12:00:01Z"}))
    record = out_of_memory.out_of_memory(str(tmp_path), 1, host="head-0")
    assert record["signal"] == "kernelOomKiller" and record["where"] == {"component": "trainer", "node": "gpu-7"}
    assert record["when"] == {"at": "2026-12-02T12:00:01Z"}
    assert record["how_much"] == {"limit_bytes": 16 * 2**30, "max_usage_bytes": 16 * 2**30}


# ----------------------------------------------------------------------------- torch's OOM observer


def test_torchs_oom_observer_is_where_the_probe_expects_it() -> None:
    """The private hook the probe attaches once CUDA is initialized (torch 2.15: torch/_dynamo/trace_rules.py lists
    it; c10/cuda/CUDACachingAllocator.h:97-101 its arguments). Without a GPU nothing is attached."""
    import torch

    assert callable(torch._C._cuda_attach_out_of_memory_observer)
    if not torch.cuda.is_available():
        assert probe._attach_cuda_observer("/nonexistent") is False


def test_a_cuda_out_of_memory_the_observer_recorded(tmp_path) -> None:
    # The caching allocator's call on an OOM: obs(device, alloc_size, device_total, device_free).
    observe = probe.cuda_oom_observer(str(tmp_path))
    observe(3, 2 * 2**30, 140 * 2**30, 2**30)
    observe(3, 4 * 2**30, 140 * 2**30, 2**30)  # called again for the same OOM (a retry): the first is kept
    record = out_of_memory.out_of_memory(str(tmp_path), 1)
    assert record["signal"] == "cudaAllocator"
    assert record["where"]["device"] == "cuda:3" and record["where"]["pid"] == os.getpid()
    assert record["how_much"]["requested_bytes"] == 2 * 2**30
    assert record["how_much"]["device_total_bytes"] == 140 * 2**30
    # what else held the device: used (total - free) less the process's reserved, when torch gave that figure
    target = next(tmp_path.glob("oom-*.json"))
    target.write_text(json.dumps({**json.loads(target.read_text()), "reserved_bytes": 100 * 2**30}))
    assert out_of_memory.out_of_memory(str(tmp_path), 1)["how_much"]["held_by_others_bytes"] == 39 * 2**30


# ----------------------------------------------------------------------------- Ray's memory monitor


def ray_traceback() -> str:
    """The end of a driver's log when its ray.get raised the memory monitor's error."""
    from ray.exceptions import OutOfMemoryError

    last = "".join(traceback.format_exception_only(OutOfMemoryError(RAY_MONITOR_MESSAGE)))
    return ("rollout 1: training\nTraceback (most recent call last):\n  File \"train.py\", line 140, in <module>\n"
            "    ray.get(refs)\n" + last)


def test_ray_memory_monitors_error_in_the_log() -> None:
    record = out_of_memory.ray_monitor_record(ray_traceback())
    assert record["signal"] == "rayMemoryMonitor"
    assert record["where"] == {"component": "trainer", "node": "192.0.2.2", "pid": 10883}
    assert record["message"].startswith("1 worker(s) were killed due to the node running low on memory.")
    assert out_of_memory.ray_monitor_record("ValueError: ray.exceptions.OutOfMemoryError: quoted\n") is None
    assert out_of_memory.out_of_memory("/nonexistent", 0, ray_traceback()) is None


def test_the_ray_jobs_own_log_is_found_from_rays_job_environment(tmp_path) -> None:
    log = tmp_path / "ray" / "session_2026-12-02_12-00-00_1" / "logs" / "job-driver-raysubmit_abc.log"
    log.parent.mkdir(parents=True)
    log.write_text(ray_traceback())
    environ = {out_of_memory.RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": {}, "metadata": {
        "job_submission_id": "raysubmit_abc", "job_name": "raysubmit_abc"}}), "RAY_TMPDIR": str(tmp_path)}
    assert out_of_memory.job_log(environ) == ray_traceback()
    assert out_of_memory.job_log({}) == ""


# ----------------------------------------------------------------------------- spec.expect.outcome


def test_an_expected_out_of_memory_is_a_result_that_succeeded_and_the_operator_says_so(tmp_path) -> None:
    from datetime import datetime, timezone

    from forge_replay.controller.status import status_from
    from tests.unit.spec_factory import byo_job

    observe = probe.cuda_oom_observer(str(tmp_path / publish.PROBE_FOLDER))
    (tmp_path / publish.PROBE_FOLDER).mkdir()
    observe(0, 2**30, 80 * 2**30, 2**28)
    assert publish.publish(str(tmp_path), "big", "slime", "train.py", 1, 4, None, None,
                           expect_outcome="outOfMemory") == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["outcome"] == "outOfMemory" and report["expectations"][0]["name"] == "outcome"
    progress = ProgressReport.model_validate_json((tmp_path / PROGRESS_KEY).read_text())
    assert (progress.result.phase, progress.result.outcome) == ("Succeeded", "outOfMemory")
    doc = byo_job("slime", metadata={"name": "big", "namespace": "ml", "uid": "u", "generation": 1},
                  spec__expect={"outcome": "outOfMemory"}, status={"rayJobName": "big", "phase": "Running"})
    rayjob = {"metadata": {"name": "big"}, "spec": {}, "status": {
        "jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
        "endTime": "2026-12-02T12:00:00Z"}}
    status = status_from(parse_job(doc), rayjob, None, progress, now=datetime(2026, 12, 2, 12, 0, 5,
                                                                              tzinfo=timezone.utc))
    assert (status["phase"], status["outcome"], status["outOfMemory"]["signal"]) == (
        "Succeeded", "outOfMemory", "cudaAllocator")
    # The same configuration fitting: the verdict fails it.
    assert publish.publish(str(tmp_path / "fit"), "big", "slime", "train.py", 0, 4, None, None,
                           expect_outcome="outOfMemory") == []
    fit = ProgressReport.model_validate_json((tmp_path / "fit" / PROGRESS_KEY).read_text())
    assert (fit.result.phase, fit.result.outcome, fit.result.expectations[0].passed) == ("Failed", "fits", False)


def test_the_entrypoint_passes_the_expected_outcome_to_the_publish_step() -> None:
    doc = yaml.safe_load((GOLDEN / "miles-debug.in.yaml").read_text())
    assert "--expect-outcome" not in launch.entrypoint(parse_job(doc).spec, "/dumps", results_dir="/r")
    doc["spec"]["expect"] = {"outcome": "outOfMemory"}
    assert "--expect-outcome outOfMemory --exit-code" in launch.entrypoint(parse_job(doc).spec, "/dumps",
                                                                           results_dir="/r")
