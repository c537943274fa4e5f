"""One engine process (the sglang HTTP test double) started, probed, pushed to, monitored, stopped.

No Ray here: these are the process-level guarantees the engine actors rely on.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from forge_replay.runtime.engines.actor import EngineActor
from forge_replay.runtime.engines.eval_fleet import EvalFleet, EvalFleetUnhealthy
from forge_replay.runtime.engines.health import HealthMonitor
from forge_replay.runtime.engines.http import engine_call
from forge_replay.runtime.engines.process import (
    EngineProcess,
    EngineStartError,
    ModelSource,
    build_engine_argv,
    free_port,
    probe_health,
)
from forge_replay.runtime.weights.calls import WeightSyncError
from forge_replay.runtime.weights.disk import push_weights_from_disk, write_versioned_checkpoint
from tests.integration.processes import pid_alive

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"


def calls(record_dir: Path, port: int) -> list[dict]:
    path = record_dir / f"calls-{port}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_double(tmp_path: Path, *double_args: str) -> tuple[EngineProcess, int]:
    port = free_port()
    model = ModelSource(str(tmp_path), "dummy", from_config=True)
    argv = build_engine_argv(
        [sys.executable, str(DOUBLE), "--record-dir", str(tmp_path / "rec"), *double_args],
        host="127.0.0.1", port=port, model=model, tp_size=1, engine_args={"context-length": "128"},
    )
    process = EngineProcess(argv, f"http://127.0.0.1:{port}", tmp_path / f"engine-{port}.log")
    process.start()
    process.wait_healthy(30)
    return process, port


@pytest.fixture
def engine(tmp_path):
    process, port = start_double(tmp_path)
    yield process, port, tmp_path / "rec"
    process.stop()


def test_a_server_without_the_check_endpoints_is_pushed_to_and_the_gap_reported(tmp_path):
    process, port = start_double(tmp_path, "--missing-endpoint", "/get_weight_version",
                                 "--missing-endpoint", "/flush_cache")
    try:
        checkpoint = write_versioned_checkpoint({"w": torch.ones(1)}, tmp_path / "weights", 1)
        result = push_weights_from_disk(process.url, checkpoint, "1")
        assert result.confirmed_version is None
        assert result.unsupported == ("/get_weight_version", "/flush_cache")
    finally:
        process.stop()


def test_a_push_the_server_did_not_apply_fails_with_both_versions(tmp_path):
    process, port = start_double(tmp_path, "--pin-weight-version")
    try:
        checkpoint = write_versioned_checkpoint({"w": torch.ones(1)}, tmp_path / "weights", 1)
        with pytest.raises(WeightSyncError, match="reports weight version 'default' after loading version '1'"):
            push_weights_from_disk(process.url, checkpoint, "1")
    finally:
        process.stop()


def test_engine_gets_sglang_arguments_and_stops_as_a_group(engine):
    process, port, rec = engine
    start = json.loads((rec / f"start-{port}.json").read_text())
    assert start["known"]["skip_server_warmup"] and start["known"]["load_format"] == "dummy"
    assert start["unknown"] == ["--context-length", "128"]
    assert start["pgid"] == start["pid"] == process.pid  # its own process group
    assert calls(rec, port)[-1]["path"] == "/health_generate"
    assert process.stop() == 0
    assert (rec / f"stop-{port}.json").exists() and not pid_alive(start["pid"])


def test_weight_push_checks_version_and_flushes(engine, tmp_path):
    process, port, rec = engine
    checkpoint = write_versioned_checkpoint({"w": torch.ones(2, 2)}, tmp_path / "weights", 1)
    result = push_weights_from_disk(process.url, checkpoint, "1")
    assert result.confirmed_version == "1"
    sequence = [(c["method"], c["path"]) for c in calls(rec, port) if c["path"] != "/health_generate"]
    assert sequence == [("POST", "/update_weights_from_disk"), ("GET", "/get_weight_version"), ("GET", "/flush_cache")]
    with pytest.raises(WeightSyncError, match="refused the weights in .*nothing-here.*is not a directory"):
        push_weights_from_disk(process.url, tmp_path / "nothing-here", "2")


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('cannot load model'); sys.exit(3)"]
    process = EngineProcess(argv, "http://127.0.0.1:1", tmp_path / "bad.log")
    process.start()
    with pytest.raises(EngineStartError, match="(?s)exited with code 3.*cannot load model"):
        process.wait_healthy(30)


def test_monitor_stops_an_unhealthy_engine_and_stays_quiet_while_paused(engine):
    process, port, rec = engine
    stopped = threading.Event()

    def stop_engine(index: int, problem: str) -> None:
        process.kill()
        stopped.set()

    monitor = HealthMonitor(
        "rollout", lambda: [(0, process.url)] if process.alive() else [],
        probe_health, stop_engine, interval_s=0.1, timeout_s=2,
    )
    monitor.start()
    time.sleep(0.5)
    monitor.pause()
    probes_when_paused = len(calls(rec, port))
    time.sleep(0.5)
    assert len(calls(rec, port)) == probes_when_paused  # paused: not one probe
    assert monitor.counters.probes >= 2 and monitor.counters.failures == 0
    engine_call(process.url, "/_double/health", method="POST", body={"healthy": False})
    monitor.resume()
    assert stopped.wait(10)
    monitor.stop()
    assert monitor.counters.failures == 1 and monitor.counters.engines_stopped == [0]
    assert not process.alive()


def test_eval_fleet_self_probe_names_the_unhealthy_engine(engine):
    process, port, rec = engine
    fleet = EvalFleet(lambda: [(0, process.url)], self_probe=True, timeout_s=2)
    fleet.before_use(1)
    engine_call(process.url, "/_double/health", method="POST", body={"healthy": False})
    with pytest.raises(EvalFleetUnhealthy, match=f"eval 2: .*engine 0 at {process.url}"):
        fleet.before_use(2)
    assert fleet.self_probes == 2
    quiet = EvalFleet(lambda: [(0, process.url)], self_probe=False, timeout_s=2)
    before = len(calls(rec, port))
    quiet.before_use(3)
    assert len(calls(rec, port)) == before and quiet.self_probes == 0


def test_a_command_that_cannot_be_executed_names_itself_and_its_log(tmp_path):
    missing = tmp_path / "no-such-server"
    process = EngineProcess([str(missing), "--port", "1"], "http://127.0.0.1:1", tmp_path / "engine-0.log")
    with pytest.raises(EngineStartError, match=f"could not be started: .*command: {missing} --port 1 .*log: "):
        process.start()
    assert "cannot start" in (tmp_path / "engine-0.log").read_text()


def test_a_server_ignoring_sigterm_is_killed_and_its_log_says_so(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    log_path = tmp_path / "engine-0.log"
    process = EngineProcess([sys.executable, "-c", code], "http://127.0.0.1:1", log_path)
    process.start()
    deadline = time.monotonic() + 10
    while "up" not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = process.pid
    assert process.stop(grace_s=1) == -9
    assert not pid_alive(pid)
    assert "still running 1 s after SIGTERM: SIGKILL" in log_path.read_text()


def test_engine_actor_stop_deletes_the_staged_checkpoint_and_model_config(tmp_path):
    """A staged checkpoint is a full model copy on the engine's node: it must not outlive the run."""
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 8}
    actor = EngineActor(0, [sys.executable, str(DOUBLE), "--record-dir", str(tmp_path / "rec")],
                        ModelSource(str(tmp_path / "not-on-this-node"), "dummy", True, config),
                        tp_size=1, engine_args={}, log_dir=str(tmp_path / "logs"))
    actor.start(30)
    try:
        staged = Path(actor.stage_checkpoint({"model.safetensors": b"x"}, 1))
        model_dir = Path(actor.argv()[actor.argv().index("--model-path") + 1])
        assert (staged / "model.safetensors").exists() and (model_dir / "config.json").exists()
        pid = actor.engine.pid
    finally:
        actor.stop()
    assert not pid_alive(pid)
    assert not staged.parent.exists() and not model_dir.exists()


