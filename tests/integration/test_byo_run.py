"""`forge-replay run FILE --trainer-root DIR` (issue 15): a miles job's script runs as a Ray job on a local Ray, with
the operator's entrypoint and runtime env; the stand-in train.py (tests/byo, strict like miles) reports what the
injected flags and forge-replay's rollout function gave it, and the memory probe records its Ray workers' peak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

STAND_IN = Path(__file__).resolve().parent.parent / "byo"


def small_job(tmp_path: Path, name: str, backend: str, num_rollouts: int, path: str, args: list[str],
              **dumps) -> None:
    """job.yaml in ``tmp_path``: a debug-mode ``backend`` job of the stand-in script."""
    job = {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": name},
           "spec": {"replay": {"mode": "debug", "numRollouts": num_rollouts,
                               "dumps": {"claimName": "dumps", "path": path, **dumps}},
                    "model": {"config": {"hidden_size": 8}},
                    "trainer": {"backend": backend, "image": f"team/{backend}:v1", "workingDir": f"/root/{backend}",
                                "args": args}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))


def run_argv(*extra: str) -> list[str]:
    """`forge-replay run job.yaml` of the stand-in script, dumps under dumps/, results in results/."""
    return [sys.executable, "-m", "forge_replay.cli", "run", "job.yaml", *extra, "--trainer-root", str(STAND_IN),
            "--dumps-root", "dumps", "--results", "results"]


def test_miles_stand_in_replays_the_spec_rollouts_through_a_local_ray_job(tmp_path) -> None:
    report = tmp_path / "stand-in.json"
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "latest_checkpointed_iteration.txt").write_text("0\n")
    job = {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "byo-miles"},
        "spec": {
            "replay": {"mode": "forge", "numRollouts": 3, "startRolloutId": 1, "evalInterval": 3,
                       "evalBeforeTrain": True, "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt", "fallbackToFirst": False}},
            "model": {"config": {"hidden_size": 8}},
            "trainer": {"backend": "miles", "image": "team/miles:v1", "workingDir": "/root/miles", "gpusPerNode": 0,
                        "args": ["--stand-in-backend", "miles", "--stand-in-report", str(report),
                                 "--stand-in-train-mib", "96", "--rollout-batch-size", "4",
                                 "--eval-prompt-data", "aime", "/data/aime.jsonl",
                                 "--load", str(checkpoint)],  # miles keeps --start-rollout-id only with one
                        "env": {"FORGE_REPLAY_PROBE_INTERVAL_S": "0.1"}},
            "rollout": {"numGpus": 1, "numGpusPerEngine": 1},
            "expect": {"maxPeakMemoryGiB": 0.01},  # issue 25: checked against the probe's peak, which is over it
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    # A previous run in the same folder: its files are set aside, and its memory probe's record (a peak far over
    # this run's) is not counted in this run's peak.
    (tmp_path / "results" / "probe").mkdir(parents=True)
    stale = {"source": "rss", "host": "old-host", "pid": 1, "peak_rss_gib": 512.0, "peak_allocated_gib": None}
    (tmp_path / "results" / "probe" / "probe-old-host-1.json").write_text(json.dumps(stale))
    (tmp_path / "results" / "trainer.log").write_text("the previous run's log")
    done = subprocess.run(
        [sys.executable, "-m", "forge_replay.cli", "run", "job.yaml", "--synth-missing", "--trainer-root",
         str(STAND_IN), "--dumps-root", "dumps", "--results", "results"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 3, done.stdout + done.stderr  # the script succeeded; the memory budget did not hold
    assert "first: maxPeakMemoryGiB: peak memory (GiB, RSS)" in done.stderr
    got = json.loads(report.read_text())
    # rollouts start..start+N (--num-rollout is an end bound), each from its own dump, samples keep their rollout_id
    # (the synthesized samples are an episode each: their own rollout_id is their index; metadata names the dump's)
    assert [(r["rollout_id"], r["made_for"], r["rollout_ids"], r["metrics"]["forge_replay/fallback_used"])
            for r in got["train"]] == [(n, [n], list(range(16)), 0) for n in (1, 2, 3)]
    assert all(r["samples"] > 0 and r["trained_mib"] == 96 for r in got["train"])
    # miles evaluates before its first step at --start-rollout-id (eval_1; slime would not), then after rollout 2
    assert [(e["rollout_id"], e["eval"]) for e in got["eval"]] == [(1, ["forge_eval"]), (2, ["forge_eval"])]
    args = got["args"]
    assert (args["debug_train_only"], args["num_rollout"], args["start_rollout_id"]) == (False, 4, 1)
    assert args["rollout_global_dataset"] is False  # miles would load --prompt-data: forge-replay turns it off
    assert args["load_forge_rollout_data"] == str(tmp_path / "dumps" / "run" / "rollout_{rollout_id}.pt")
    assert args["forge_replay_fallback_to_first"] is False  # through generate_rollout.add_arguments, as miles does
    record = json.loads((tmp_path / "results" / "job.json").read_text())
    assert record["status"] == "SUCCEEDED" and record["entrypoint"].startswith(f"cd {STAND_IN} && python3 train.py ")
    assert "stand-in train" in (tmp_path / "results" / "trainer.log").read_text()
    assert (tmp_path / "results" / "trainer.previous.log").read_text() == "the previous run's log"
    assert [p.name for p in (tmp_path / "results" / "probe.previous").iterdir()] == ["probe-old-host-1.json"]
    assert not (tmp_path / "results" / ".forge-replay.lock").exists()
    # the memory probe (Ray's worker_process_setup_hook) saw the Ray workers that held the torch tensors
    peak = record["memory_peak"]
    assert peak["source"] == "rss" and 96 / 1024 <= peak["peak_rss_gib"] < 64 and peak["pid"] > 1, peak
    # the entrypoint's publish step wrote report.json and progress.json after the script, as it does in a pod
    written = json.loads((tmp_path / "results" / "report.json").read_text())
    assert (written["backend"], written["exit_code"], written["job"]) == ("miles", 0, "byo-miles")
    # verify's record in the results folder: nothing miles would drop of these dumps (each sample its own rollout_id)
    assert written["preflight"] == {"record": str(tmp_path / "results" / "verify-record.json"), "notes": []}
    assert written["summary"]["memory_peak"]["peak_rss_gib"] >= 96 / 1024
    assert [(c["name"], c["passed"]) for c in written["expectations"]] == [("maxPeakMemoryGiB", False)]
    assert written["expectations"][0]["observed"] == written["summary"]["memory_peak"]["peak_rss_gib"]
    progress = json.loads((tmp_path / "results" / "progress.json").read_text())
    assert progress["result"]["phase"] == "Failed" and progress["completed"] == 3  # what the operator reads
    assert progress["result"]["expectations"][0]["name"] == "maxPeakMemoryGiB"


def test_a_byo_run_on_results_in_use_is_refused_naming_the_run_that_holds_them(tmp_path) -> None:
    # The builtin trainer's folder rule holds for slime / miles runs: refused in seconds, nothing set aside.
    from forge_replay.runtime.results import ResultsLock

    small_job(tmp_path, "second", "slime", 1, "run/rollout_{rollout_id}.pt", ["--rollout-batch-size", "4"])
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "report.json").write_text("the first run's report")
    with ResultsLock(tmp_path / "results", "first"):
        done = subprocess.run(run_argv("--synth-missing"), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "results folder results is in use by job 'first' (pid " in done.stderr, done.stderr
    assert (tmp_path / "results" / "report.json").read_text() == "the first run's report"
    assert not (tmp_path / "dumps").exists()  # refused before any dump was synthesized


def test_a_stopped_byo_run_stops_its_ray_and_says_so(tmp_path) -> None:
    # SIGTERM mid-run: the script's Ray job and the local Ray head are stopped, the last line says how the run
    # stopped (not "while starting; nothing was trained"), exit 143, the folder is unlocked, no process is left.
    import time

    from tests.integration.processes import family, left_behind, stop_and_wait

    small_job(tmp_path, "long", "slime", 300, "run/rollout.pt",
              ["--stand-in-backend", "slime", "--stand-in-train-mib", "1", "--rollout-batch-size", "4"])
    run = subprocess.Popen(run_argv("--synth-missing"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    log = tmp_path / "results" / "trainer.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and "stand-in train" in log.read_text()):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.2)
    started, sessions = family(run.pid)
    stderr = stop_and_wait(run, "SIGTERM", 90)
    assert run.returncode == 143, stderr[-3000:]
    assert (f"forge-replay run job.yaml: terminated (SIGTERM); the slime job and its local Ray were stopped; its "
            f"output so far is in results/trainer.log") in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not (tmp_path / "results" / ".forge-replay.lock").exists()
    assert left_behind(started, sessions) == []


def test_a_byo_run_verifies_the_dumps_as_the_verify_job_would_before_starting_ray(tmp_path) -> None:
    # The same YAML in a cluster gets a verify Job (--backend miles); here the run checked nothing and started Ray.
    small_job(tmp_path, "bad-dumps", "miles", 2, "run/rollout_{rollout_id}.pt",
              ["--stand-in-backend", "miles", "--rollout-batch-size", "4"], fallbackToFirst=False)
    (tmp_path / "dumps" / "run").mkdir(parents=True)
    (tmp_path / "dumps" / "run" / "rollout_0.pt").write_bytes(b"not a dump")
    done = subprocess.run(run_argv(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "rollout_0.pt" in said and "rollout_1.pt" in said  # unreadable, and missing with no fallback
    assert (f"job.yaml: dumps verify refused the dumps under dumps (above), as the verify Job of this job would in a "
            "cluster; nothing was started") in done.stderr, said
    assert "starting a local Ray" not in said and not (tmp_path / "results" / "trainer.log").exists()
