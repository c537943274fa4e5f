"""spec.trainer backend slime / miles (issue 15): what is refused, and the argv injected per row of the issue's table."""

from __future__ import annotations

import pytest

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.frameworks.flags import BACKEND_INJECTED, INJECTED_UNLESS_GIVEN, flag_of, flag_table
from forge_replay.backends.argv import injected_argv, worker_gpus, worker_nodes
from tests.unit.spec_factory import DELETE, REQUIRED_ARGS, byo_job as byo, forge_job

ROOT = "/mnt/dumps"
ONE_STEP = ["--global-batch-size", "32"]  # REQUIRED_ARGS' 32 rollouts x 1 sample: one step, as miles' train FT needs


def problems(doc) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def argv(doc) -> list[str]:
    return injected_argv(parse_job(doc).spec, ROOT)


def pairs(items: list[str]) -> dict[str, str | None]:
    """flag -> its value (None for a switch), as argparse would read the injected argv."""
    out: dict[str, str | None] = {}
    for i, item in enumerate(items):
        if item.startswith("--"):
            nxt = items[i + 1] if i + 1 < len(items) else None
            out[item] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# ------------------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_defaults_of_a_byo_trainer(backend: str) -> None:
    trainer = parse_job(byo(backend)).spec.trainer
    assert (trainer.script, trainer.args, trainer.env, trainer.clip_eps_high) == ("train.py", REQUIRED_ARGS, {}, None)
    assert parse_job(byo(backend)).spec.replay.loader == "forgeReplay"


def test_builtin_stays_the_default() -> None:
    spec = parse_job(forge_job()).spec
    assert spec.trainer.backend == "builtin" and spec.trainer.clip_eps_high == spec.trainer.clip_eps


def test_cpu_stand_in_may_run_without_gpus() -> None:
    doc = byo("slime", "debug", spec__trainer__gpusPerNode=0)
    assert parse_job(doc).spec.trainer.gpus_per_node == 0


# ------------------------------------------------------------------------------------- refused


@pytest.mark.parametrize("field,value", [
    ("image", "x"), ("workingDir", "/w"), ("script", "run.py"), ("args", ["--lr", "1"]), ("env", {"A": "1"}),
])
def test_byo_fields_refused_for_builtin(field: str, value) -> None:
    doc = forge_job(**{f"spec__trainer__{field}": value})
    assert any(p.startswith(f"spec.trainer.{field}: only for backend slime or miles") for p in problems(doc))


@pytest.mark.parametrize("field,value", [
    ("microBatchTokens", 1024), ("dtype", "float32"), ("learningRate", 1e-5), ("clipEps", 0.3),
    ("clipEpsHigh", 0.28), ("gradientCheckpointing", False), ("seed", 7), ("nSamplesPerPrompt", 8),
])
@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_builtin_fields_refused_for_byo(backend: str, field: str, value) -> None:
    doc = byo(backend, **{f"spec__trainer__{field}": value})
    assert f"spec.trainer.{field}: means nothing to backend {backend}" in " ".join(problems(doc))


def test_builtin_fields_at_their_defaults_pass() -> None:
    # The API server fills schema defaults in: a stored slime job carries microBatchTokens 65536 and friends.
    doc = byo("slime", spec__trainer__microBatchTokens=65536, spec__trainer__dtype="bfloat16")
    assert parse_job(doc).spec.trainer.backend == "slime"


@pytest.mark.parametrize("missing,path", [("image", "spec.trainer.image"), ("workingDir", "spec.trainer.workingDir")])
def test_image_and_working_dir_required(missing: str, path: str) -> None:
    assert any(p.startswith(f"{path}: required with backend slime") for p in
               problems(byo("slime", **{f"spec__trainer__{missing}": DELETE})))


def test_working_dir_is_absolute() -> None:
    assert any(p.startswith("spec.trainer.workingDir") for p in problems(byo("miles", spec__trainer__workingDir="w")))


@pytest.mark.parametrize("backend,arg,index", [
    ("slime", ["--lr", "1e-6", "--num-rollout", "3"], 2),
    ("slime", ["--num-rollout=3"], 0),
    ("miles", ["--colocate"], 0),
    ("slime", ["--load-forge-rollout-data=/x"], 0),
    ("miles", ["--ft-components", "train"], 0),
    ("miles", ["--no-forge-replay-fallback-to-first"], 0),
    ("slime", ["--num-epoch", "2"], 0),
    ("miles", ["--tp", "2", "--dump-details=/d"], 2),
    ("slime", ["--save-debug-rollout-data", "/d/{rollout_id}.pt"], 0),
    ("miles", ["--fully-async"], 0),
    ("miles", ["--ci-inject-rollout-data-path", "x"], 0),
])
def test_args_may_not_set_injected_or_refused_flags(backend: str, arg: list[str], index: int) -> None:
    found = problems(byo(backend, spec__trainer__args=arg))
    assert len(found) == 1 and found[0].startswith(f"spec.trainer.args[{index}]: {flag_of(arg[index])} "), found


