"""Results are never lost silently (issue 19): `forge-replay run` as a user runs it, on a real local Ray.

One run per results folder (a second is refused naming the first; a dead run's lock is taken over),
an unwritable folder fails before Ray starts, report.json is written whole after every step and marked
partial until the end, and a report that cannot be written neither leaves an earlier run's report looking
current nor keeps the engines' staged weights from being removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.processes import pid_alive
from tests.integration.test_forge_run import DOUBLE, job_file, records

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def named_job(tmp_path: Path, name: str, mode: str = "debug", rollouts: int = 400) -> Path:
    path = job_file(tmp_path, mode=mode, rollouts=rollouts)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = name
    target = tmp_path / f"{name}.yaml"
    target.write_text(yaml.safe_dump(doc))
    return target


def argv(tmp_path: Path, job: Path, results: Path, forge: bool = False) -> list[str]:
    out = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--no-progress",
           "--dumps-root", str(tmp_path / "dumps" / job.stem), "--results", str(results)]
    if forge:
        out += ["--engine-command", f"{sys.executable} {DOUBLE} --record-dir {tmp_path / 'double'}"]
    return out


def start(tmp_path: Path, job: Path, results: Path, forge: bool = False) -> subprocess.Popen:
    """A run in its own process group, so that a test can kill it, Ray and all, like a lost node."""
    return subprocess.Popen(argv(tmp_path, job, results, forge), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def report(results: Path) -> dict | None:
    try:
        return json.loads((results / "report.json").read_text())
    except (OSError, ValueError):
        return None


def wait_for_steps(run: subprocess.Popen, results: Path, job: str, steps: int = 1, timeout: float = 240) -> dict:
    """The run's own report.json once it holds ``steps`` trained rollouts (it is rewritten after each)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1][-3000:]
        current = report(results)
        if current and current["job"] == job and current["completed"] >= steps:
            return current
        time.sleep(0.3)
    raise AssertionError(f"no report with {steps} step(s) of {job} in {results} after {timeout} s")


def finish(run: subprocess.Popen, timeout: float = 180) -> str:
    try:
        return run.communicate(timeout=timeout)[1]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_a_second_run_on_the_same_results_is_refused_naming_the_first(tmp_path):
    results = tmp_path / "results"
    first = start(tmp_path, named_job(tmp_path, "first-run"), results)
    try:
        wait_for_steps(first, results, "first-run")
        began = time.monotonic()
        second = subprocess.run(argv(tmp_path, named_job(tmp_path, "second-run", rollouts=1), results),
                                cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert time.monotonic() - began < 30  # refused before any Ray was started
        assert f"results folder {results} is in use by job 'first-run' (pid {first.pid} on " in second.stderr
        assert report(results)["job"] == "first-run"  # the first run's report is untouched
        first.send_signal(signal.SIGTERM)
        stderr = finish(first)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 143, stderr[-3000:]
    final = report(results)
    assert final["partial"] is True and final["error"]  # how the signal surfaced (KeyboardInterrupt, ...)
    assert 1 <= final["completed"] == len(final["rollouts"]) < final["planned"] == 400
    assert not (results / ".forge-replay.lock").exists()  # released on the way out


def test_sigkill_mid_run_leaves_a_partial_report_and_the_next_run_takes_the_dead_runs_lock(tmp_path):
    results = tmp_path / "results"
    killed = start(tmp_path, named_job(tmp_path, "killed-run"), results)
    try:
        wait_for_steps(killed, results, "killed-run", steps=2)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    left = report(results)
    assert left["partial"] is True and left["error"] is None
    assert 2 <= left["completed"] == len(left["rollouts"]) < left["planned"] == 400
    assert left["summary"]["rollouts"] == left["completed"]  # the summary of the steps it holds (issue 25)
    assert (results / ".forge-replay.lock").exists()  # nothing could release it

    after = subprocess.run(argv(tmp_path, named_job(tmp_path, "next-run", rollouts=2), results),
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr[-3000:]
    assert f"took over the results lock of job 'killed-run' (pid {killed.pid} on " in after.stderr
    assert "that process is gone" in after.stderr
    done = report(results)
    assert done["job"] == "next-run" and done["partial"] is False and done["completed"] == done["planned"] == 2
    kept = json.loads((results / "report.previous.json").read_text())
    assert kept["job"] == "killed-run" and kept["completed"] == left["completed"]
    assert not (results / ".forge-replay.lock").exists()


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs (read-only or not); skips where this user may not mount."""
    mounted = []

    def mount(name: str, size: str, read_only: bool = False) -> Path:
        point = tmp_path / name
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def read_only_folder(tmp_path: Path, tmpfs) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return tmpfs("read-only", "1m", read_only=True)  # root writes through chmod: a read-only mount


@pytest.mark.parametrize("below", [False, True], ids=["the-folder", "a-folder-to-create-in-it"])
def test_a_read_only_results_folder_fails_before_ray_starts(tmp_path, tmpfs, below):
    results = read_only_folder(tmp_path, tmpfs)
    if below:
        results = results / "job"
    began = time.monotonic()
    run = subprocess.run(argv(tmp_path, named_job(tmp_path, "read-only-run"), results),
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-3000:]
    assert time.monotonic() - began < 30
    assert f"results folder {results} is not writable: " in run.stderr
    assert "Ray" not in run.stderr and not (tmp_path / "dumps").exists()  # nothing started, nothing synthesized


def staged_weight_folders(tmp_path: Path) -> set[Path]:
    """The engines' staged checkpoints, as the double was told to load them (/tmp/forge-replay-engine-*-weights)."""
    folders = set()
    for engine in records(tmp_path).values():
        for call in engine["calls"]:
            if call["path"] == "/update_weights_from_disk":
                staged = Path(call["body"]["model_path"])
                folders.add(next(p for p in [staged, *staged.parents] if p.name.endswith("-weights")))
    return folders


@pytest.mark.parametrize("how", ["directory-in-the-way", "full-disk"])
def test_a_report_write_failure_leaves_no_earlier_report_looking_current_and_cleans_the_engines(
        tmp_path, tmpfs, how):
    results = tmpfs("results", "4m") if how == "full-disk" else tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / "report.json").write_text(json.dumps({"job": "an-earlier-run", "partial": False}))
    (results / "memory.png").write_bytes(b"an earlier plot")
    run = start(tmp_path, named_job(tmp_path, "forge-report-fails", mode="forge"), results, forge=True)
    try:
        wait_for_steps(run, results, "forge-report-fails")
        staged = staged_weight_folders(tmp_path)
        assert staged and all(folder.name.startswith("forge-replay-engine-") for folder in staged)
        if how == "directory-in-the-way":
            (results / ".report.json.tmp").mkdir()
        else:
            with open(results / "filler", "wb") as fh:
                try:
                    while True:
                        fh.write(b"\0" * 65536)
                        fh.flush()
                except OSError:
                    pass
        stderr = finish(run, timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 1, stderr[-3000:]
    if how == "directory-in-the-way":
        assert f"cannot write the report to {results}" in stderr and "rollouts were trained" in stderr
    current = report(results)
    assert current["job"] == "forge-report-fails" and current["partial"] is True
    assert json.loads((results / "report.previous.json").read_text())["job"] == "an-earlier-run"
    assert (results / "memory.previous.png").read_bytes() == b"an earlier plot"
    engines = records(tmp_path)
    assert engines and all(e["stopped"] and not pid_alive(e["starts"][-1]["pid"]) for e in engines.values())
    assert not [folder for folder in staged_weight_folders(tmp_path) if folder.exists()]
    assert not (results / ".forge-replay.lock").exists()
