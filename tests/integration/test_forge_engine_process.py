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
from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.engines.process import (
    EngineProcess,
    EngineStartError,
    ModelSource,
    build_engine_argv,
    probe_health,
)
from forge_replay.runtime.ports import free_port
from forge_replay.runtime.weights.calls import WeightSyncError, begin_weight_update, end_weight_update, release_memory
from forge_replay.runtime.weights.disk import push_weights_from_disk, write_versioned_checkpoint
from tests.integration.processes import pid_alive

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"
START_S = 180
"""How long a double may take to start: with sglang installed it imports sglang's own argument parser (tens of
seconds on a loaded 2-core machine)."""


def calls(record_dir: Path, port: int) -> list[dict]:
    path = record_dir / f"calls-{port}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_double(tmp_path: Path, *double_args: str, model: ModelSource | None = None, **argv_options
                 ) -> tuple[EngineProcess, int]:
    port = free_port()
    model = model or ModelSource(str(tmp_path), "dummy", from_config=True)
    argv = build_engine_argv(
        [sys.executable, str(DOUBLE), "--record-dir", str(tmp_path / "rec"), *double_args],
        host="127.0.0.1", port=port, model=model, tp_size=1, engine_args={"context-length": "128"}, **argv_options,
    )
    process = EngineProcess(argv, f"http://127.0.0.1:{port}", tmp_path / f"engine-{port}.log")
    process.start()
    process.wait_healthy(START_S)
    return process, port


@pytest.fixture
def engine(tmp_path):
    process, port = start_double(tmp_path)
    yield process, port, tmp_path / "rec"
    process.stop()


def test_the_version_is_read_from_model_info_or_get_model_info_and_never_left_unconfirmed(tmp_path):
    """sglang reports weight_version in GET /model_info and the deprecated /get_model_info; /get_weight_version is
    404 (python/sglang/srt/entrypoints/http_server.py, 0.5.19 and 0.5.23)."""
    checkpoint = write_versioned_checkpoint({"w": torch.ones(1)}, tmp_path / "weights", 1)
    process, port = start_double(tmp_path, "--missing-endpoint", "/model_info", "--missing-endpoint", "/flush_cache")
    try:
        result = push_weights_from_disk(process.url, checkpoint, "1")
        assert result.confirmed_version == "1" and result.unsupported == ("/flush_cache",)
        paths = [c["path"] for c in calls(tmp_path / "rec", port)]
        assert paths[-3:] == ["/model_info", "/get_model_info", "/flush_cache"] and "/get_weight_version" not in paths
    finally:
        process.stop()
    process, port = start_double(tmp_path, "--missing-endpoint", "/model_info", "--missing-endpoint", "/get_model_info")
    try:
        with pytest.raises(WeightSyncError, match=f"engine {process.url} answers 404 to GET /model_info and "
                                                  "/get_model_info, so the weight version .* cannot be confirmed"):
            push_weights_from_disk(process.url, checkpoint, "1")
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
    assert start["known"]["skip_tokenizer_init"]  # a config-only model has no tokenizer
    # sglang's own parser knows --context-length; the fallback records what it does not know
    assert start["unknown"] == ([] if start["sglang_parser"].startswith("real") else ["--context-length", "128"])
    assert start["pgid"] == start["pid"] == process.pid  # its own process group
    assert calls(rec, port)[-1]["path"] == "/health_generate"
    assert process.stop() == 0
    assert (rec / f"stop-{port}.json").exists() and not pid_alive(start["pid"])


def test_weight_push_checks_version_and_flushes(engine, tmp_path):
    process, port, rec = engine
    checkpoint = write_versioned_checkpoint({"w": torch.ones(2, 2)}, tmp_path / "weights", 1)
    result = push_weights_from_disk(process.url, checkpoint, "1")
    assert result.confirmed_version == "1"
    sequence = [(c["method"], c["path"], c["status"]) for c in calls(rec, port) if c["path"] != "/health_generate"]
    assert sequence == [("POST", "/update_weights_from_disk", 200), ("GET", "/model_info", 200),
                        ("GET", "/flush_cache", 200)]
    # the engine started with --load-format dummy: the push names the checkpoint's own format
    assert calls(rec, port)[-3]["body"]["load_format"] == "safetensors"
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
    actor.start(START_S)
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
    wait_listening(neither)
    with pytest.raises(EngineStartError, match="/health_generate answered 404.*/health answered 404"):
        neither.wait_healthy(3)
    assert not neither.alive()


