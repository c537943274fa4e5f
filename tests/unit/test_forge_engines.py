"""Pure parts of forge mode: engine launch commands, model source, faults, router plan."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from forge_replay.api.engine_args import engine_args_problems
from forge_replay.runtime.engines.faults import Fault, FaultInjector, parse_faults
from forge_replay.runtime.engines.process import (
    EngineUnavailable,
    ModelSource,
    build_engine_argv,
    engine_count,
    engine_env,
    prepare_model_source,
    resolve_engine_command,
)
from forge_replay.runtime.engines.router import build_router_argv, plan_router

DUMMY = ModelSource("/scratch/engine-model", "dummy", from_config=True)


def test_argv_passes_engine_args_and_sets_what_forge_replay_owns():
    argv = build_engine_argv(
        ["python", "-m", "sglang.launch_server"],
        host="10.0.0.5",
        port=31000,
        model=DUMMY,
        tp_size=2,
        engine_args={"mem-fraction-static": "0.7", "--context-length": "65536", "enable-memory-saver": "", "trust-remote-code": "true",
                     "disable-cuda-graph": "false"},
        base_gpu_id=4,
    )
    assert argv == [
        "python", "-m", "sglang.launch_server",
        "--host", "10.0.0.5", "--port", "31000", "--model-path", "/scratch/engine-model",
        "--tp-size", "2", "--base-gpu-id", "4", "--load-format", "dummy", "--skip-server-warmup",
        "--skip-tokenizer-init",
        "--mem-fraction-static", "0.7", "--context-length", "65536", "--enable-memory-saver", "--trust-remote-code",
    ]


def test_argv_for_a_checkpoint_has_no_load_format_and_user_load_format_wins():
    checkpoint = ModelSource("/mnt/forge-replay/model/Qwen3-8B", None, from_config=False)
    argv = build_engine_argv(["srv"], host="h", port=1, model=checkpoint, tp_size=1, engine_args={})
    assert "--load-format" not in argv and "--base-gpu-id" not in argv
    argv = build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={"load-format": "auto"})
    assert argv.count("--load-format") == 1 and argv[argv.index("--load-format") + 1] == "auto"


def option(argv: list[str], name: str) -> str | None:
    """The value after ``name`` in ``argv`` (None when absent)."""
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_model_without_a_tokenizer_starts_with_skip_tokenizer_init(tmp_path):
    """sglang loads a tokenizer from the model path at start unless --skip-tokenizer-init
    (python/sglang/srt/managers/tokenizer_manager.py, 0.5.19 and 0.5.23): a config-only model has none."""
    def argv(model: ModelSource, engine_args: dict | None = None) -> list[str]:
        return build_engine_argv(["srv"], host="h", port=1, model=model, tp_size=1, engine_args=engine_args or {})

    assert "--skip-tokenizer-init" in argv(DUMMY)
    bare, with_tokenizer = tmp_path / "bare", tmp_path / "with-tokenizer"
    bare.mkdir(), with_tokenizer.mkdir()
    (with_tokenizer / "tokenizer.json").write_text("{}")
    assert "--skip-tokenizer-init" in argv(prepare_model_source(None, str(bare), None, tmp_path))
    assert "--skip-tokenizer-init" not in argv(prepare_model_source(None, str(with_tokenizer), None, tmp_path))
    assert "--skip-tokenizer-init" not in argv(DUMMY, {"tokenizer-path": "/models/tok"})  # the user's tokenizer
    assert "--skip-tokenizer-init" not in argv(DUMMY, {"skip-tokenizer-init": "false"})  # the user's choice


def test_engines_run_in_the_trainers_dtype_unless_engine_args_set_one():
    """Without --dtype sglang turns a float32 or absent config dtype into float16
    (python/sglang/srt/configs/model_config.py, 0.5.23), while the trainer pushes its own dtype."""
    argv = build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={}, dtype="bfloat16")
    assert option(argv, "--dtype") == "bfloat16"
    argv = build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={"dtype": "float16"},
                             dtype="bfloat16")
    assert argv.count("--dtype") == 1 and option(argv, "--dtype") == "float16"
    assert "--dtype" not in build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={})


def test_colocated_engines_start_with_the_memory_saver_and_without_the_trainers_allocator_setting():
    """/release_memory_occupation releases nothing without --enable-memory-saver
    (python/sglang/srt/utils/torch_memory_saver_adapter.py); expandable segments cannot go with its memory pool."""
    argv = build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={}, memory_saver=True)
    assert argv.count("--enable-memory-saver") == 1
    assert "--enable-memory-saver" not in build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1,
                                                            engine_args={})
    env = engine_env({"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                      "PYTORCH_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.parametrize("key", ["port", "--host", "model-path", "tp-size", "base-gpu-id"])
def test_reserved_engine_args_are_refused_with_their_field_path(key):
    assert engine_args_problems({key: "1"})[0][0] == f"spec.rollout.engineArgs.{key}"
    with pytest.raises(ValueError, match=f"spec.rollout.engineArgs.{key}"):
        build_engine_argv(["srv"], host="h", port=1, model=DUMMY, tp_size=1, engine_args={key: "1"})


def test_malformed_engine_arg_names_are_refused():
    assert engine_args_problems({"---x": "1", "a b": "1", "mem-fraction-static": "0.7"}) == [
        ("spec.rollout.engineArgs.---x", engine_args_problems({"---x": "1"})[0][1]),
        ("spec.rollout.engineArgs.a b", engine_args_problems({"a b": "1"})[0][1]),
    ]


def test_engine_command_replaces_sglang_and_is_split_like_a_shell():
    assert resolve_engine_command("python 'my server.py' --record-dir /tmp/x") == [
        "python", "my server.py", "--record-dir", "/tmp/x",
    ]
    with pytest.raises(EngineUnavailable, match="empty"):
        resolve_engine_command("  ")


def test_without_engine_command_sglang_is_used_or_forge_mode_fails_fast():
    if importlib.util.find_spec("sglang") is not None:
        assert resolve_engine_command(None) == [sys.executable, "-m", "sglang.launch_server"]
        return
    with pytest.raises(EngineUnavailable, match="sglang is not installed.*--engine-command"):
        resolve_engine_command(None)


def test_model_from_config_is_written_for_a_dummy_load(tmp_path):
    source = prepare_model_source({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}, None, None, tmp_path)
    assert source.load_format == "dummy" and source.from_config
    assert json.loads((tmp_path / "engine-model" / "config.json").read_text())["hidden_size"] == 64


def test_model_path_is_resolved_under_the_model_root_and_must_exist(tmp_path):
    (tmp_path / "Qwen3-8B").mkdir()
    source = prepare_model_source(None, "Qwen3-8B", str(tmp_path), tmp_path / "scratch")
    assert source == ModelSource(str(tmp_path / "Qwen3-8B"), None, from_config=False, has_tokenizer=False)
    with pytest.raises(FileNotFoundError, match="spec.model.path: model directory .*missing"):
        prepare_model_source(None, "missing", str(tmp_path), tmp_path / "scratch")


def test_engine_count_divides_gpus():
    assert engine_count(8, 2) == 4
    with pytest.raises(ValueError, match="numGpusPerEngine 3"):
        engine_count(8, 3)


def test_faults_parse_and_fire_once_at_their_step():
    faults = parse_faults("kill-engine:step=1,engine=0; kill-engine:step=3,engine=1")
    assert faults == [Fault("kill-engine", 1, 0), Fault("kill-engine", 3, 1)]
    injector = FaultInjector(faults, num_engines=2)
    assert injector.due(0) == [] and injector.due(1) == [Fault("kill-engine", 1, 0)] and injector.due(1) == []
    assert injector.injected == [Fault("kill-engine", 1, 0)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("explode:step=1,engine=0", "unknown kind 'explode'"),
        ("kill-engine:step=1", "needs both"),
        ("kill-engine:step=x,engine=0", "expected step=N,engine=N"),
    ],
)
def test_bad_faults_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_faults(text)


def test_a_fault_on_a_missing_engine_is_refused():
    with pytest.raises(ValueError, match="there are 2"):
        FaultInjector.from_env(2, {"FORGE_REPLAY_INJECT_FAULTS": "kill-engine:step=0,engine=2"})


def test_router_only_in_front_of_several_sglang_engines():
    assert not plan_router(1, False, True).launch
    assert not plan_router(4, True, True).launch
    assert "not installed" in plan_router(4, False, False).reason
    assert plan_router(4, False, True).launch
    argv = build_router_argv(["http://a:1", "http://b:2"], "0.0.0.0", 30000, 30001)
    assert argv[1:3] == ["-m", "sglang_router.launch_router"] and argv[-3:] == ["--worker-urls", "http://a:1", "http://b:2"]
    assert "--disable-health-check" in argv  # our monitor probes; the router's own checks would generate mid-push


def test_the_router_argv_parses_with_sglang_routers_own_parser():
    """The flag names are sglang_router's (0.3.2: ``--disable-health-check`` in router_args.py)."""
    launch = pytest.importorskip("sglang_router.launch_router")
    args = launch.parse_router_args(build_router_argv(["http://a:1", "http://b:2"], "127.0.0.1", 30000, 30001)[3:])
    assert args.disable_health_check is True and args.worker_urls == ["http://a:1", "http://b:2"]
    assert (args.port, args.prometheus_port, args.prometheus_host) == (30000, 30001, "127.0.0.1")


