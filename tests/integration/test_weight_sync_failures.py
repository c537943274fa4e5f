"""How weight sync fails, run through `forge-replay run` as a user would (CPU, gloo, the sglang double made to
misbehave with its double-only flags): bounded time, one clear line naming the engine, no process left behind,
and with rollout FT an engine that died in a push is restarted and the push done again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.processes import pid_alive
from tests.integration.test_forge_run import DOUBLE, job_file, records

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FT = {"enabled": True, "components": ["rollout"], "healthCheck": {"intervalSeconds": 30, "timeoutSeconds": 5}}


def run(tmp_path: Path, *, double_flags: str = "", weight_sync: str = "distributed", ft: dict | None = None,
        rollouts: int = 2, nodes: int = 1, dtype: str = "float32", bucket_bytes: int | None = None):
    """`forge-replay run` with the double as engine; (result, seconds from every engine being up to the run's end:
    the part a stuck collective would stretch, without Ray's start-up and the engines' own, which with sglang
    installed includes importing sglang's argument parser)."""
    job = job_file(tmp_path, ft=ft, rollouts=rollouts, weight_sync=weight_sync, nodes=nodes)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["trainer"]["dtype"] = dtype
    job.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--no-progress",
            "--dumps-root", str(tmp_path / "dumps"), "--results", str(tmp_path / "results"),
            "--engine-command", f"{sys.executable} {DOUBLE} --record-dir {tmp_path / 'double'} {double_flags}"]
    env = {**os.environ}
    if bucket_bytes:
        env["FORGE_REPLAY_WEIGHT_BUCKET_BYTES"] = str(bucket_bytes)
    began = time.time()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    ended = time.time()
    engines_up = max((min(s["time"] for s in e["starts"]) for e in records(tmp_path).values()), default=began)
    return result, ended - engines_up


def no_engine_left(tmp_path: Path) -> None:
    engines = records(tmp_path)
    assert engines
    for engine in engines.values():
        assert not any(pid_alive(start["pid"]) for start in engine["starts"]), "an engine process outlived the run"


def failure_line(result) -> str:
    """The run's error: one line, no traceback."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("forge-replay run ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_server_without_the_distributed_endpoints_fails_fast_with_the_disk_hint(tmp_path):
    """Trainer rank 0 waits in the group's rendezvous for engines that will never come: the run must not wait
    the 600 s group timeout (nor the 60 s trainer shutdown) once the engines answered 404."""
    result, took = run(tmp_path, double_flags="--missing-endpoint /init_weights_update_group")
    line = failure_line(result)
    assert "/init_weights_update_group" in line and "404" in line
    assert "weightSync: disk" in line and "trainer rank 0 was still inside the weight-sync group" in line
    assert took < 60, f"took {took:.0f} s"
    no_engine_left(tmp_path)


def test_one_engine_failing_to_join_fails_the_run_while_the_other_waits_in_the_rendezvous(tmp_path):
    """Engine A answers 400 to /init_weights_update_group; engine B joined and waits for the group to form (60 s
    in the double, longer in sglang): the run must fail on A's answer, not once B gives up."""
    result, took = run(tmp_path, double_flags="--refuse-group-join")
    line = failure_line(result)
    assert "--refuse-group-join" in line and "/init_weights_update_group" in line
    assert took < 45, f"took {took:.0f} s"
    no_engine_left(tmp_path)


def test_an_engine_dying_mid_broadcast_without_rollout_ft_fails_the_run_naming_it(tmp_path):
    """Engine 0 exits after the first tensor of bucket 2 (of several: small buckets; the embedding is larger
    than a bucket and travels alone): the run fails within seconds naming the dead engine; nothing hangs."""
    result, took = run(tmp_path, double_flags="--die-during-broadcast 2", bucket_bytes=16_384)
    line = failure_line(result)
    assert "EngineDead" in line and "died during the weight push" in line and "exit code 17" in line
    assert took < 60, f"took {took:.0f} s"
    no_engine_left(tmp_path)


def test_with_rollout_ft_an_engine_dying_mid_broadcast_is_restarted_and_gets_every_version(tmp_path):
    """One engine dies in bucket 2 of step 0's push (the double lets only the first one die): with rollout FT it
    is restarted, the survivor leaves the broken group, a new group is formed, the push is done again, and
    every later step goes through. Two trainer ranks: the one that is not rank 0 must not be left waiting in
    a gather rank 0 left."""
    result, took = run(tmp_path, double_flags="--die-during-broadcast 2", ft=FT, rollouts=3, nodes=2,
                       bucket_bytes=16_384)
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < 120, f"took {took:.0f} s"
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["weight_versions"] == ["1", "2", "3"] and sorted(report["restarts_by_engine"]) == [0, 1]
    assert "died during it: restarting it and pushing again" in result.stderr
    engines = records(tmp_path)
    for engine in engines.values():
        inits = [c["body"]["group_name"] for c in engine["calls"] if c["path"] == "/init_weights_update_group"]
        assert inits == ["forge-replay-weights-1", "forge-replay-weights-2"]
        taken = [c["body"]["weight_version"] for c in engine["calls"] if c["path"] == "/update_weights_from_distributed"
                 and c["body"]["weight_version"] and "received" in c["body"]]
        assert taken == ["1", "2", "3"]  # version 1 once: the failed push never set it
    survivor = next(e for e in engines.values() if len(e["starts"]) == 1)
    left = [c["body"]["group_name"] for c in survivor["calls"] if c["path"] == "/destroy_weights_update_group"]
    assert left == ["forge-replay-weights-1"]
    no_engine_left(tmp_path)


