"""One engine process (the sglang HTTP test double) started, probed, pushed to, monitored, stopped.

No Ray here: these are the process-level guarantees the engine actors rely on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from forge_replay.runtime.engines import (
    EngineProcess,
    EngineStartError,
    ModelSource,
    build_engine_argv,
    engine_call,
    free_port,
    probe_health,
)
from forge_replay.runtime.eval_fleet import EvalFleet, EvalFleetUnhealthy
from forge_replay.runtime.health import HealthMonitor
from forge_replay.runtime.weight_sync import WeightSyncError, push_weights_from_disk, write_versioned_checkpoint

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"


def calls(record_dir: Path, port: int) -> list[dict]:
    path = record_dir / f"calls-{port}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