def test_monitor_keeps_its_interval_when_resumed_every_few_milliseconds(engine):
    """Fast steps pause and resume the monitor around every weight sync (and resume it again when the
    next rollout's replay starts): the engine must still be probed once per interval, not per resume."""
    process, port, rec = engine
    monitor = HealthMonitor("rollout", lambda: [(0, process.url)], probe_health, lambda i, p: None,
                            interval_s=0.5, timeout_s=2)
    before = len(calls(rec, port))
    monitor.start()
    ends = time.monotonic() + 2.2
    while time.monotonic() < ends:
        monitor.pause()   # before_train_step / after_train_step
        monitor.resume()  # after the weight sync
        monitor.resume()  # replay of the next rollout starts
        time.sleep(0.03)
    monitor.stop()
    probes = [c["time"] for c in calls(rec, port)[before:] if c["path"] == "/health_generate"]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert 2 <= len(probes) <= 5, probes
    assert min(gaps) >= 0.45, gaps


def test_a_failure_is_counted_only_once_the_engine_is_stopped(engine):
    """The report (and the fleet's callers) read the counters while the monitor runs: a counted
    failure must mean the engine is already gone."""
    process, port, rec = engine

    def slow_stop(index: int, problem: str) -> None:
        time.sleep(0.5)  # e.g. a Ray call to the engine's actor
        process.kill()

    monitor = HealthMonitor("rollout", lambda: [(0, process.url)] if process.alive() else [],
                            probe_health, slow_stop, interval_s=0.1, timeout_s=2)
    engine_call(process.url, "/_double/health", method="POST", body={"healthy": False})
    monitor.start()
    deadline = time.monotonic() + 10
    while monitor.counters.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    alive_when_counted = process.alive()
    monitor.stop()
    assert monitor.counters.failures == 1 and not alive_when_counted


def test_a_server_without_health_generate_is_probed_on_health(tmp_path):
    """A stand-in that only has /health is still started and monitored (sglang has both); one without either
    is never healthy, and the error names both endpoints."""
    from forge_replay.runtime.engines.process import probe_health

    process, port = start_double(tmp_path, "--missing-endpoint", "/health_generate")
    try:
        assert probe_health(process.url, 5) is None
        paths = [c["path"] for c in calls(tmp_path / "rec", port)]
        assert {"/health_generate", "/health"} <= set(paths)
    finally:
        process.stop()
    port = free_port()
    argv = build_engine_argv(
        [sys.executable, str(DOUBLE), "--missing-endpoint", "/health_generate", "--missing-endpoint", "/health"],
        host="127.0.0.1", port=port, model=ModelSource(str(tmp_path), "dummy", from_config=True), tp_size=1,
        engine_args={},
    )
    neither = EngineProcess(argv, f"http://127.0.0.1:{port}", tmp_path / "neither.log")
    neither.start()
    with pytest.raises(EngineStartError, match="/health_generate answered 404.*/health answered 404"):
        neither.wait_healthy(3)
    assert not neither.alive()