def test_slime_accepts_what_only_miles_refuses() -> None:
    doc = byo("slime", spec__trainer__args=["--fully-async", "--ci-inject-rollout-data-path", "x"])
    assert parse_job(doc).spec.trainer.args[0] == "--fully-async"


def test_every_refused_args_item_is_named() -> None:
    found = problems(byo("miles", spec__trainer__args=["--num-rollout", "3", "--lr", "1", "--fully-async"]))
    assert [p.split(":")[0] for p in found] == ["spec.trainer.args[0]", "spec.trainer.args[4]"]


def test_upstream_loader_needs_a_byo_backend() -> None:
    assert any(p.startswith("spec.replay.loader: upstream is slime's own loader")
               for p in problems(forge_job(spec__replay__loader="upstream")))


def test_miles_forge_has_no_upstream_loader() -> None:
    assert any(p.startswith("spec.replay.loader: miles has no forge_load")
               for p in problems(byo("miles", spec__replay__loader="upstream")))
    ok = byo("miles", "debug", spec__replay__loader="upstream", spec__replay__dumps__fallbackToFirst=False)
    assert parse_job(ok).spec.replay.loader == "upstream"


def test_slime_fault_tolerance_train_alone_refused() -> None:
    doc = byo("slime", spec__faultTolerance={"enabled": True, "components": ["train"]})
    assert any(p.startswith("spec.faultTolerance.components: slime's --use-fault-tolerance") for p in problems(doc))
    ok = byo("miles", spec__faultTolerance={"enabled": True, "components": ["train"]}, spec__trainer__args=ONE_STEP)
    assert parse_job(ok).spec.fault_tolerance.components == ["train"]


@pytest.mark.parametrize("backend,mode,loader,refused", [
    ("slime", "debug", "forgeReplay", True), ("slime", "forge", "upstream", True),
    ("miles", "debug", "forgeReplay", False),
    ("slime", "debug", "upstream", False), ("miles", "debug", "upstream", False),  # no fallback is what they do
])
def test_no_fallback_only_where_it_can_be_passed(backend: str, mode: str, loader: str, refused: bool) -> None:
    doc = byo(backend, mode, spec__replay__loader=loader, spec__replay__dumps__fallbackToFirst=False)
    if refused:
        assert any(p.startswith("spec.replay.dumps.fallbackToFirst") for p in problems(doc))
    elif loader == "forgeReplay":
        assert "--no-forge-replay-fallback-to-first" in argv(doc)
    else:
        assert parse_job(doc).spec.replay.dumps.fallback_to_first is False


@pytest.mark.parametrize("rollout,path", [
    ({"numGpus": 4, "numGpusPerEngine": 2}, "spec.rollout.numGpus"),
    ({"numGpus": 24, "numGpusPerEngine": 3}, "spec.rollout.numGpusPerEngine"),
])
def test_gpu_counts_divide_into_whole_nodes(rollout, path: str) -> None:
    assert any(p.startswith(f"{path}: ") for p in problems(byo("slime", spec__rollout=rollout)))


def test_multi_node_engines_and_colocation_divide() -> None:
    assert parse_job(byo("miles", spec__rollout={"numGpus": 16, "numGpusPerEngine": 16})).spec.rollout.num_gpus == 16
    colocated = byo("slime", spec__rollout={"numGpus": 4, "numGpusPerEngine": 2, "colocate": True})
    assert worker_gpus(parse_job(colocated).spec) == 8


