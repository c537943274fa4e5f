"""What slime and miles refused only once their GPUs were up (issue 34), refused (or noted) by validate and verify
first: each rule's valid and invalid cases, from the rules data (frameworks/upstream_rules.json) and the doubles'
Sample. scripts/backend-check confirms the same cases against slime's and miles' own code by hand."""

from __future__ import annotations

import pytest

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.crd import spec_schema
from forge_replay.api.job import CROSS_FIELD_RULES
from forge_replay.dumps.acceptance import UpstreamSettings, dropped_notes, refusals
from forge_replay.dumps.synth import synth_samples
from forge_replay.frameworks.batch import batch_layout
from forge_replay.frameworks.flags import BACKENDS
from forge_replay.frameworks.rules import MEGATRON, upstream_rule
from tests.unit.spec_factory import REQUIRED_ARGS, byo_job

GPUS8 = ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8"]  # what forge-replay injects for 1 x 8 GPUs


def problems(doc) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def cel_rules() -> list[dict]:
    found = []

    def walk(node):
        if isinstance(node, dict):
            found.extend(node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)

    walk(spec_schema())
    return found


def settings(backend: str, *args: str) -> UpstreamSettings:
    return UpstreamSettings.from_args(backend, [*REQUIRED_ARGS, *args], None)


def episodes(count: int, per_episode: int = 1, rollout_ids: bool = True):
    """``count`` episodes of ``per_episode`` samples; without ``rollout_ids`` every sample has none (older dumps)."""
    samples = synth_samples(0, count, per_episode, 3, 2)
    for i, s in enumerate(samples):
        s.rollout_id = i // per_episode if rollout_ids else None
    return samples


def where(backend: str, rule_id: str, index: int = 0) -> str:
    cite = upstream_rule(backend, rule_id).cites[index]
    return f"{cite['file']}:{cite['line']}" + (f"-{cite['end']}" if "end" in cite else "")


# ------------------------------------------------------------------ the batch layout both sides read