def test_nvidia_smi_lines_are_summed_for_our_processes_only():
    from forge_replay.runtime.engines.actor import sum_csv_mib

    csv = "101, 2048\n202, 1024\n303, 512\n"
    assert sum_csv_mib(csv, {101, 303}) == 2560.0
    assert sum_csv_mib(csv, {999}) is None  # nothing matched: not a zero reading
    assert sum_csv_mib("", {1}) is None


def test_an_engine_on_another_node_writes_the_config_model_itself(tmp_path):
    from forge_replay.runtime.engines.actor import EngineActor

    remote_view = ModelSource("/not/on/this/node/engine-model", "dummy", from_config=True, config={"hidden_size": 8})
    actor = EngineActor(0, ["srv"], remote_view, 1, {}, str(tmp_path / "logs"))
    argv = actor.argv()
    local = Path(argv[argv.index("--model-path") + 1])
    assert local != Path(remote_view.model_path)
    assert json.loads((local / "config.json").read_text()) == {"hidden_size": 8}
    visible = ModelSource(str(tmp_path), "dummy", from_config=True, config={"hidden_size": 8})
    (tmp_path / "config.json").write_text("{}")
    assert EngineActor(1, ["srv"], visible, 1, {}, str(tmp_path)).argv()[argv.index("--model-path") + 1] == str(tmp_path)