# ------------------------------------------------------------------------------------- injected argv, per table row


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_layout_row(backend: str) -> None:
    got = pairs(argv(byo(backend, spec__trainer__nodes=2, spec__rollout={"numGpus": 16, "numGpusPerEngine": 4})))
    assert {k: got[k] for k in ("--actor-num-nodes", "--actor-num-gpus-per-node", "--num-gpus-per-node")} == {
        "--actor-num-nodes": "2", "--actor-num-gpus-per-node": "8", "--num-gpus-per-node": "8"}
    assert (got["--rollout-num-gpus"], got["--rollout-num-gpus-per-engine"]) == ("16", "4")
    assert "--colocate" not in got


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_colocate_row(backend: str) -> None:
    got = pairs(argv(byo(backend, spec__rollout={"numGpus": 8, "numGpusPerEngine": 2, "colocate": True})))
    assert "--colocate" in got and got["--colocate"] is None


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_forge_with_our_loader_row(backend: str) -> None:
    got = pairs(argv(byo(backend)))
    assert got["--rollout-function-path"] == got["--eval-function-path"] == "forge_replay.replay.generate_rollout"
    assert got["--load-forge-rollout-data"] == f"{ROOT}/run-42/rollout_{{rollout_id}}.pt"
    assert "--debug-train-only" not in got and "--load-debug-rollout-data" not in got


def test_forge_with_upstream_loader_row() -> None:
    got = pairs(argv(byo("slime", spec__replay__loader="upstream")))
    assert got["--rollout-function-path"] == "slime.rollout.forge_load.generate_rollout"
    assert got["--load-forge-rollout-data"] == f"{ROOT}/run-42/rollout_{{rollout_id}}.pt"
    assert "--eval-function-path" not in got


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_debug_row(backend: str) -> None:
    got = pairs(argv(byo(backend, "debug")))
    assert "--debug-train-only" in got and got["--rollout-function-path"] == "forge_replay.replay.generate_rollout"
    assert "--rollout-num-gpus" not in got  # nothing computes engine counts from empty rollout sizes
    upstream = pairs(argv(byo(backend, "debug", spec__replay__loader="upstream",
                              spec__replay__dumps__fallbackToFirst=False)))
    assert upstream["--load-debug-rollout-data"] == f"{ROOT}/run-42/rollout_{{rollout_id}}.pt"
    assert "--rollout-function-path" not in upstream and "--load-forge-rollout-data" not in upstream


@pytest.mark.parametrize("backend", ["slime", "miles"])
def test_rollout_range_row(backend: str) -> None:
    load = ["--load", "/mnt/forge-replay/model/ckpt"]  # miles keeps a start id only with a checkpoint to load
    got = pairs(argv(byo(backend, spec__replay__startRolloutId=5, spec__replay__numRollouts=3, spec__trainer__args=load)))
    assert (got["--start-rollout-id"], got["--num-rollout"]) == ("5", "8")  # an end bound, as slime's loop reads it


EVAL_DATA = ["--eval-prompt-data", "aime", "/data/aime.jsonl"]  # slime and miles refuse --eval-interval without


def test_eval_and_reward_keys_row() -> None:
    got = pairs(argv(byo("slime", spec__replay__evalInterval=2, spec__replay__rewardKey="acc",
                         spec__replay__evalRewardKey="pass", spec__trainer__args=EVAL_DATA)))
    assert (got["--eval-interval"], got["--reward-key"], got["--eval-reward-key"]) == ("2", "acc", "pass")
    plain = pairs(argv(byo("slime")))
    assert not {"--eval-interval", "--reward-key", "--eval-reward-key"} & set(plain)


def test_eval_before_train_only_when_asked() -> None:
    """slime's and miles' train.py evaluate before training whenever eval is on, unless --skip-eval-before-train."""
    skipped = byo("slime", spec__replay__evalInterval=2, spec__trainer__args=EVAL_DATA)
    assert "--skip-eval-before-train" in argv(skipped)
    asked = byo("miles", spec__replay__evalInterval=2, spec__trainer__args=EVAL_DATA, spec__replay__evalBeforeTrain=True)
    assert "--skip-eval-before-train" not in argv(asked)
    assert "--skip-eval-before-train" not in argv(byo("slime"))  # no eval at all


def test_fault_tolerance_row() -> None:
    ft = {"enabled": True, "components": ["train", "rollout"]}
    slime = argv(byo("slime", spec__faultTolerance=ft))
    miles = argv(byo("miles", spec__faultTolerance=ft, spec__trainer__args=ONE_STEP))
    assert "--use-fault-tolerance" in slime and "--ft-components" not in slime
    assert miles[miles.index("--ft-components"):][:3] == ["--ft-components", "train", "rollout"]
    assert "--use-fault-tolerance" not in argv(byo("miles"))


