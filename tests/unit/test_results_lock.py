"""The results folder's rules without Ray: the lock file, whole-file writes, the previous report set aside,
and the --synth-missing disk estimate."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from forge_replay.runtime.run_inputs import synth_disk_problem
from forge_replay.runtime.results import (
    LOCK_NAME,
    LockOwner,
    ResultsError,
    ResultsLock,
    check_writable,
    read_owner,
    set_previous_aside,
)
from forge_replay.dumps.writing import write_atomically


def other_process(code: str = "import time; time.sleep(60)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def lock_of(tmp_path: Path, owner: LockOwner) -> Path:
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps(owner.__dict__))
    return path


def test_the_lock_names_its_run_and_is_released(tmp_path):
    with ResultsLock(tmp_path, "job-a") as lock:
        owner = read_owner(tmp_path / LOCK_NAME)
        assert owner == lock.owner and owner.pid == os.getpid() and owner.job == "job-a"
        assert owner.host == socket.gethostname() and owner.started_at.endswith("Z")
    assert not (tmp_path / LOCK_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary files left either


def test_a_live_run_holding_the_folder_is_named(tmp_path):
    alive = other_process()
    try:
        from forge_replay.runtime.results import process_start

        holder = LockOwner(alive.pid, socket.gethostname(), "job-a", "2026-01-01T00:00:00Z", process_start(alive.pid))
        lock_of(tmp_path, holder)
        with pytest.raises(ResultsError) as refused:
            ResultsLock(tmp_path, "job-b").acquire()
        assert str(refused.value).startswith(
            f"results folder {tmp_path} is in use by job 'job-a' (pid {alive.pid} on {socket.gethostname()}, "
            "started 2026-01-01T00:00:00Z); wait for that run, stop it, or pass another --results")
        assert read_owner(tmp_path / LOCK_NAME) == holder  # untouched
    finally:
        alive.kill()
        alive.wait()


def test_a_dead_runs_lock_is_taken_over_with_a_note(tmp_path):
    dead = other_process("pass")
    dead.wait()
    lock_of(tmp_path, LockOwner(dead.pid, socket.gethostname(), "job-a", "2026-01-01T00:00:00Z"))
    lock = ResultsLock(tmp_path, "job-b").acquire()
    assert lock.note == (f"took over the results lock of job 'job-a' (pid {dead.pid} on {socket.gethostname()}, "
                         "started 2026-01-01T00:00:00Z): that process is gone")
    assert read_owner(tmp_path / LOCK_NAME).job == "job-b"
    lock.release()
    assert not list(tmp_path.iterdir())


def test_a_recycled_pid_does_not_keep_a_stale_lock(tmp_path):
    # our own pid, alive, but with another process start time: the lock's process is gone
    lock_of(tmp_path, LockOwner(os.getpid(), socket.gethostname(), "job-a", "2026-01-01T00:00:00Z", "1"))
    assert ResultsLock(tmp_path, "job-b").acquire().note.startswith("took over the results lock of job 'job-a'")


def test_another_hosts_lock_and_an_unreadable_lock_are_respected(tmp_path):
    lock_of(tmp_path, LockOwner(1, "some-other-host", "job-a", "2026-01-01T00:00:00Z"))
    with pytest.raises(ResultsError, match="in use by job 'job-a' \\(pid 1 on some-other-host"):
        ResultsLock(tmp_path, "job-b").acquire()
    (tmp_path / LOCK_NAME).write_text("{not json")
    with pytest.raises(ResultsError, match=f"unreadable lock.*if it is gone, delete {tmp_path / LOCK_NAME}"):
        ResultsLock(tmp_path, "job-b").acquire()


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = ResultsLock(tmp_path, "job-a").acquire()
    theirs = LockOwner(1, "some-other-host", "job-b", "2026-01-01T00:00:00Z")
    lock_of(tmp_path, theirs)
    lock.release()
    assert read_owner(tmp_path / LOCK_NAME) == theirs


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "report.json"
    write_atomically(target, '{"step": 1}')
    (tmp_path / ".report.json.tmp").mkdir()  # in the way of the temporary name
    with pytest.raises(OSError):
        write_atomically(target, '{"step": 2}')
    assert target.read_text() == '{"step": 1}'


def test_the_previous_report_is_set_aside_and_kept(tmp_path):
    (tmp_path / "report.json").write_text("old report")
    (tmp_path / "memory.png").write_bytes(b"old plot")
    assert set_previous_aside(tmp_path) == ["report.previous.json", "memory.previous.png"]
    assert not (tmp_path / "report.json").exists() and not (tmp_path / "memory.png").exists()
    assert (tmp_path / "report.previous.json").read_text() == "old report"
    assert set_previous_aside(tmp_path) == []


def test_a_byo_runs_logs_and_memory_probes_are_set_aside_two_runs_over(tmp_path):
    # a slime / miles run's probe folder: left in place, the next run's memory peak counted these files too
    for run in ("first", "second"):
        (tmp_path / "probe").mkdir()
        (tmp_path / "probe" / f"probe-host-{run}.json").write_text(run)
        (tmp_path / "trainer.log").write_text(f"{run} log")
        assert set_previous_aside(tmp_path) == ["trainer.previous.log", "probe.previous"]
        assert not (tmp_path / "probe").exists() and not (tmp_path / "trainer.log").exists()
    assert [p.name for p in (tmp_path / "probe.previous").iterdir()] == ["probe-host-second.json"]
    assert (tmp_path / "trainer.previous.log").read_text() == "second log"


def test_an_unwritable_results_folder_is_named(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ResultsError, match=f"^results folder {blocker / 'results'} is not writable: "):
        check_writable(blocker / "results")
    check_writable(tmp_path / "new" / "results")
    assert not list((tmp_path / "new" / "results").iterdir())


def test_synth_disk_estimate():
    assert synth_disk_problem(30 * 2**10, 1000, 2**40, "/d") is None
    assert synth_disk_problem(30 * 2**10, 1_000_000, 2**40, "/d") == (
        "--synth-missing would write 1000000 dumps of 0.03 MiB each (28.61 GiB), more than the 1 GiB "
        "--synth-missing writes at most; lower spec.replay.numRollouts (a literal dumps.path reuses one file), "
        "or write the dumps with `forge-replay dumps synth`")
    assert "more than half of the 0.05 GiB free under /d;" in synth_disk_problem(2**20, 30, 50 * 2**20, "/d")


def test_the_in_cluster_entry_point_fails_on_an_unwritable_results_claim_before_ray(tmp_path, capsys):
    import ray

    from forge_replay.api import parse_job
    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.runtime.__main__ import main
    from tests.unit.spec_factory import debug_job

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = RuntimeConfig(job=parse_job(debug_job()), dumps_root=str(tmp_path), results_dir=str(blocker / "results"),
                           model_root=None)
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert main(["--config", str(tmp_path / "config.yaml"), "--no-progress"]) == 2
    assert f"results folder {blocker / 'results'} is not writable" in capsys.readouterr().err
    assert not ray.is_initialized()