def wait_listening(process: EngineProcess) -> None:
    """Until the double answers at all (a 404 counts), within :data:`START_S`."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and process.alive():
        try:
            engine_call(process.url, "/_double/nothing", timeout_s=2)
        except EngineHTTPError as exc:
            if exc.status is not None:
                return
        time.sleep(0.2)


def post(url: str, path: str, body: dict) -> tuple[int, object]:
    """Status and answer of one POST, errors included (what the double answered is the point here)."""
    try:
        return 200, engine_call(url, path, method="POST", body=body)
    except EngineHTTPError as exc:
        return exc.status, str(exc)


def test_the_double_refuses_a_distributed_or_tensor_update_outside_a_session_before_receiving(tmp_path):
    """0.5.23 refuses /update_weights_from_distributed and /update_weights_from_tensor with 400 outside a
    /begin_weight_update .. /end_weight_update session, before receiving anything
    (python/sglang/srt/managers/scheduler_components/weight_updater.py); 0.5.19 has no such routes (404)."""
    process, port = start_double(tmp_path)
    try:
        bucket = {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "g"}
        status, answer = post(process.url, "/update_weights_from_distributed", bucket)
        assert status == 400 and "must run between begin_weight_update() and end_weight_update()" in answer
        status, answer = post(process.url, "/update_weights_from_tensor", {"serialized_named_tensors": ["x"]})
        assert status == 400 and "must run between begin_weight_update()" in answer
        assert begin_weight_update(process.url) is True
        status, answer = post(process.url, "/begin_weight_update", {})
        assert status == 400 and "already open" in answer
        status, answer = post(process.url, "/update_weights_from_distributed", bucket)
        assert status == 400 and "no weight group 'g'" in answer  # inside the session it goes on to receive
        end_weight_update(process.url)
        with pytest.raises(WeightSyncError, match="closing the weight-update session.*no weight-update session"):
            end_weight_update(process.url)
    finally:
        process.stop()
    process, port = start_double(tmp_path, "--sglang-version", "0.5.19")
    try:
        assert begin_weight_update(process.url) is False  # 404: an older server, updated without a session
        status, answer = post(process.url, "/update_weights_from_distributed", bucket)
        assert status == 400 and "no weight group 'g'" in answer
    finally:
        process.stop()


def test_the_double_refuses_a_disk_update_that_inherits_the_dummy_load_format(tmp_path):
    """A /update_weights_from_disk body without load_format loads with the server's --load-format
    (python/sglang/srt/managers/tokenizer_manager.py) and a dummy loader is refused
    (python/sglang/srt/model_executor/model_runner_components/weight_updater.py: "Failed to get model loader")."""
    checkpoint = write_versioned_checkpoint({"w": torch.ones(1)}, tmp_path / "weights", 1)
    process, port = start_double(tmp_path)
    try:
        status, answer = post(process.url, "/update_weights_from_disk", {"model_path": str(checkpoint)})
        assert status == 400 and "Failed to get model loader" in answer
        assert push_weights_from_disk(process.url, checkpoint, "1").confirmed_version == "1"  # names its format
    finally:
        process.stop()


def test_a_model_without_a_tokenizer_and_without_skip_tokenizer_init_fails_the_start(tmp_path):
    """sglang loads the tokenizer from the model path at start (python/sglang/srt/managers/tokenizer_manager.py):
    the double exits like it; the launch command adds --skip-tokenizer-init, so that never happens to us."""
    port = free_port()
    argv = [sys.executable, str(DOUBLE), "--port", str(port), "--model-path", str(tmp_path)]
    process = EngineProcess(argv, f"http://127.0.0.1:{port}", tmp_path / "engine.log")
    process.start()
    with pytest.raises(EngineStartError, match="(?s)exited with code 1.*no tokenizer in .*--skip-tokenizer-init"):
        process.wait_healthy(START_S)


def test_release_memory_frees_nothing_without_the_memory_saver(tmp_path):
    """Without --enable-memory-saver sglang's memory saver is a no-op adapter
    (python/sglang/srt/utils/torch_memory_saver_adapter.py): colocated engines start with it."""
    for memory_saver in (False, True):
        process, port = start_double(tmp_path / str(memory_saver), memory_saver=memory_saver,
                                     model=ModelSource(str(tmp_path), "dummy", from_config=True))
        try:
            release_memory(process.url)
            released = [c["body"]["double"]["memory_released"]
                        for c in calls(tmp_path / str(memory_saver) / "rec", port)
                        if c["path"] == "/release_memory_occupation"]
            assert released == [memory_saver]
        finally:
            process.stop()


def test_the_engine_process_gets_no_trainer_allocator_setting(tmp_path, monkeypatch):
    """Expandable segments (the trainer's PYTORCH_CUDA_ALLOC_CONF) cannot go with the memory saver's pool."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    actor = EngineActor(0, [sys.executable, str(DOUBLE), "--record-dir", str(tmp_path / "rec")],
                        ModelSource(str(tmp_path), "dummy", True), tp_size=1, engine_args={},
                        log_dir=str(tmp_path / "logs"))
    actor.start(START_S)
    try:
        environ = Path(f"/proc/{actor.engine.pid}/environ").read_bytes().split(b"\0")
        assert not any(item.startswith(b"PYTORCH_CUDA_ALLOC_CONF=") for item in environ)
        assert any(item.startswith(b"PATH=") for item in environ)
    finally:
        actor.stop()


def test_a_start_up_probe_waits_for_a_slow_health_generate_instead_of_sending_another(tmp_path):
    """sglang's /health_generate may take up to 20 s (HEALTH_CHECK_TIMEOUT, python/sglang/srt/entrypoints/
    http_server.py): a probe cut off sooner sends a second generation."""
    process, port = start_double(tmp_path, "--health-generate-seconds", "7")
    try:
        assert [c["path"] for c in calls(tmp_path / "rec", port)] == ["/health_generate"]
    finally:
        process.stop()