@pytest.mark.parametrize("backend", ["slime", "miles"])
@pytest.mark.parametrize("mode", ["forge", "debug"])
def test_every_injected_flag_is_owned_and_declared(backend: str, mode: str) -> None:
    extra = {"spec__replay__rewardKey": "r", "spec__replay__evalRewardKey": "e"}
    if mode == "forge":  # slime and miles never evaluate in debug mode
        extra.update(spec__faultTolerance={"enabled": True}, spec__replay__evalInterval=2,
                     spec__trainer__args=EVAL_DATA)
    flags = [item for item in argv(byo(backend, mode, **extra)) if item.startswith("--")]
    assert set(flags) <= set(BACKEND_INJECTED[backend]) | set(INJECTED_UNLESS_GIVEN)
    table = flag_table(backend)
    assert [f for f in flags if not table.has(f) and f != "--load-forge-rollout-data"] == []


def test_worker_group_counts() -> None:
    spec = parse_job(byo("slime", spec__trainer__nodes=2, spec__rollout={"numGpus": 16, "numGpusPerEngine": 8})).spec
    assert (worker_gpus(spec), worker_nodes(spec)) == (32, 4)
    debug = parse_job(byo("miles", "debug", spec__trainer__nodes=3)).spec
    assert (worker_gpus(debug), worker_nodes(debug)) == (24, 3)


def test_validate_says_the_upstream_loader_unpickles(tmp_path) -> None:
    import io

    import yaml

    from forge_replay.commands.validate import validate_files

    outputs = {}
    for loader in ("upstream", "forgeReplay"):
        path = tmp_path / f"{loader}.yaml"
        path.write_text(yaml.safe_dump(byo("slime", "debug", spec__replay__loader=loader,
                                           spec__replay__dumps__fallbackToFirst=loader == "forgeReplay")))
        out = io.StringIO()
        assert validate_files([str(path)], out) == 0
        outputs[loader] = out.getvalue()
    assert "torch.load(weights_only=False)" in outputs["upstream"]
    assert "note:" not in outputs["forgeReplay"]


# ------------------------------------------------------------------------ refused before launch (issue 26)


@pytest.mark.parametrize("key,why", [
    ("", "is not an environment variable name"), ("PATH=x", "is not an environment variable name"),
    ("1BAD", "is not an environment variable name"), ("RAY_ADDRESS", "cannot be set"),
    ("FORGE_REPLAY_PROBE_DIR", "cannot be set"),
])
def test_env_names_and_the_jobs_own_variables_refused(key: str, why: str) -> None:
    found = problems(byo("slime", spec__trainer__env={key: "x", "NCCL_DEBUG": "INFO"}))
    assert len(found) == 1 and found[0].startswith("spec.trainer.env") and why in found[0], found


def test_pythonpath_is_merged_not_refused() -> None:
    from forge_replay.backends.launch import FORGE_LIB_MOUNT, env_vars

    spec = parse_job(byo("miles", spec__trainer__env={"PYTHONPATH": "/opt/team"})).spec
    assert env_vars(spec)["PYTHONPATH"] == f"/opt/team:{FORGE_LIB_MOUNT}"  # replaces Megatron's, ours appended


@pytest.mark.parametrize("field,value", [
    ("spec__trainer__image", "UPPER CASE image with spaces"), ("spec__trainer__image", "registry.example.com/Team/x"),
    ("spec__image", "runtime image:latest"),
])
def test_image_must_be_an_image_reference(field: str, value: str) -> None:
    path = "spec.trainer.image" if "trainer" in field else "spec.image"
    found = problems(byo("slime", **{field: value}))
    assert any(p.startswith(f"{path}: {value!r} is not an image reference") for p in found), found


@pytest.mark.parametrize("image", [
    "registry.example.com:5000/ml-platform/slime:2026.11", "slime", "ghcr.io/org/miles@sha256:" + "ab" * 32,
])
def test_image_references_accepted(image: str) -> None:
    assert parse_job(byo("miles", spec__trainer__image=image)).spec.trainer.image == image


@pytest.mark.parametrize("field,value,path", [
    ("script", "../train.py", "spec.trainer.script"), ("script", "/root/slime/train.py", "spec.trainer.script"),
    ("script", "tools/../../x.py", "spec.trainer.script"), ("workingDir", "/root/../etc", "spec.trainer.workingDir"),
])
def test_script_and_working_dir_stay_in_place(field: str, value: str, path: str) -> None:
    assert any(p.startswith(f"{path}: ") for p in problems(byo("slime", **{f"spec__trainer__{field}": value})))
    assert parse_job(byo("slime", spec__trainer__script="tools/train_async.py")).spec.trainer.script
