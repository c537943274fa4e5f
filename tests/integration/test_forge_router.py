"""sglang_router in front of two engine processes (the sglang test double); skipped without sglang_router."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("sglang_router", reason="sglang_router (pip sglang-router) is not installed")

from forge_replay.runtime.engines.http import engine_call  # noqa: E402
from forge_replay.runtime.engines.process import (  # noqa: E402
    EngineProcess,
    ModelSource,
    build_engine_argv,
    probe_health,
)
from forge_replay.runtime.engines.router import Router  # noqa: E402
from forge_replay.runtime.ports import free_port  # noqa: E402

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"


def start_engine(tmp_path: Path) -> EngineProcess:
    port = free_port()
    argv = build_engine_argv([sys.executable, str(DOUBLE)], host="127.0.0.1", port=port,
                             model=ModelSource(str(tmp_path), "dummy", True), tp_size=1, engine_args={})
    engine = EngineProcess(argv, f"http://127.0.0.1:{port}", tmp_path / f"engine-{port}.log")
    engine.start()
    engine.wait_healthy(30)
    return engine


def test_router_fronts_the_engines_swaps_a_recovered_one_and_stops(tmp_path):
    engines = [start_engine(tmp_path) for _ in range(3)]
    router = Router([e.url for e in engines[:2]], "127.0.0.1", tmp_path)
    try:
        router.start()
        router.wait_ready(60)
        assert router.worker_urls() == sorted(e.url for e in engines[:2])
        # its Prometheus server on the port it was given, not sglang_router's default 29000 that every router shares
        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10) as metrics:
            assert metrics.status == 200
        router.replace_worker(engines[1].url, engines[2].url)  # engine 1 came back at another address
        deadline = time.monotonic() + 20
        while router.worker_urls() != sorted([engines[0].url, engines[2].url]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert router.worker_urls() == sorted([engines[0].url, engines[2].url])
        assert engine_call(router.url, "/health") is not None
    finally:
        router.stop()
        for engine in engines:
            engine.stop()
    assert not router.process.alive()


@pytest.mark.ray
def test_fleet_runs_the_router_and_re_registers_an_engine_whose_actor_died(tmp_path, local_ray):
    import ray
    import torch

    from forge_replay.runtime.engines.fleet import EngineFleet, FleetSettings
    from forge_replay.runtime.gating import plan_rollout_side

    # the double imports sglang's own parser at start: slow on a loaded machine
    settings = FleetSettings(num_engines=2, gpus_per_engine=1, colocate=False, use_gpus=False,
                             health_interval_s=1, health_timeout_s=2, startup_timeout_s=180)
    model = ModelSource(str(tmp_path), "dummy", True, {"hidden_size": 8})
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    fleet = EngineFleet(settings, plan_rollout_side("forge", True, ["rollout"]), [sys.executable, str(DOUBLE)],
                        model, tmp_path / "work", engine_command_given=False)  # as if it were sglang
    try:
        fleet.start()
        assert fleet.router is not None and fleet.report()["router"].startswith("sglang_router in front of 2")
        assert fleet.router.worker_urls() == sorted(fleet.urls)
        ray.kill(fleet.engines[1].actor)  # the engine's actor dies; PDEATHSIG takes its server down
        old_url = fleet.urls[1]
        fleet.after_train_step(0, {"w": torch.zeros(2)})
        assert fleet.report()["restarts_by_engine"] == [0, 1] and fleet.urls[1] != old_url
        assert probe_health(old_url, 2) is not None  # the dead actor's server is gone, not orphaned
        deadline = time.monotonic() + 20
        while fleet.router.worker_urls() != sorted(fleet.urls) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.router.worker_urls() == sorted(fleet.urls)
        router = fleet.router
    finally:
        fleet.shutdown()
    assert not router.process.alive()
