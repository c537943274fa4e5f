"""Out-of-memory is the memory test's answer (issue 31): `forge-replay run` as a user runs it, inside a memory cgroup
whose limit the trainer exceeds (a container's memory limit, here made by the test).

The run's first rollout fits; the second packs 64k tokens into one micro-batch, whose logits alone (64k x 16384
vocabulary x float32 = 4 GiB) are more than the cgroup allows: the kernel's OOM killer kills the trainer rank in that
step. The run must say so (outcome outOfMemory, the signal, rank, rollout and phase), exit 4, keep the step it
finished, unlock its results folder and leave no process behind. A sweep (issue 32) whose large points run out of
memory the same way records each as a point ended outOfMemory and runs the next point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LIMIT = 3 * 2**30
"""The cgroup's limit: the run (this CLI, a local Ray, the rollout manager, one CPU rank) needs about 1.8 GiB up to
rollout 0's step; rollout 1's step asks 4 GiB more at once."""
VOCAB = 16384
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": VOCAB,
        "max_position_embeddings": 1024}


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def memory_cgroup(limit_bytes: int):
    """A v1 memory cgroup of its own, made under this process's memory cgroup (from /proc/self/cgroup), limited to
    ``limit_bytes``; removed afterwards however the test ends (anything still in it moved back to the parent first).
    Skips where one cannot be made (no v1 memory hierarchy, not allowed)."""
    from forge_replay.runtime.memory_signals import memory_cgroup as cgroup_of

    mine = cgroup_of()
    if mine is None or mine.version != 1:
        pytest.skip("needs a cgroup v1 memory hierarchy to make a limited cgroup in (this one: "
                    f"{'none' if mine is None else 'v2'})")
    if _available_bytes() < 2 * limit_bytes:
        pytest.skip(f"needs {2 * limit_bytes / 2**30:.0f} GiB of available memory to back a "
                    f"{limit_bytes / 2**30:.0f} GiB cgroup")
    parent = Path(mine.directory)
    child = parent / f"forge-replay-oom-test-{os.getpid()}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {exc}")
    try:
        (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield child
    finally:
        deadline = time.monotonic() + 30
        while True:
            for pid in (child / "cgroup.procs").read_text().split():
                try:
                    (parent / "cgroup.procs").write_text(pid)
                except OSError:  # gone meanwhile
                    pass
            try:
                child.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def oom_kills(cgroup: Path) -> int:
    return int(dict(line.split() for line in (cgroup / "memory.oom_control").read_text().splitlines())["oom_kill"])


@dataclass
class CgroupRun:
    """How a command run in a memory cgroup of its own ended."""

    returncode: int
    stdout: str
    stderr: str
    left: list[str]
    """The pids still in the cgroup 15 s after the command exited (the local Ray, its workers): none expected."""
    oom_kills_before: int
    oom_kills: int
    """The cgroup's oom_kill counter before the command started and after it ended (the kernel's own count)."""


def run_in_memory_cgroup(argv: list[str], cwd: Path, limit_bytes: int = LIMIT) -> CgroupRun:
    """``argv`` (a `forge-replay run`) in a session of its own, moved into a new memory cgroup of ``limit_bytes``
    before it executes: only the run goes in, not this test. Killed (its process group) after 300 s."""
    # Ray starts idle workers ahead (one per CPU on some versions and machines): not here, so that what the run
    # needs before its large step does not grow with the machine's CPUs.
    env = {**os.environ, "RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
    with memory_cgroup(limit_bytes) as cgroup:
        procs = cgroup / "cgroup.procs"
        before = oom_kills(cgroup)
        run = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               preexec_fn=lambda: procs.write_text(str(os.getpid())))  # only the run goes in
        try:
            stdout, stderr = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, 9)
                run.wait()
        deadline = time.monotonic() + 15
        while procs.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.2)
        return CgroupRun(run.returncode, stdout, stderr, left=procs.read_text().split(), oom_kills_before=before,
                         oom_kills=oom_kills(cgroup))


def job_and_dumps(tmp_path: Path) -> Path:
    """Rollout 0: 4 samples of 64 tokens. Rollout 1: 128 samples of 512 tokens, one micro-batch of 64k tokens."""
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples

    dumps = tmp_path / "dumps" / "run"
    dumps.mkdir(parents=True)
    save(dumps / "rollout_0.pt", 0, synth_samples(0, 1, 4, 16, 48, vocab_size=VOCAB))
    save(dumps / "rollout_1.pt", 1, synth_samples(1, 32, 4, 64, 448, vocab_size=VOCAB))
    job = tmp_path / "oom.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "oom-cpu"},
        "spec": {"replay": {"mode": "debug", "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"},
                            "numRollouts": 2},
                 "model": {"config": TINY},
                 "trainer": {"nodes": 1, "gpusPerNode": 0, "microBatchTokens": 65536, "dtype": "float32",
                             "gradientCheckpointing": False, "nSamplesPerPrompt": 4}}}))
    return job


def test_a_trainer_over_its_memory_cgroup_limit_ends_out_of_memory_exit_4_and_holds_nothing(tmp_path,
                                                                                          record_property):
    job = job_and_dumps(tmp_path)
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--no-progress",
            "--dumps-root", str(tmp_path / "dumps"), "--results", str(results)]
    ran = run_in_memory_cgroup(argv, tmp_path)
    stdout, stderr, left, kills = ran.stdout, ran.stderr, ran.left, ran.oom_kills  # left: Ray and its workers
    assert ran.returncode == 4, stderr[-4000:]
    assert not left, f"processes of the run left in its cgroup: {left}"
    assert kills >= 1  # the kernel's own count: it did kill in there

    report = json.loads((results / "report.json").read_text())
    oom = report["out_of_memory"]
    record_property("oom_signal", oom["signal"])  # which one fired: the kernel's here (Ray's monitor reads the host)
    assert report["outcome"] == "outOfMemory"
    assert oom["signal"] in ("kernelOomKiller", "rayMemoryMonitor")
    assert oom["where"]["component"] == "trainer" and oom["where"]["rank"] == 0 and oom["where"]["pid"] > 0
    assert oom["when"]["rollout"] == 1 and oom["when"]["phase"] in ("forward", "backward")
    if oom["signal"] == "kernelOomKiller":
        assert oom["how_much"]["limit_bytes"] == LIMIT and oom["how_much"]["max_usage_bytes"] >= LIMIT * 0.9
    assert set(oom["how_much"]["last_step_peak_gib"]) == {"0"}  # rollout 0's peak, per rank

    # a complete partial report: the step before the out-of-memory, and nothing of the one it killed
    assert report["partial"] is True and report["error"].startswith(f"out of memory ({oom['signal']}): rank 0")
    assert report["completed"] == 1 == len(report["rollouts"]) == report["summary"]["rollouts"]
    assert report["rollouts"][0]["rollout_id"] == 0 and report["planned"] == 2
    assert json.loads((results / "progress.json").read_text())["completed"] == 1
    assert not (results / ".forge-replay.lock").exists()  # the results folder is unlocked
    line = f"out of memory ({oom['signal']}): rank 0 on {oom['where']['node']}, rollout 1 {oom['when']['phase']}"
    assert f"forge-replay run {job}: {line}" in stderr
    assert f"outcome: outOfMemory: {line}" in " ".join((stdout + stderr).split())  # the table's last lines


def test_a_slime_job_over_its_memory_cgroup_limit_is_reported_the_same_way(tmp_path):
    """`forge-replay run --trainer-root` of the team-image stand-in (tests/byo/train.py as slime's train.py): its
    step in a Ray worker holds memory in proportion to the rollout's tokens, so rollout 1 (64k tokens at 64 KiB a
    token: 4 GiB) outgrows the cgroup. The publish step reads the kernel's kill from the cgroup the memory probe
    recorded (or Ray's monitor's error from the job's log): outcome outOfMemory, exit 4, folder unlocked, nothing
    left running."""
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples

    stand_in = Path(__file__).resolve().parent.parent / "byo"
    dumps = tmp_path / "dumps" / "run"
    dumps.mkdir(parents=True)
    save(dumps / "rollout_0.pt", 0, synth_samples(0, 2, 4, 16, 48, vocab_size=VOCAB))  # a whole step
    save(dumps / "rollout_1.pt", 1, synth_samples(1, 32, 4, 64, 448, vocab_size=VOCAB))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "oom-slime"},
        "spec": {"replay": {"mode": "debug", "numRollouts": 2,
                            "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"}},
                 "model": {"config": {"hidden_size": 8}},
                 "trainer": {"backend": "slime", "image": "team/slime:v1", "workingDir": "/root/slime",
                             "args": ["--stand-in-backend", "slime", "--stand-in-bytes-per-token", str(64 * 1024),
                                      "--rollout-batch-size", "4", "--n-samples-per-prompt", "4"]}}}))
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--trainer-root", str(stand_in),
            "--dumps-root", str(tmp_path / "dumps"), "--results", str(results)]
    ran = run_in_memory_cgroup(argv, tmp_path)
    stdout, stderr, left, kills = ran.stdout, ran.stderr, ran.left, ran.oom_kills
    assert ran.returncode == 4, (stdout + stderr)[-4000:]
    assert not left, f"processes of the run left in its cgroup: {left}"
    assert kills >= 1
    log = (results / "trainer.log").read_text()
    assert '"rollout_id": 0' in log and '"trained_mib": 32' in log  # rollout 0's step fit (512 tokens: 32 MiB)

    report = json.loads((results / "report.json").read_text())
    oom = report["out_of_memory"]
    assert report["outcome"] == "outOfMemory" and report["backend"] == "slime" and report["exit_code"] != 0
    assert oom["signal"] in ("kernelOomKiller", "rayMemoryMonitor") and oom["where"]["component"] == "trainer"
    if oom["signal"] == "kernelOomKiller":
        assert oom["how_much"]["limit_bytes"] == LIMIT
    assert report["partial"] is True and "out of memory" in report["error"]
    progress = json.loads((results / "progress.json").read_text())
    assert progress["result"]["phase"] == "Failed" and progress["result"]["outcome"] == "outOfMemory"
    assert not (results / ".forge-replay.lock").exists()
    assert f"forge-replay run {job}: out of memory ({oom['signal']})" in stderr


STRETCH = (512, 576)
"""The first axis, replay.stretch.maxTokens: the dump's own length, then a little longer. It is there to put a point
that fits after one that runs out of memory (the last axis varies fastest; its values increase)."""
SMALL, LARGE = 1024, 16 * 512
"""The last axis, trainer.microBatchTokens; the sweep's dump is 16 samples of 512 tokens, one micro-batch at LARGE."""
SWEEP_LIMIT = 5 * 2**29
"""2.5 GiB: a point of 1024 tokens per micro-batch fits (measured here: its rank 1.1 GiB of RSS at most, the whole
run 1.9); one of 8192 tokens does not (0.5 GiB of logits, as much again for their log-probs and their gradients:
its rank alone about 2.6 GiB, tests/integration/test_sweep.py)."""


def sweep_job(tmp_path: Path) -> Path:
    """A debug-mode grid of replay.stretch.maxTokens x trainer.microBatchTokens: in grid order a point that fits,
    one that runs out of memory, one that fits, one that runs out."""
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    save(dumps / "fixed.pt", 0, synth_samples(0, 4, 4, 16, STRETCH[0] - 16, vocab_size=VOCAB))
    job = tmp_path / "sweep.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "oom-sweep"},
        "spec": {"replay": {"mode": "debug", "dumps": {"claimName": "dumps", "path": "fixed.pt"}, "numRollouts": 2},
                 "model": {"config": TINY},
                 "trainer": {"nodes": 1, "gpusPerNode": 0, "microBatchTokens": SMALL, "dtype": "float32",
                             "gradientCheckpointing": False, "nSamplesPerPrompt": 4},
                 "sweep": {"search": "grid", "budgetGiB": 2.5, "headroom": 0.0, "rolloutsPerPoint": 2,
                           "axes": [{"field": "replay.stretch.maxTokens", "values": list(STRETCH)},
                                    {"field": "trainer.microBatchTokens", "values": [SMALL, LARGE]}]},
                 # met only by the point run after an out-of-memory one
                 "expect": {"frontier": [{"at": {"replay.stretch.maxTokens": STRETCH[1]},
                                          "fits": {"trainer.microBatchTokens": SMALL}}]}}}))
    return job


