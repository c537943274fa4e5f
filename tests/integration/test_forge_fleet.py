"""The forge-mode engine fleet on a real local Ray with real engine processes (the sglang test double).

Drives :class:`EngineFleet` through the hooks the rollout manager calls, over the fault-tolerance
matrix: which monitors, fault injections and recoveries happen, weight pushes per step with
versions advancing, engines alive until shutdown and gone after.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from forge_replay.api import parse_job
from forge_replay.api.outcome import RanOutOfMemory
from forge_replay.runtime.engines.eval_fleet import EvalFleetUnhealthy
from forge_replay.runtime.engines.faults import FAULTS_ENV
from forge_replay.runtime.engines.fleet import EngineDead, EngineFleet
from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.gating import plan_rollout_side
from tests.integration.processes import pid_alive

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"


def make_job(ft_enabled: bool = False, components: list[str] | None = None, engines: int = 2, *,
             model: dict | None = None, engine_args: dict | None = None, dtype: str | None = None):
    ft: dict = {"enabled": ft_enabled, "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2}}
    if components is not None:
        ft["components"] = components
    return parse_job({
        "apiVersion": "forgereplay.io/v1alpha1",
        "kind": "ForgeReplayJob",
        "metadata": {"name": "fleet-test"},
        "spec": {
            "replay": {"mode": "forge", "dumps": {"claimName": "d", "path": "rollout_{rollout_id}.pt"}, "numRollouts": 2},
            "model": {"config": model or {"architectures": ["LlamaForCausalLM"], "hidden_size": 16}},
            "trainer": {"gpusPerNode": 0, **({"dtype": dtype} if dtype else {})},
            "rollout": {"numGpus": engines, "numGpusPerEngine": 1,
                        "engineArgs": engine_args or {"context-length": "256"}},
            "faultTolerance": ft,
        },
    })


class Records:
    """What the double processes recorded under one directory."""

    def __init__(self, directory: Path):
        self.dir = directory

    def ports(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.dir.glob("start-*.json"))

    def starts(self, port: int) -> list[dict]:
        return [json.loads(line) for line in (self.dir / f"starts-{port}.jsonl").read_text().splitlines()]

    def calls(self, port: int) -> list[dict]:
        path = self.dir / f"calls-{port}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def paths(self, port: int) -> list[str]:
        return [c["path"] for c in self.calls(port)]

    def stopped(self, port: int) -> bool:
        return (self.dir / f"stop-{port}.json").exists()


def new_fleet(job, tmp_path: Path, double_flags: str = "") -> tuple[EngineFleet, Records]:
    record_dir = tmp_path / "double"
    command = f"{sys.executable} {DOUBLE} --record-dir {record_dir} {double_flags}"
    fleet = EngineFleet.from_job(job, engine_command=command, model_root=None, work_dir=tmp_path / "work",
                                 startup_timeout_s=180)  # sglang's own parser, imported at start, is slow
    return fleet, Records(record_dir)


def weights(step: int) -> dict:
    return {"layer.weight": torch.full((4, 4), float(step))}


def run_steps(fleet: EngineFleet, steps: int, eval_every: int = 0) -> None:
    for step in range(steps):
        fleet.before_generate(step)
        fleet.before_train_step(step)
        fleet.after_train_step(step, weights(step))
        if eval_every and (step + 1) % eval_every == 0:
            fleet.before_eval((step + 1) // eval_every)


def test_engines_launched_pushed_every_step_alive_until_shutdown_then_gone(tmp_path):
    fleet, records = new_fleet(make_job(), tmp_path)
    fleet.start()
    try:
        run_steps(fleet, 3)
        ports = records.ports()
        assert len(ports) == 2
        url_of = {int(url.rsplit(":", 1)[1]): url for url in fleet.report()["urls"]}
        pids = [records.starts(port)[-1]["pid"] for port in ports]
        assert all(pid_alive(pid) for pid in pids)  # alive at the end of the run
        for port in ports:
            start = records.starts(port)[0]
            assert start["known"]["load_format"] == "dummy" and start["known"]["skip_server_warmup"]
            real_parser = start["sglang_parser"].startswith("real")  # sglang's own parser knows every flag we pass
            assert start["unknown"] == ([] if real_parser else ["--context-length", "256"])
            assert start["known"]["skip_tokenizer_init"] and start["known"]["dtype"] == "bfloat16"  # the trainer's
            assert json.loads(Path(start["known"]["model_path"], "config.json").read_text())["hidden_size"] == 16
            pushes = [c["body"] for c in records.calls(port) if c["path"] == "/update_weights_from_disk"]
            assert [p["weight_version"] for p in pushes] == ["1", "2", "3"]  # one per step, advancing
            assert engine_call(url_of[port], "/model_info")["weight_version"] == "3"
            assert {c["body"]["load_format"] for c in records.calls(port)
                    if c["path"] == "/update_weights_from_disk"} == {"safetensors"}
            assert records.paths(port).count("/flush_cache") == 3
            assert records.paths(port)[0] == "/health_generate"  # health-checked before use
        report = fleet.report()
        assert report["engines"] == 2 and report["weight_versions"] == ["1", "2", "3"]
        assert report["restarts"] == 0 and report["health_monitors"] == 0 and report["memory_held_gib"] is None
    finally:
        fleet.shutdown()
    assert all(records.stopped(port) for port in ports)
    assert not any(pid_alive(pid) for pid in pids)  # gone after, no orphans


FT_MATRIX = [
    # enabled, components, rollout FT (monitor + injection + recovery)
    (False, None, False),
    (True, ["train"], False),
    (True, ["rollout"], True),
    (True, ["train", "rollout"], True),
]


@pytest.mark.parametrize(("enabled", "components", "rollout_ft"), FT_MATRIX)
def test_ft_matrix_monitors_injections_recoveries(tmp_path, monkeypatch, enabled, components, rollout_ft):
    monkeypatch.setenv(FAULTS_ENV, "kill-engine:step=0,engine=1")
    job = make_job(enabled, components)
    fleet, records = new_fleet(job, tmp_path)
    assert fleet.plan == plan_rollout_side("forge", enabled, job.spec.fault_tolerance.active_components)
    fleet.start()
    try:
        run_steps(fleet, 2, eval_every=1)
        report = fleet.report()
        ports = records.ports()
        engine1_port = int(report["urls"][1].rsplit(":", 1)[1])
    finally:
        fleet.shutdown()
    assert report["health_monitors"] == (1 if rollout_ft else 0)
    assert report["faults_injected"] == (["kill-engine:step=0,engine=1"] if rollout_ft else [])
    assert report["restarts_by_engine"] == ([0, 1] if rollout_ft else [0, 0])
    assert (report["faults_ignored"] is None) == rollout_ft  # a set variable is reported, never silently dropped
    assert len(records.starts(engine1_port)) == (2 if rollout_ft else 1)
    # monitored engines get probes from the monitor; otherwise the eval fleet probes itself, once per eval
    assert report["eval_self_probes"] == (0 if rollout_ft else 2 * 2)
    assert report["weight_versions"] == ["1", "2"]
    for port in ports:  # the recovered engine got the latest weights too
        assert [c["body"]["weight_version"] for c in records.calls(port)
                if c["path"] == "/update_weights_from_disk"][-1] == "2"
    assert all(records.stopped(port) for port in ports)


def test_train_only_ft_sends_the_engines_exactly_what_no_ft_sends(tmp_path):
    """The miles determinism bug: train-only FT must not add one call to the rollout engines."""
    sequences = []
    for name, job in (("off", make_job()), ("train", make_job(True, ["train"]))):
        fleet, records = new_fleet(job, tmp_path / name)
        fleet.start()
        try:
            run_steps(fleet, 2, eval_every=1)
        finally:
            fleet.shutdown()
        sequences.append(sorted(
            [(c["method"], c["path"]) for c in records.calls(port)] for port in records.ports()
        ))
    assert sequences[0] == sequences[1]


def test_monitor_stops_an_unhealthy_engine_and_recovery_restarts_it_before_the_sync(tmp_path):
    fleet, records = new_fleet(make_job(True, ["rollout"]), tmp_path)
    fleet.start()
    try:
        run_steps(fleet, 1)
        fleet.before_generate(1)
        bad_url = fleet.report()["urls"][0]
        engine_call(bad_url, "/_double/health", method="POST", body={"healthy": False})
        deadline = time.monotonic() + 15
        while fleet.report()["health_failures"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.report()["health_failures"] == 1
        port = int(bad_url.rsplit(":", 1)[1])
        assert not pid_alive(records.starts(port)[0]["pid"])  # the monitor stopped it
        fleet.before_train_step(1)
        fleet.after_train_step(1, weights(1))
        report = fleet.report()
        assert report["restarts_by_engine"] == [1, 0] and report["weight_versions"] == ["1", "2"]
        assert engine_call(bad_url, "/model_info")["weight_version"] == "2"
    finally:
        fleet.shutdown()


def test_train_only_ft_never_recovers_a_killed_engine_and_the_eval_fleet_notices(tmp_path):
    fleet, records = new_fleet(make_job(True, ["train"]), tmp_path)
    fleet.start()
    try:
        run_steps(fleet, 1)
        victim = fleet.report()["urls"][0]
        port = int(victim.rsplit(":", 1)[1])
        os.killpg(records.starts(port)[0]["pgid"], signal.SIGKILL)  # the engine dies mid-run
        time.sleep(0.5)
        with pytest.raises(EvalFleetUnhealthy, match=f"eval 1: .*engine 0 at {victim}"):
            fleet.before_eval(1)
        fleet.before_generate(1)
        fleet.before_train_step(1)
        with pytest.raises(EngineDead, match="step 1: engine 0 .* is dead .*not restarted"):
            fleet.after_train_step(1, weights(1))
        report = fleet.report()
        assert report["restarts"] == 0 and report["health_monitors"] == 0 and len(records.starts(port)) == 1
    finally:
        fleet.shutdown()
    assert all(records.stopped(p) for p in records.ports() if p != port)


def test_engines_that_never_get_healthy_fail_the_start_and_leave_nothing_behind(tmp_path):
    fleet, records = new_fleet(make_job(engines=1), tmp_path)
    fleet.command = [sys.executable, str(DOUBLE), "--record-dir", str(records.dir), "--startup-delay", "30"]
    fleet.settings = type(fleet.settings)(**{**fleet.settings.__dict__, "startup_timeout_s": 2})
    with pytest.raises(Exception, match="not healthy within 2 s"):
        fleet.start()
    fleet.shutdown()
    assert records.ports() == []


def test_colocated_engines_release_memory_for_training_and_resume_before_the_push(tmp_path):
    """colocate needs GPUs in a valid spec; the release/resume sequence itself is checked here on CPU."""
    import dataclasses

    fleet, records = new_fleet(make_job(True, ["rollout"], engines=1), tmp_path)
    fleet.settings = dataclasses.replace(fleet.settings, colocate=True)
    fleet.start()
    try:
        url = fleet.report()["urls"][0]
        fleet.before_generate(0)
        fleet.before_train_step(0)
        fleet.before_generate(1)  # the driver prefetches the next rollout while training
        assert fleet.monitor.paused  # a released engine answers 503: the monitor must not probe it
        with pytest.raises(Exception, match="503"):
            engine_call(url, "/health_generate")
        time.sleep(1.5)  # a monitor interval passes while training
        fleet.after_train_step(0, weights(0))
        assert fleet.report()["health_failures"] == 0 and fleet.report()["restarts"] == 0
        port = int(url.rsplit(":", 1)[1])
        paths = [p for p in records.paths(port) if p not in ("/health_generate", "/_double/health")]
        assert paths == ["/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk",
                         "/model_info", "/flush_cache"]
        assert records.starts(port)[0]["known"]["enable_memory_saver"]  # else the release frees nothing
    finally:
        fleet.shutdown()


def test_colocated_engines_are_pinned_to_the_bundle_of_the_trainer_rank_on_their_first_gpu(tmp_path):
    """A 0-resource engine actor could land on any node (a GPU-less head too): colocated engines go into the
    trainer's placement group, at the bundle of the rank whose GPU is the engine's first."""
    import dataclasses

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 0.01}] * 4, strategy="PACK")
    ray.get(group.ready(), timeout=60)
    try:
        fleet, _ = new_fleet(make_job(engines=2), tmp_path)
        fleet.settings = dataclasses.replace(fleet.settings, colocate=True, use_gpus=True, gpus_per_node=4,
                                             gpus_per_engine=2)
        fleet.trainer_placement = group
        for index, (bundle, base_gpu) in enumerate([(0, 0), (2, 2)]):
            options, base = fleet._actor_options(index)
            strategy = options["scheduling_strategy"]
            assert strategy.placement_group == group and strategy.placement_group_bundle_index == bundle
            assert base == base_gpu and "num_gpus" not in options  # shares the trainer's GPUs, holds none
    finally:
        remove_placement_group(group)


# ---------------------------------------------------------------------------------------------- out of memory

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
}
TINY_WEIGHTS = 25696 * 4
"""Its weights in float32 (tests/unit/test_engine_oom.py checks the double counts them so); a token of KV cache
takes 1 KV head * (16 + 16) * 1 layer * 4 bytes = 128 bytes."""


def oom_job(fraction: str, engines: int, ft: bool = False):
    return make_job(ft, ["rollout"] if ft else None, engines, model=TINY_LLAMA, dtype="float32",
                    engine_args={"mem-fraction-static": fraction})


def test_an_engine_whose_kv_cache_does_not_fit_fails_the_start_out_of_memory_naming_it(tmp_path):
    """A stand-in GPU on which the weights fit at mem-fraction-static 0.5 but leave under one token of KV cache:
    sglang's own MemoryPoolConfig refuses it in the double, which ends as sglang's server ends (SIGKILL)."""
    device_gib = (TINY_WEIGHTS + 64) / 0.5 / (1 << 30)
    fleet, records = new_fleet(oom_job("0.5", engines=1), tmp_path, f"--double-gpu-memory-gib {device_gib!r}")
    try:
        with pytest.raises(RanOutOfMemory) as raised:
            fleet.start()
    finally:
        fleet.shutdown()
    record = raised.value.record
    start = records.starts(records.ports()[0])
    assert len(start) == 1 and start[0]["memory"]["max_total_num_tokens"] == 0  # what the double decided
    assert start[0]["memory"]["refusal"].startswith("RuntimeError: Not enough memory.")
    assert record.signal == "sglangRefusal" and record.where.component == "engine" and record.where.engine == 0
    assert record.where.pid == start[0]["pid"] and record.when.phase == "engineStart"
    assert "mem-fraction-static 0.5" in record.message
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in record.message
    assert str(raised.value).startswith("out of memory (sglangRefusal): engine 0")
    log = (tmp_path / "work" / "engine-logs" / "engine-0.log").read_text()
    assert "Scheduler hit an exception:" in log and "Received sigquit from a child process" in log
    assert not pid_alive(start[0]["pid"])


def test_an_engine_that_runs_out_of_memory_serving_is_not_restarted_and_names_the_rollout(tmp_path):
    """A 1 MiB stand-in GPU at mem-fraction-static 0.9: the engines start and take weights, then a generation batch
    of 200 tokens needs more than stays free on engine 1, which dies as sglang's server dies (the request left
    unanswered). With rollout FT the next weight sync would restart a dead engine: this one is not (it would never
    fit), the sync raises its out-of-memory."""
    fleet, records = new_fleet(oom_job("0.9", engines=2, ft=True), tmp_path, "--double-gpu-memory-gib 0.0009765625")
    fleet.start()
    try:
        run_steps(fleet, 1)
        fleet.before_generate(1)
        victim = fleet.report()["urls"][1]
        with pytest.raises(EngineHTTPError, match="failed"):  # no answer: the connection dropped
            engine_call(victim, "/generate", method="POST", body={"input_ids": [list(range(200))]}, timeout_s=60)
        fleet.before_train_step(1)
        with pytest.raises(RanOutOfMemory) as raised:
            fleet.after_train_step(1, weights(1))
        report = fleet.report()
    finally:
        fleet.shutdown()
    record = raised.value.record
    port = int(victim.rsplit(":", 1)[1])
    assert record.where.engine == 1 and record.when.phase == "engineServing" and record.when.rollout == 1
    assert record.where.pid == records.starts(port)[0]["pid"]
    assert record.message.count("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == 1
    decided = [c["body"]["double"]["out_of_memory"] for c in records.calls(port) if c["status"] is None]
    assert record.how_much.requested_bytes == pytest.approx(decided[0]["requested_bytes"], rel=0.01)
    assert record.how_much.device_total_bytes == 1 << 20
    assert len(records.starts(port)) == 1 and report["restarts"] == 0  # never restarted
    assert report["weight_versions"] == ["1"]
    assert not any(pid_alive(records.starts(p)[-1]["pid"]) for p in records.ports())