def test_staged_checkpoints_keep_only_the_newest_version_and_stay_inside_their_root(tmp_path):
    from forge_replay.runtime.weights.calls import WeightSyncError
    from forge_replay.runtime.weights.disk import read_checkpoint_files, stage_checkpoint

    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"weights")
    (source / "sub" / "config.json").write_text("{}")
    files = read_checkpoint_files(source)
    assert files == {"model.safetensors": b"weights", "sub/config.json": b"{}"}
    first = stage_checkpoint(files, tmp_path / "node", 1)
    second = stage_checkpoint(files, tmp_path / "node", 2)
    assert (second / "sub" / "config.json").read_text() == "{}" and not first.exists()
    with pytest.raises(WeightSyncError, match="leaves"):
        stage_checkpoint({"model.safetensors": b"", "../escape": b"x"}, tmp_path / "node", 3)
    with pytest.raises(WeightSyncError, match="no \\*.safetensors"):
        stage_checkpoint({"config.json": b"{}"}, tmp_path / "node", 4)


def test_a_runs_engine_logs_are_its_own_and_a_restart_within_it_appends(tmp_path):
    # The next run of a job reuses its results folder: engine-N.log and router.log were appended to across runs.
    from forge_replay.api import parse_job
    from forge_replay.runtime.engines.fleet import EngineFleet
    from forge_replay.runtime.engines.process import EngineProcess
    from tests.unit.spec_factory import forge_job

    work_dir = tmp_path / "engines"
    (work_dir / "engine-logs").mkdir(parents=True)
    for old in (work_dir / "engine-logs" / "engine-0.log", work_dir / "router.log"):
        old.write_text("the previous run's server output\n")
    (work_dir / "engine-logs" / "notes.txt").write_text("not ours\n")
    fleet = EngineFleet.from_job(parse_job(forge_job()), engine_command="serve", model_root=None, work_dir=work_dir)
    log = Path(fleet.work_dir) / "engine-logs" / "engine-0.log"
    assert not log.exists() and not (work_dir / "router.log").exists()
    assert (work_dir / "engine-logs" / "notes.txt").exists()
    for said in ("first start", "second start"):  # an engine started again in the run (fault tolerance)
        engine = EngineProcess([sys.executable, "-c", f"print({said!r})"], "http://127.0.0.1:1", log)
        engine.start()
        engine.process.wait(timeout=60)
    assert log.read_text().splitlines() == ["first start", "second start"]


@pytest.mark.parametrize(("use_gpus", "colocate", "slots", "wanted"), [
    (False, False, 2.0, {"resources": {"forge_replay_engine": 1}}),  # CPU engines, the operator's rollout pods
    (True, False, 4.0, {"resources": {"forge_replay_engine": 1}, "num_gpus": 2}),
    (False, False, 0, {}),  # forge-replay run's local Ray: no slots, engines go anywhere
    (True, True, 4.0, {}),  # colocated engines share the trainer's pods (no rollout pods exist)
])
def test_engines_take_an_engine_slot_where_the_ray_cluster_offers_them(use_gpus, colocate, slots, wanted, tmp_path):
    """The operator's rollout pods offer one ENGINE_RAY_RESOURCE each (render.py); an engine takes one, so that a
    CPU engine (no GPU to ask for) runs there and not on the trainer's or the head's pod."""
    from forge_replay.api.paths import ENGINE_RAY_RESOURCE
    from forge_replay.runtime.engines.fleet import EngineFleet, FleetSettings
    from forge_replay.runtime.gating import plan_rollout_side

    settings = FleetSettings(num_engines=2, gpus_per_engine=2, colocate=colocate, use_gpus=use_gpus,
                             gpus_per_node=4)
    fleet = EngineFleet(settings, plan_rollout_side("forge", False, []), ["server"], DUMMY, tmp_path,
                        engine_command_given=True)
    assert fleet.engine_slots == 0  # no Ray here
    fleet.engine_slots = slots
    options, _ = fleet._actor_options(1)
    assert ENGINE_RAY_RESOURCE == "forge_replay_engine"
    assert {k: v for k, v in options.items() if k in ("resources", "num_gpus")} == wanted
    assert options["num_cpus"] == 0