def test_layout_follows_megatron_and_the_flags() -> None:
    tp2 = batch_layout("slime", [*GPUS8, "--tensor-model-parallel-size", "2"])
    assert (tp2.world_size, tp2.model_size, tp2.data_parallel_size, tp2.global_batch_size) == (8, 2, 4, 4)
    assert tp2.global_batch_from == "default"  # Megatron: micro-batch x data-parallel size
    steps = batch_layout("slime", [*GPUS8, "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                                   "--num-steps-per-rollout", "2"])
    assert (steps.global_batch_size, steps.global_batch_from) == (16, "--num-steps-per-rollout")
    assert batch_layout("slime", ["--global-batch-size=64"]).global_batch_size == 64
    assert batch_layout("slime", ["--micro-batch-size", "2"]).global_batch_size is None  # no world size: unknown
    cells = batch_layout("miles", [*GPUS8, "--tensor-model-parallel-size", "2", "--use-fault-tolerance",
                                   "--ft-components", "train", "rollout"])
    assert (cells.cells, cells.data_parallel_size, cells.global_batch_size) == (4, 1, 1)
    assert batch_layout("slime", [*GPUS8, "--indep-dp"]).cells == 1  # slime has no cells
    assert batch_layout("miles", [*GPUS8, "--train-backend", "fsdp"]).global_batch_size is None
    assert upstream_rule(MEGATRON, "data-parallel-size")["flags"][0] == "--tensor-model-parallel-size"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode,loader", [("forge", "forgeReplay"), ("debug", "forgeReplay"), ("debug", "upstream")])
@pytest.mark.parametrize("ft", [None, {"enabled": True}, {"enabled": True, "components": ["train", "rollout"]}])
def test_verify_flags_are_injected_as_the_trainer_gets_them(backend: str, mode: str, loader: str, ft) -> None:
    """What verify's acceptance reads besides the team's args is what forge-replay injects, with the same values."""
    from forge_replay.backends.argv import injected_argv
    from forge_replay.frameworks.batch import verify_flags

    extra = {"spec__faultTolerance": ft} if ft else {}
    doc = byo_job(backend, mode, spec__replay__loader=loader, spec__trainer__args=["--global-batch-size", "32"],
                  spec__replay__dumps__fallbackToFirst=loader != "upstream", **extra)
    try:
        spec = parse_job(doc).spec
    except SpecInvalid:
        return  # a combination validate refuses (slime's fault tolerance in debug mode, ...)
    injected, flags = injected_argv(spec, "/mnt/d"), verify_flags(spec, f"/mnt/d/{spec.replay.dumps.path}")
    assert flags and set(_by_flag(flags).items()) <= set(_by_flag(injected).items()), (flags, injected)


def _by_flag(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """flag -> the values that follow it."""
    out: dict[str, tuple[str, ...]] = {}
    for i, item in enumerate(argv):
        if item.startswith("--"):
            rest = argv[i + 1:]
            out[item] = tuple(rest[:next((k for k, v in enumerate(rest) if v.startswith("--")), len(rest))])
    return out


# ------------------------------------------------------------------ 1. miles resets --start-rollout-id without --load


def test_miles_start_needs_a_checkpoint_to_load(tmp_path) -> None:
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1\n")
    found = problems(byo_job("miles", spec__replay__startRolloutId=2))
    assert found == [f"spec.replay.startRolloutId: miles resets --start-rollout-id to 0 unless --load names a directory "
                     f"holding latest_checkpointed_iteration.txt ({upstream_rule('miles', 'start-needs-checkpoint').where})"
                     ": it would replay rollouts 0-9, not 2-9; give --load DIR (the checkpoint the run saved before "
                     "rollout 2) in spec.trainer.args, or set startRolloutId: 0"]
    assert "miles/utils/arguments.py:3034-3058" in found[0]
    loaded = byo_job("miles", spec__replay__startRolloutId=2, spec__trainer__args=["--load", "/mnt/forge-replay/model/c"])
    assert parse_job(loaded).spec.replay.start_rollout_id == 2
    assert parse_job(byo_job("miles")).spec.replay.start_rollout_id == 0
    assert parse_job(byo_job("slime", spec__replay__startRolloutId=2)).spec.replay.start_rollout_id == 2  # slime keeps it
    from tests.byo.train import parse  # the stand-in follows the rule, as miles does

    injected = ["--stand-in-backend", "miles", *REQUIRED_ARGS, "--start-rollout-id", "2", "--num-rollout", "4"]
    assert parse(injected).start_rollout_id == 0
    assert parse([*injected, "--load", "/nowhere"]).start_rollout_id == 0
    assert parse([*injected, "--load", str(tmp_path)]).start_rollout_id == 2
    [cel] = [r for r in cel_rules() if r.get("fieldPath") == ".replay.startRolloutId"]
    assert "'--load'" in cel["rule"].replace('"', "'") and "miles" in cel["rule"]


# ------------------------------------------------------------------ 2. miles trims rollouts without rollout ids


def test_miles_refuses_fewer_samples_than_a_global_batch_without_rollout_ids() -> None:
    few = episodes(5, rollout_ids=False)
    [refusal] = refusals(few, settings("miles", "--global-batch-size", "8"))
    assert (refusal.index, refusal.field) == (0, "rollout_id")
    assert refusal.problem.startswith("no sample has one, and the rollout's 5 samples are fewer than the global batch "
                                      "size 8 (from --global-batch-size): miles cuts such a rollout")
    assert "miles/ray/rollout/rollout_data_conversion.py:40-45" in refusal.problem
    assert "--disable-rollout-trim-samples" in refusal.problem
    assert refusals(episodes(5), settings("miles", "--global-batch-size", "8")) == []  # compact: never trimmed
    assert refusals(few, settings("miles", "--global-batch-size", "8", "--disable-rollout-trim-samples")) == []
    assert refusals(few, settings("miles", "--global-batch-size", "8", "--load-debug-rollout-data", "/d/r.pt")) == []
    assert refusals(few, settings("miles", "--global-batch-size", "4")) == []
    assert refusals(few, settings("slime", "--global-batch-size", "2")) == []  # slime has no trim
    # Megatron's default global batch size: micro-batch 1 x data-parallel 8 on 1 x 8 GPUs
    [default] = refusals(few, settings("miles", *GPUS8))
    assert "global batch size 8 (Megatron's default" in default.problem
    assert "megatron/training/arguments.py:497-498" in default.problem
    # --use-dynamic-global-batch-size: the samples rounded down to the data-parallel size, at least it
    assert refusals(few, settings("miles", *GPUS8, "--use-dynamic-global-batch-size"))[0].field == "rollout_id"
    assert refusals(episodes(9, rollout_ids=False), settings("miles", *GPUS8, "--use-dynamic-global-batch-size")) == []


def test_miles_trim_drops_the_rest_and_verify_says_so() -> None:
    twelve = episodes(12, rollout_ids=False)
    assert refusals(twelve, settings("miles", "--global-batch-size", "8")) == []
    [note] = dropped_notes(twelve, settings("miles", "--global-batch-size", "8"))
    assert note.startswith("miles trains 8 of its 12 samples (a multiple of the global batch size 8, from "
                           "--global-batch-size) and drops the last 4, as no sample has a rollout_id")
    assert dropped_notes(episodes(12), settings("miles", "--global-batch-size", "8")) == []
    assert dropped_notes(episodes(16, rollout_ids=False), settings("miles", "--global-batch-size", "8")) == []


# ------------------------------------------------------------------ 3. slime's top-p token ids


def _with_top_p(samples):
    for s in samples:
        s.rollout_top_p_token_ids = list(range(2 * s.response_length))
        s.rollout_top_p_token_offsets = [2 * i for i in range(s.response_length + 1)]
    return samples


def test_slime_top_p_needs_token_ids_and_offsets() -> None:
    top_p = settings("slime", "--rollout-top-p", "0.9")
    [refusal] = refusals(episodes(4), top_p)
    assert (refusal.index, refusal.field) == (0, "rollout_top_p_token_ids")
    assert refusal.problem.startswith("is None: with --rollout-top-p 0.9 (spec.trainer.args) slime asserts every sample")
    assert where("slime", "top-p-needs-token-ids") in refusal.problem
    good = _with_top_p(episodes(4))
    assert refusals(good, top_p) == []
    good[2].rollout_top_p_token_offsets = good[2].rollout_top_p_token_offsets[:-1]
    [short] = refusals(good, top_p)
    assert (short.index, short.field) == (2, "rollout_top_p_token_offsets") and "not response_length + 1" in short.problem
    good = _with_top_p(episodes(4))
    good[1].rollout_top_p_token_ids = good[1].rollout_top_p_token_ids[:-1]
    assert "not at len(rollout_top_p_token_ids)" in refusals(good, top_p)[0].problem
    assert refusals(episodes(4), settings("slime", "--rollout-top-p=1")) == []  # 1.0: nothing asserted
    assert refusals(episodes(4), settings("slime", "--rollout-top-p", "1.2")) != []  # != 1.0, not only < 1
    assert refusals(episodes(4), settings("slime", "--rollout-top-p", "0.9",
                                          "--custom-convert-samples-to-train-data-path", "team.convert")) == []
    assert refusals(episodes(4), settings("miles", "--rollout-top-p", "0.9")) == []  # miles has no such assertion


# ------------------------------------------------------------------ 4. slime's step schedule and dropped episodes


def test_slime_steps_must_divide_across_the_data_parallel_ranks() -> None:
    on_8 = [*GPUS8, "--tensor-model-parallel-size", "2"]  # data-parallel size 4
    [refusal] = refusals(episodes(12), settings("slime", *on_8, "--global-batch-size", "12", "--micro-batch-size", "2"))
    assert refusal.problem.startswith("step 0 of this rollout holds 12 samples (12 episodes a step, from "
                                      "--global-batch-size): 6 micro-batches of --micro-batch-size 2, not a multiple "
                                      "of the data-parallel size 4")
    assert "slime/utils/dp_schedule.py:167-185" in refusal.problem and "--use-dynamic-batch-size" in refusal.problem
    ok = ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "5", "--global-batch-size", "10", "--micro-batch-size",
          "2"]
    assert refusals(episodes(10), settings("slime", *ok)) == []  # 5 micro-batches over 5 ranks
    assert refusals(episodes(6), settings("slime", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2",
                                          "--global-batch-size", "6", "--micro-batch-size", "4")) == []  # 2 over 2
    assert refusals(episodes(12), settings("slime", *on_8, "--global-batch-size", "12", "--micro-batch-size", "2",
                                           "--use-dynamic-batch-size")) == []
    [few] = refusals(episodes(4), settings("slime", *GPUS8, "--global-batch-size", "4"))
    assert "fewer than the data-parallel size 8" in few.problem and "slime/utils/dp_schedule.py:151-154" in few.problem
    # two samples an episode: a step of 4 episodes holds 8 samples, 8 micro-batches over 8 ranks
    assert refusals(episodes(4, per_episode=2), settings("slime", *GPUS8, "--global-batch-size", "4")) == []
    assert refusals(episodes(12), settings("miles", *on_8, "--global-batch-size", "12", "--micro-batch-size", "2")) == []


def test_slime_default_global_batch_size_is_checked() -> None:
    """Without --global-batch-size or --num-steps-per-rollout, Megatron's micro-batch x data-parallel size."""
    [refusal] = refusals(episodes(4), settings("slime", *GPUS8))
    assert refusal.problem.startswith("4 samples hold 4 episode(s), fewer than the 8 a training step takes")
    assert refusals(episodes(8), settings("slime", *GPUS8)) == []


def test_slime_drops_episodes_past_the_last_step_with_a_note() -> None:
    twelve = settings("slime", *GPUS8, "--global-batch-size", "8")
    assert refusals(episodes(12), twelve) == []
    [note] = dropped_notes(episodes(12), twelve)
    assert note.startswith("slime trains 8 of its 12 episodes (1 step(s) of 8, from --global-batch-size) and drops the "
                           "last 4 (4 sample(s)) without a word")
    assert where("slime", "trailing-episodes-dropped") in note
    assert dropped_notes(episodes(16), twelve) == [] and dropped_notes(episodes(4), twelve) == []  # whole steps; refused instead
    assert dropped_notes(episodes(6, per_episode=2), settings("slime", "--global-batch-size", "4"))[0].startswith(
        "slime trains 4 of its 6 episodes") and "(4 sample(s))" in dropped_notes(episodes(6, 2), settings(
            "slime", "--global-batch-size", "4"))[0]


# ------------------------------------------------------------------ 5. --debug-rollout-only


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["forge", "debug"])
def test_debug_rollout_only_is_refused(backend: str, mode: str) -> None:
    found = problems(byo_job(backend, mode, spec__trainer__args=["--lr", "1e-6", "--debug-rollout-only"]))
    assert found == [f"spec.trainer.args[2]: --debug-rollout-only cannot be used in a replay: {backend} then never "
                     f"trains, and with the --debug-train-only of a debug replay its parser fails "
                     f"({upstream_rule(backend, 'debug-rollout-only').where}); remove it"]
    assert parse_job(byo_job(backend, mode, spec__trainer__args=["--lr", "1e-6"])).spec.trainer.args[0] == "--lr"
    assert any("--debug-rollout-only" in r["rule"] for r in cel_rules())


# ------------------------------------------------------------------ 8. slime's fault tolerance in a debug replay


@pytest.mark.parametrize("components", [None, ["train"], ["rollout"], ["train", "rollout"]])
def test_slime_debug_fault_tolerance_says_the_one_setting_that_runs(components) -> None:
    ft = {"enabled": True, **({"components": components} if components else {})}
    found = problems(byo_job("slime", "debug", spec__faultTolerance=ft))
    assert found == [f"spec.faultTolerance.enabled: slime's --use-fault-tolerance only watches the rollout engines, "
                     f"which a debug replay does not start (with --debug-train-only it does nothing: "
                     f"{upstream_rule('slime', 'ft-watches-rollout-only').where}): set faultTolerance.enabled: false; "
                     "neither components: [train] nor [rollout] can be run"]
    assert parse_job(byo_job("slime", "debug", spec__faultTolerance={"enabled": False})).spec.replay.mode == "debug"


def test_fault_tolerance_advice_elsewhere_is_unchanged_and_can_be_taken() -> None:
    ft_train, ft_rollout = {"enabled": True, "components": ["train"]}, {"enabled": True, "components": ["rollout"]}
    forge = problems(byo_job("slime", spec__faultTolerance=ft_train))
    assert [p.split(": ", 1)[0] for p in forge] == ["spec.faultTolerance.components"]
    assert forge[0].endswith("use [rollout] or backend miles")
    assert parse_job(byo_job("slime", spec__faultTolerance=ft_rollout)).spec.fault_tolerance.enabled  # taken: runs
    miles = problems(byo_job("miles", "debug", spec__faultTolerance=ft_rollout))
    assert miles == ["spec.faultTolerance.components: rollout is selected, but debug mode has no engines to watch; use "
                     "components: [train]"]
    taken = byo_job("miles", "debug", spec__faultTolerance=ft_train, spec__trainer__args=["--global-batch-size", "32"])
    assert parse_job(taken).spec.fault_tolerance.components == ["train"]
    cel = {r["message"]: r["rule"] for r in cel_rules()}
    assert "['slime']" in cel["spec.faultTolerance.components: debug mode has no engines to watch; use components: "
                              "[train]"].replace('"', "'")
    assert "self.replay.mode == 'debug'" in cel["spec.faultTolerance.components: slime's fault tolerance has no "
                                                "components: [train] alone cannot be run"]


# ------------------------------------------------------------------ 6. miles' train fault tolerance: cells


def test_miles_cells_need_a_global_batch_size_each_can_take() -> None:
    ft = {"enabled": True, "components": ["train"]}
    [found] = problems(byo_job("miles", spec__faultTolerance=ft))
    assert found.startswith("spec.faultTolerance.components: train makes miles run 8 independent data-parallel cells "
                            "(nodes x gpusPerNode 8 // TP x PP x CP 1)")
    assert "global batch size is 1 (Megatron's default" in found and "miles/backends/megatron_utils/model.py:771-773" in found
    assert "give --global-batch-size in spec.trainer.args" in found
    assert problems(byo_job("miles", spec__faultTolerance=ft, spec__trainer__args=["--global-batch-size", "4"]))
    ok = byo_job("miles", spec__faultTolerance=ft, spec__trainer__args=["--global-batch-size", "32"])
    assert parse_job(ok).spec.fault_tolerance.enabled
    one_cell = byo_job("miles", spec__faultTolerance=ft, spec__trainer__args=["--tensor-model-parallel-size", "8"])
    assert parse_job(one_cell).spec.trainer.args[0] == "--tensor-model-parallel-size"
    [indep] = problems(byo_job("miles", spec__trainer__args=["--indep-dp"]))
    assert indep.startswith("spec.trainer.args: --indep-dp makes miles run 8 independent data-parallel cells")
    rollout_only = byo_job("miles", spec__faultTolerance={"enabled": True, "components": ["rollout"]})
    assert parse_job(rollout_only).spec.fault_tolerance.components == ["rollout"]
    [rule] = [r for r in CROSS_FIELD_RULES if r.check.__name__ == "_cells_need_a_batch"]
    assert rule.cel is None and not any("global-batch-size // cells" in r["message"] for r in cel_rules())


def test_miles_cells_make_one_step_of_each_rollout() -> None:
    cells = [*GPUS8, "--tensor-model-parallel-size", "2", "--use-fault-tolerance", "--ft-components", "train"]
    assert settings("miles", *cells, "--global-batch-size", "64").cells == 4
    assert refusals(episodes(64), settings("miles", *cells, "--global-batch-size", "64")) == []
    [two] = refusals(episodes(64), settings("miles", *cells, "--global-batch-size", "32"))
    assert "4 cells take 16 of its 64 samples, 8 a step" in two.problem and ": 2 step(s)" in two.problem
    assert where("miles", "indep-dp-one-step", 5) in two.problem
    assert "ZeroDivisionError" in refusals(episodes(64), settings("miles", *cells, "--global-batch-size", "2"))[0].problem
    # without rollout ids miles trims to the global batch size first: 70 samples train as 64, one step
    assert refusals(episodes(70, rollout_ids=False), settings("miles", *cells, "--global-batch-size", "64")) == []
    assert refusals(episodes(128), settings("miles", *cells, "--global-batch-size", "64"))  # 32 a cell: 2 steps
    assert refusals(episodes(64), settings("miles", *GPUS8, "--global-batch-size", "32")) == []  # no cells


# ------------------------------------------------------------------ 7. rollout log probs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flag", ["--use-tis", "--get-mismatch-metrics", "--use-rollout-logprobs"])
def test_flags_that_train_on_rollout_log_probs_need_them(backend: str, flag: str) -> None:
    samples = episodes(4)
    assert refusals(samples, settings(backend, flag)) == []
    for s in samples:
        s.rollout_log_probs = None
    [refusal] = refusals(samples, settings(backend, flag))
    assert (refusal.index, refusal.field) == (0, "rollout_log_probs")
    assert refusal.problem.startswith(f"is None: with {flag} (spec.trainer.args) {backend} trains on every sample's")
    assert refusals(samples, settings(backend)) == []  # nothing reads them
    custom = refusals(samples, settings(backend, flag, "--custom-tis-function-path", "team.tis"))
    assert (custom == []) == (flag != "--use-rollout-logprobs")  # the team's TIS function decides


@pytest.mark.parametrize("backend,cited", [("slime", "slime/observability/rollout_data_utils.py:30-33"),
                                           ("miles", "miles/backends/training_utils/cp_utils.py:418")])
def test_log_probs_on_some_samples_only_are_refused(backend: str, cited: str) -> None:
    samples = episodes(4)
    samples[3].rollout_log_probs = None
    [refusal] = refusals(samples, settings(backend))
    assert refusal.index == 3 and refusal.problem.startswith("is None while sample 0 has rollout log probs")
    assert cited in refusal.problem
    samples[0].rollout_log_probs, samples[3].rollout_log_probs = None, samples[1].rollout_log_probs
    assert refusals(samples, settings(backend)) == []  # sample 0 has none: none are collected
    assert refusals(episodes(4), settings(backend)) == []


# ------------------------------------------------------------------ what slime's and miles' own code did, recorded


def test_forge_replay_refuses_what_the_frameworks_did_in_the_by_hand_check(tmp_path) -> None:
    """scripts/backend-check ran slime's and miles' own code at the pins on each of its cases and recorded what they
    did (tests/unit/golden/backend-check.json); forge-replay's verdict on every case must still agree with it."""
    import json

    from forge_replay.frameworks.rules import _rules
    from tests.unit.test_byo_upstream_rules import _script

    check = _script("backend-check")
    recorded = json.loads(check.RECORD.read_text())
    assert recorded["pins"] == {name: f"{part['repository']}@{part['commit']}" for name, part in _rules().items()}
    items = check.cases(str(tmp_path))
    assert {i["id"] for i in items} == set(recorded["cases"])
    assert {i["id"][0] for i in items} == set("12345678")  # every one of the eight
    for item in items:
        theirs = recorded["cases"][item["id"]]
        ours = check.forge_replay_verdict(item)
        if theirs["outcome"] != "code":
            assert (ours["verdict"], theirs["outcome"]) in check.AGREE, (item["id"], ours, theirs)


# ------------------------------------------------------------------ verify's note of dropped episodes, end to end


def _slime_dumps(tmp_path, count: int = 12, ids=(0, 1)) -> str:
    from forge_replay.dumps.files import save

    for n in ids:
        save(tmp_path / f"rollout_{n}.pt", n, episodes(count))
    return "rollout_{rollout_id}.pt"


def test_verify_notes_dropped_episodes_in_its_output_record_and_preflight(tmp_path) -> None:
    from forge_replay.dumps.verify import verify_dumps
    from forge_replay.dumps.verify_record import read_record, record_document, write_record

    template = _slime_dumps(tmp_path)
    upstream = settings("slime", *GPUS8)  # Megatron's default global batch size: 1 x 8
    report = verify_dumps(str(tmp_path), template, 2, backend="slime", upstream=upstream)
    assert report.ok and len(report.dropped) == 1
    assert report.dropped[0].startswith("rollouts 0, 1: slime trains 8 of its 12 episodes")
    assert f"note: {report.dropped[0]}" in report.summary()
    assert report.to_dict()["notes"] == report.dropped and report.preflight()["notes"] == report.dropped
    record = tmp_path / "verify-record.json"
    write_record(str(record), record_document(report.settings.to_dict(), report.entries, report.dropped))
    trusted = verify_dumps(str(tmp_path), template, 2, backend="slime", upstream=upstream, trust=str(record))
    assert len(trusted.trusted) == 2 and trusted.dropped == report.dropped  # the record keeps each file's note
    assert all(e.dropped for e in read_record(str(record), report.settings.to_dict()).entries.values())
    whole = verify_dumps(str(tmp_path), _slime_dumps(tmp_path, 16), 2, backend="slime", upstream=upstream)
    assert whole.ok and whole.dropped == [] and whole.preflight()["notes"] == []


def test_a_slime_job_reports_the_notes_in_report_json_preflight(tmp_path) -> None:
    """The verify Job writes its record into the run's results folder (a slime job too); the publish step after the
    script copies the record's notes into report.json's preflight."""
    from forge_replay.backends import publish
    from forge_replay.dumps.verify_request import VerifyRequest, run_verify

    dumps, results = tmp_path / "dumps", tmp_path / "results"
    dumps.mkdir()
    _slime_dumps(dumps)
    job = parse_job(byo_job("slime", "debug", spec__replay__numRollouts=2,
                            spec__replay__dumps={"claimName": "d", "path": "rollout_{rollout_id}.pt"}))
    request = VerifyRequest.for_job(job, dumps_root=str(dumps), model_root=None, in_pod=False,
                                    record=str(results / "verify-record.json"))
    assert run_verify(request) == 0
    assert publish.publish(str(results), "j", "slime", "train.py", 0, 2, None, None) == []
    import json

    checked = json.loads((results / "report.json").read_text())["preflight"]
    assert checked["record"] == str(results / "verify-record.json")
    [note] = checked["notes"]
    assert note.startswith("rollouts 0, 1: slime trains 8 of its 12 episodes")
    assert publish.preflight(str(tmp_path)) is None  # no record: no preflight
    (tmp_path / "verify-record.json").write_text("{")
    assert publish.preflight(str(tmp_path))["note"].startswith("cannot read the verify record")


def test_render_gives_a_slime_verify_job_the_flags_the_rules_read_and_no_record() -> None:
    """No record in a cluster: the verify Job (uid 10001) would make the run's folder before the team's image, whose
    root user (no CAP_DAC_OVERRIDE) then could not write there (e2e scenario 7)."""
    from forge_replay.controller.render import verify_job
    from forge_replay.controller.settings import OperatorSettings

    doc = byo_job("miles", "debug", spec__results={"claimName": "results"}, spec__trainer__args=["--global-batch-size",
                                                                                               "32"],
                  spec__faultTolerance={"enabled": True, "components": ["train"]})
    job = parse_job({**doc, "metadata": {"name": "m", "namespace": "ns", "uid": "u-1"}})
    command = verify_job(job, OperatorSettings())["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--record" not in command
    argv = __import__("json").loads(command[command.index("--trainer-args") + 1])
    assert argv[-7:] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--use-fault-tolerance",
                         "--ft-components", "train"]
    assert UpstreamSettings.from_args("miles", argv, None).cells == 8


def test_a_local_run_sets_the_previous_record_aside(tmp_path) -> None:
    """forge-replay run writes verify's record into its results folder; a previous run's must not lend its notes to
    this run's report.json (with spec.replay.verify false nothing replaces it)."""
    from forge_replay.backends.local import _set_record_aside

    (tmp_path / "verify-record.json").write_text('{"notes": ["old"]}')
    _set_record_aside(str(tmp_path))
    _set_record_aside(str(tmp_path))  # none left: nothing to do
    assert not (tmp_path / "verify-record.json").exists()
    assert (tmp_path / "verify-record.previous.json").read_text() == '{"notes": ["old"]}'