def test_disk_path_with_rollout_ft_pushes_again_to_an_engine_that_died_in_the_push(tmp_path):
    """The same promise on the disk path: an engine exits on its second /update_weights_from_disk (step 1); with
    rollout FT it is restarted and gets version 2 in the same step, and the run completes."""
    result, _ = run(tmp_path, weight_sync="disk", double_flags="--die-during-disk-push 2", ft=FT, rollouts=3)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["weight_versions"] == ["1", "2", "3"] and sorted(report["restarts_by_engine"]) == [0, 1]
    for engine in records(tmp_path).values():
        versions = [c["body"]["weight_version"] for c in engine["calls"] if c["path"] == "/update_weights_from_disk"]
        assert versions[-2:] == ["2", "3"]
    no_engine_left(tmp_path)


def test_with_rollout_ft_an_engine_dying_after_the_push_before_its_version_check_is_pushed_again(tmp_path):
    """The engine took version 1, then died before /model_info answered: with rollout FT the sync is
    not over until every engine confirmed, so it is restarted and pushed version 1 again."""
    result, _ = run(tmp_path, double_flags="--die-on-version-check", ft=FT, rollouts=2)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["weight_versions"] == ["1", "2"] and sorted(report["restarts_by_engine"]) == [0, 1]
    no_engine_left(tmp_path)


def test_an_engine_refusing_a_bucket_fails_the_run_even_with_rollout_ft(tmp_path):
    """sglang answers success: false once it received a bucket it could not load (its weights are then partly
    updated): the run fails naming the engine and the bucket, FT or not (a restart would not explain it), and
    the other engine got the rest of the buckets, so no member waits in the collective."""
    result, took = run(tmp_path, double_flags="--refuse-bucket 2", ft=FT, bucket_bytes=16_384)
    line = failure_line(result)
    assert "engine 0:" in line and "engine 1:" in line and "bucket 2/" in line and "--refuse-bucket" in line
    assert took < 60, f"took {took:.0f} s"
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["weight_versions"] == [] and report["restarts"] == 0
    for engine in records(tmp_path).values():
        buckets = [c for c in engine["calls"] if c["path"] == "/update_weights_from_distributed"]
        assert buckets[-1]["body"]["weight_version"] == "1" and "received" in buckets[-1]["body"]  # nobody left waiting
    no_engine_left(tmp_path)


def test_bfloat16_weights_over_gloo_reach_the_engines_as_bfloat16(tmp_path):
    result, _ = run(tmp_path, dtype="bfloat16", rollouts=1, bucket_bytes=16_384)
    assert result.returncode == 0, result.stderr[-3000:]
    for engine in records(tmp_path).values():
        buckets = [c["body"] for c in engine["calls"] if c["path"] == "/update_weights_from_distributed"]
        assert len(buckets) > 2 and {d for b in buckets for d in b["dtypes"]} == {"bfloat16"}
        assert sum(b["received"]["tensors"] for b in buckets) == sum(len(b["names"]) for b in buckets)
        assert all(b["received"]["abs_sum"] > 0 for b in buckets)


def test_trainer_rank_0_cannot_form_the_group_on_a_taken_port_says_where(tmp_path):
    """The rendezvous port is taken (another process got it between choosing and binding): rank 0 fails at once
    with the address, not after the group timeout."""
    import socket

    from forge_replay.runtime.trainer.rank import TrainerRank
    from forge_replay.runtime.weights.calls import WeightSyncError
    from forge_replay.runtime.weights.distributed import plan_weight_group

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        group = plan_weight_group("127.0.0.1", port, [1], "gloo", 7)
        rank = TrainerRank.__new__(TrainerRank)
        rank.rank, rank.weight_group = 0, None
        began = time.monotonic()
        with pytest.raises(WeightSyncError, match=rf"forge-replay-weights-7 \(gloo\) at 127.0.0.1:{port}"):
            rank.join_weight_group(group, timeout_s=600)
        assert time.monotonic() - began < 30


def test_bucket_plan_keeps_order_and_sends_a_parameter_larger_than_a_bucket_alone(monkeypatch):
    from forge_replay.runtime.weights.distributed import (
        BUCKET_BYTES_ENV,
        ParamMeta,
        bucket_bytes_from_env,
        plan_buckets,
    )

    metas = [ParamMeta(name, (n,), "float32", 4 * n) for name, n in [("a", 2), ("b", 2), ("big", 100), ("c", 4)]]
    assert [[p.name for p in b] for b in plan_buckets(metas, bucket_bytes=16)] == [["a", "b"], ["big"], ["c"]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(metas, bucket_bytes=0)
    monkeypatch.setenv(BUCKET_BYTES_ENV, "4096")
    assert bucket_bytes_from_env() == 4096
    monkeypatch.setenv(BUCKET_BYTES_ENV, "4k")
    with pytest.raises(ValueError, match=BUCKET_BYTES_ENV):
        bucket_bytes_from_env()