def test_a_sweep_records_a_point_that_runs_out_of_memory_and_runs_the_next(tmp_path, record_property):
    """`forge-replay run` of a sweep in a 2.5 GiB cgroup: the kernel kills the trainer rank at each point of 8192
    tokens per micro-batch; each is recorded (outcome outOfMemory, the signal, where, when) and the point after the
    first runs whole on a new rank. The sweep's result is its points: exit 0, the frontier, its verdict met."""
    job = sweep_job(tmp_path)
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--no-progress",
            "--dumps-root", str(tmp_path / "dumps"), "--results", str(results)]
    began = time.monotonic()
    ran = run_in_memory_cgroup(argv, tmp_path, SWEEP_LIMIT)
    record_property("sweep_seconds", round(time.monotonic() - began, 1))
    output = ran.stdout + ran.stderr
    # Points that ran out of memory are the sweep's findings, not its failure: exit 0, the frontier verdict met.
    assert ran.returncode == 0, output[-4000:]
    assert not ran.left, f"processes of the run left in its cgroup: {ran.left}"
    assert not (results / ".forge-replay.lock").exists()  # the results folder is unlocked

    report = json.loads((results / "report.json").read_text())
    sweep = report["sweep"]
    assert report["error"] is None and report["partial"] is False and report["outcome"] is None
    points = sweep["points"]
    assert [(p["values"]["replay.stretch.maxTokens"], p["values"]["trainer.microBatchTokens"], p["outcome"])
            for p in points] == [(STRETCH[0], SMALL, "fits"), (STRETCH[0], LARGE, "outOfMemory"),
                                 (STRETCH[1], SMALL, "fits"), (STRETCH[1], LARGE, "outOfMemory")], points
    assert sweep["points_run"] == 4 == sweep["grid_points"]
    signals, killed = [], []
    for index, point in enumerate(points, start=1):
        own = json.loads((results / "points" / f"{index:02d}" / "report.json").read_text())
        assert own["outcome"] == point["outcome"]
        if point["outcome"] == "outOfMemory":  # the killed step, said where and how
            oom = own["out_of_memory"]
            signals.append(oom["signal"])
            killed.append(oom["where"]["pid"])
            assert oom["signal"] in ("kernelOomKiller", "rayMemoryMonitor")
            if oom["signal"] == "kernelOomKiller":
                assert oom["how_much"]["limit_bytes"] == SWEEP_LIMIT
            assert oom["where"]["component"] == "trainer" and oom["where"]["rank"] == 0 and oom["where"]["pid"] > 0
            assert oom["when"]["rollout"] == 0 and oom["when"]["phase"] in ("forward", "backward")
            assert point["fits"] is False and point["step_seconds"] == [] and own["completed"] == 0
            assert point["message"].startswith(f"out of memory ({oom['signal']}): rank 0")
        else:  # the point after the first out-of-memory one ran whole: both steps, under the budget
            assert point["fits"] is True and len(point["step_seconds"]) == 2 and own["completed"] == 2
            assert 0 < point["peak_gib"] <= 2.5
    record_property("oom_signals", ",".join(signals))
    assert len(set(killed)) == 2  # each point its own rank: the one killed at point 2 came back as a new one
    assert ran.oom_kills - ran.oom_kills_before >= max(1, signals.count("kernelOomKiller"))  # the kernel's count
    assert [(f["at"], f["value"], f["complete"]) for f in sweep["frontier"]] == [
        ({"replay.stretch.maxTokens": s}, SMALL, True) for s in STRETCH]
    assert report["expectations"][0]["name"] == "frontier" and report["expectations"][0]["passed"]
    progress = json.loads((results / "progress.json").read_text())["sweep"]
    assert progress["pointsDone"] == 4 and progress["outOfMemory"] == 2 and progress["finished"]
    assert "sweep point 3" in output and "sweep point 4" in output
