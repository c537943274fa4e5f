"""What `forge-replay run` prints, as a user sees it in a terminal 80 columns wide: what is starting until step 1,
a table that does not wrap, and none of Ray's or transformers' noise (issue 18)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tests.integration.processes import _cmdline, family, left_behind, stop_and_wait
from tests.integration.test_forge_run import DOUBLE, job_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def test_a_forge_run_says_what_starts_and_prints_no_noise(tmp_path):
    job = job_file(tmp_path, rollouts=2, weight_sync="disk")  # disk: a checkpoint written every step
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "80", "LINES": "40"}  # rich draws as in a terminal
    env.pop("RAY_AUTH_MODE", None)
    done = subprocess.run(
        [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--dumps-root",
         str(tmp_path / "dumps"), "--results", str(tmp_path / "results"),
         "--engine-command", f"{sys.executable} {DOUBLE}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    out = ANSI.sub("\n", done.stdout + done.stderr)
    assert done.returncode == 0, out[-4000:]
    assert "Token authentication is enabled" not in out  # Ray's default for a local cluster, said on every run
    assert "Writing model shards" not in out  # transformers' bar, once per step (disk weight sync)
    assert "starting a local Ray" in out
    assert "starting: the trainer and 2 sglang engine(s)" in out, out[-4000:]
    table = out[out.index("forge-run: forge replay"):out.index("rollouts 2, fallbacks 0")]
    assert max(len(line) for line in table.splitlines()) <= 80, table


@pytest.mark.parametrize("broken", ["missing", "truncated"])
def test_an_error_raised_in_an_actor_reaches_the_user_as_its_one_line(tmp_path, broken):
    # verify: false lets a missing (ReplayError) or truncated (DumpError) dump through to the rollout manager actor,
    # which raises there; Ray printed "Failed to deserialize exception" and a traceback for both types.
    import yaml

    job = job_file(tmp_path, mode="debug", rollouts=3)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["replay"]["verify"] = False
    doc["spec"]["replay"]["dumps"]["fallbackToFirst"] = False
    job.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--dumps-root", str(tmp_path / "dumps"),
            "--results", str(tmp_path / "results"), "--no-progress"]
    subprocess.run([sys.executable, "-m", "forge_replay.cli", "dumps", "synth", "--out",
                    str(tmp_path / "dumps" / "run" / "rollout_{rollout_id}.pt"), "--num-rollouts", "3", "--prompts", "2",
                    "--samples-per-prompt", "4", "--prompt-len", "8", "--response-len", "8", "--vocab-size", "256"],
                   check=True, capture_output=True, timeout=120)
    dump = tmp_path / "dumps" / "run" / "rollout_1.pt"
    if broken == "missing":
        dump.unlink()
        expected = (f"ReplayError: rollout 1: dump {dump} does not exist (fallback to rollout 0 is off); write it or "
                    "run `forge-replay dumps verify` to list every missing file")
    else:
        dump.write_bytes(dump.read_bytes()[:200])
        expected = f"DumpError: {dump}: "
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-4000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("forge-replay run ")]
    assert len(lines) == 1 and lines[0].startswith(f"forge-replay run {job}: {expected}"), done.stderr[-4000:]
    assert broken == "truncated" or lines[0] == f"forge-replay run {job}: {expected}"
    assert "Failed to deserialize" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-4000:]


@pytest.mark.parametrize("signame, to_group, code", [("SIGTERM", False, 143), ("SIGINT", True, 130),
                                                     ("SIGTERM", True, 143)],
                         ids=["SIGTERM", "SIGINT-to-the-process-group", "SIGTERM-to-the-process-group"])
def test_an_interrupted_report_says_so_and_agrees_with_progress(tmp_path, signame, to_group, code):
    # to_group: what Ctrl-C in a terminal, `timeout` or `kill -TERM -- -PGID` do. Ray's GCS and raylet live in a
    # session of their own (runtime/local_ray.py): in the run's group, SIGTERM stopped the GCS and the run hung
    # for 60 s on "Failed to connect to GCS", then exited 1 without saying it was terminated.
    import json
    import time

    job = job_file(tmp_path, mode="debug", rollouts=200)
    results = tmp_path / "results"
    run = subprocess.Popen([sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing",
                            "--no-progress", "--dumps-root", str(tmp_path / "dumps"), "--results", str(results)],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=to_group)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1][-3000:]
        try:
            if json.loads((results / "progress.json").read_text())["completed"] >= 2:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    started, sessions = family(run.pid)  # Ray's processes and the trainer among them
    assert any("raylet" in " ".join(p.cmdline()) for p in started), [p.cmdline()[:3] for p in started]
    signalled = time.monotonic()
    stderr = stop_and_wait(run, signame, 120, group=to_group)
    assert run.returncode == code, stderr[-3000:]
    assert time.monotonic() - signalled < 30, stderr[-3000:]  # seconds, not Ray's 60 s of GCS reconnects
    name = "interrupted (Ctrl-C)" if signame == "SIGINT" else "terminated (SIGTERM)"
    assert f"{name}; engines and trainer stopped" in stderr, stderr[-3000:]
    assert "Failed to connect to GCS" not in stderr, stderr[-3000:]
    report = json.loads((results / "report.json").read_text())
    progress = json.loads((results / "progress.json").read_text())
    assert report["interrupted"] == signame and report["partial"] is True and report["planned"] == 200
    assert report["error"] == f"interrupted by {signame}"
    assert 2 <= report["summary"]["rollouts"] == report["completed"] == progress["completed"] < 200
    assert left_behind(started, sessions) == []


@pytest.mark.parametrize("signame, when, code", [("SIGINT", "importing", 130), ("SIGINT", "ray-starting", 130),
                                                  ("SIGTERM", "ray-starting", 143)])
def test_a_stop_in_the_first_seconds_exits_cleanly_leaving_no_process(tmp_path, signame, when, code):
    # Imports, dump synthesis and Ray's start-up: Ctrl-C printed click's "Aborted!" and exited 1, and ray.init's
    # own SIGTERM handler exited 15; Ray's agents were left behind. "ray-starting" waits for the local Ray helper
    # to exist (it was a fixed 8 s, which under a loaded machine's parallel tests landed in other phases).
    import time

    job = job_file(tmp_path, mode="debug", rollouts=3)
    run = subprocess.Popen([sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing",
                            "--no-progress", "--dumps-root", str(tmp_path / "dumps"), "--results",
                            str(tmp_path / "results")], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    if when == "importing":
        time.sleep(1.0)
    else:
        deadline = time.monotonic() + 120
        while not any("forge_replay.runtime.local_ray" in " ".join(_cmdline(p)) for p in family(run.pid)[0]):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
            time.sleep(0.1)
    started, sessions = family(run.pid)  # ray-starting: Ray's helper, starting Ray in a session of its own
    stderr = stop_and_wait(run, signame, 60)
    assert run.returncode == code, stderr[-3000:]
    assert "Aborted!" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert not (tmp_path / "results" / ".forge-replay.lock").exists()  # released: the next run may use the folder
    assert left_behind(started, sessions) == []
    time.sleep(2)
    ps = subprocess.run(["ps", "-eo", "pid=,pgid=,args="], capture_output=True, text=True).stdout.splitlines()
    assert [line for line in ps if line.split()[1] == str(run.pid)] == []
