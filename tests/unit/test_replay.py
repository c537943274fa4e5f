"""forge_load semantics: literal vs template, counted fallback, eval without fallback, rollout ids kept."""

from __future__ import annotations

import argparse
import functools
import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from forge_replay import replay
from forge_replay.dumps import DumpError, Sample, evals
from forge_replay.replay import ReplayError, ReplaySource, generate_rollout
from tests.doubles import frameworks
from tests.doubles import upstream_types as upstream
from tests.unit.test_dumps_slime_format import SlimeSample, save_debug_rollout_data, slime_samples


@pytest.fixture
def dumps_dir(tmp_path):
    """rollout_0 and rollout_1 (samples carry rollout_id 40/41), eval_1 with dict rewards; no rollout_2."""
    save_debug_rollout_data(tmp_path / "rollout_0.pt", 0, slime_samples(seed=0, rollout_id=40))
    save_debug_rollout_data(tmp_path / "rollout_1.pt", 1, slime_samples(seed=1, rollout_id=41))
    evals = slime_samples(n_groups=1, group_size=3, seed=2, dict_rewards=True)
    evals[1].reward = None
    evals[0].status = SlimeSample.Status.TRUNCATED
    save_debug_rollout_data(tmp_path / "rollout_eval_1.pt", 1, evals)
    return tmp_path


def test_template_loads_per_rollout_and_keeps_sample_rollout_ids(dumps_dir):
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt")
    replayed = source.load_train(1)
    assert replayed.path == str(dumps_dir / "rollout_1.pt") and not replayed.fallback_used
    assert {s.rollout_id for s in replayed.samples} == {41}
    assert source.fallback_count == 0


def test_fallback_is_logged_and_counted(dumps_dir, caplog):
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt")
    with caplog.at_level(logging.WARNING, logger="forge_replay.replay"):
        replayed = source.load_train(2)
        source.load_train(5)
    assert replayed.fallback_used and replayed.path == str(dumps_dir / "rollout_0.pt")
    assert {s.rollout_id for s in replayed.samples} == {40}  # never overwritten with 2
    assert source.fallback_count == 2
    assert [(f.rollout_id, f.missing_path) for f in source.fallbacks] == [
        (2, str(dumps_dir / "rollout_2.pt")),
        (5, str(dumps_dir / "rollout_5.pt")),
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert any("rollout 2" in m and "rollout_2.pt" in m and "rollout_0.pt" in m for m in messages)


def test_missing_without_fallback_names_rollout_and_path(dumps_dir):
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt", fallback_to_first=False)
    with pytest.raises(ReplayError) as info:
        source.load_train(2)
    assert info.value.rollout_id == 2 and info.value.path == str(dumps_dir / "rollout_2.pt")
    assert "rollout 2" in str(info.value) and str(dumps_dir / "rollout_2.pt") in str(info.value)


def test_missing_fallback_file_too(tmp_path):
    source = ReplaySource(str(tmp_path), "r_{rollout_id}.pt")
    with pytest.raises(ReplayError, match=r"neither does the fallback .*r_0.pt"):
        source.load_train(3)


def test_literal_path_reused_and_has_no_eval(dumps_dir):
    source = ReplaySource(str(dumps_dir), "rollout_1.pt")
    assert [source.load_train(n).path for n in (0, 3)] == [str(dumps_dir / "rollout_1.pt")] * 2
    assert source.fallback_count == 0
    result = source.load_eval(1)
    assert result.missing and result.path is None and result.samples == [] and "literal" in result.reason
    with pytest.raises(ReplayError, match="literal dump path is missing"):
        ReplaySource(str(dumps_dir), "absent.pt").load_train(0)


def test_each_replayed_rollout_says_which_rollout_id_its_dump_holds_and_its_file_stands_for(dumps_dir):
    """What the rollout manager compares to note a dump whose rollout_id is not its file's (issue 19)."""
    save_debug_rollout_data(dumps_dir / "rollout_3.pt", 9, slime_samples(seed=3))
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt")
    ids = [(r.dump_rollout_id, r.file_rollout_id) for r in map(source.load_train, (1, 2, 3))]
    assert ids == [(1, 1), (0, 0), (9, 3)]  # rollout 2 falls back to rollout 0's file
    literal = ReplaySource(str(dumps_dir), "rollout_3.pt").load_train(5)
    assert (literal.dump_rollout_id, literal.file_rollout_id) == (9, None)  # a literal path is every rollout's


def test_eval_has_no_fallback(dumps_dir, caplog):
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt")
    present = source.load_eval(1)
    assert not present.missing and len(present.samples) == 3
    assert present.rewards("accuracy")[1] == 0.0 and present.truncated[0] is True
    with caplog.at_level(logging.WARNING, logger="forge_replay.replay"):
        missing = source.load_eval(3)
    assert missing.missing and missing.path == str(dumps_dir / "rollout_eval_3.pt") and missing.samples == []
    assert source.fallback_count == 0 and "eval 3" in caplog.text


def test_corrupt_dump_propagates_with_path(dumps_dir):
    (dumps_dir / "rollout_2.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DumpError, match="rollout_2.pt"):
        ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt").load_train(2)


def test_template_rules_come_from_dump_path():
    with pytest.raises(ValueError, match=r"\{step\}"):
        ReplaySource("/mnt", "r_{step}.pt")
    with pytest.raises(ValueError, match="'..'"):
        ReplaySource("/mnt", "../r.pt")


def test_prefetcher_over_replay_source(dumps_dir):
    source = ReplaySource(str(dumps_dir), "rollout_{rollout_id}.pt")
    with source.prefetcher([0, 1, 2]) as prefetcher:
        got = [prefetcher.get(n) for n in (0, 1, 2)]
    assert [g.fallback_used for g in got] == [False, False, True]
    assert source.fallback_count == 1 and len(prefetcher.waits) == 3


# --- slime-compatible rollout function ------------------------------------------------------------


def _args(dumps_dir, **kw):
    base = {"load_forge_rollout_data": str(dumps_dir / "rollout_{rollout_id}.pt"), "reward_key": None,
            "eval_reward_key": None}
    return SimpleNamespace(**(base | kw))


def test_generate_rollout_train_output(dumps_dir):
    replay._SOURCES.clear()
    out = generate_rollout(_args(dumps_dir), 1, data_source=None)
    assert isinstance(out, replay.RolloutFnTrainOutput)
    assert len(out.samples) == 12 and all(isinstance(s, Sample) for s in out.samples)
    assert {s.rollout_id for s in out.samples} == {41}
    assert out.metrics["forge_replay/fallback_used"] == 0
    fell_back = generate_rollout(_args(dumps_dir), 7, data_source=None)
    assert fell_back.metrics == {"forge_replay/fallback_used": 1, "forge_replay/fallbacks": 1}
    with pytest.raises(RuntimeError, match="--load-forge-rollout-data"):
        generate_rollout(SimpleNamespace(load_forge_rollout_data=None), 0, None)


def test_generate_rollout_eval_output(dumps_dir):
    replay._SOURCES.clear()
    out = generate_rollout(_args(dumps_dir, reward_key="format", eval_reward_key="accuracy"), 1, None, evaluation=True)
    data = out.data["forge_eval"]
    evals = slime_samples(n_groups=1, group_size=3, seed=2, dict_rewards=True)
    assert data["rewards"] == [evals[0].reward["accuracy"], 0.0, evals[2].reward["accuracy"]]
    assert data["truncated"] == [True, True, False] and len(data["samples"]) == 3
    # eval_reward_key unset -> reward_key, as slime
    fallback_key = generate_rollout(_args(dumps_dir, reward_key="format"), 1, None, evaluation=True)
    assert fallback_key.data["forge_eval"]["rewards"][0] == evals[0].reward["format"]
    missing = generate_rollout(_args(dumps_dir), 3, None, evaluation=True)
    assert missing.data == {} and missing.metrics == {"forge_replay/eval_missing": 1}


@pytest.mark.parametrize("framework", ["slime", "miles"])
def test_generate_rollout_returns_the_running_frameworks_types(dumps_dir, monkeypatch, framework):
    """Under slime or miles the outputs are the framework's own classes holding its own Samples (status an enum,
    spec_info a dataclass): miles wraps any other output whole as the samples (tests/doubles/frameworks.py)."""
    loaded = frameworks.install(monkeypatch, framework)
    replay._SOURCES.clear()
    call = functools.partial(frameworks.miles_call_rollout_fn, loaded.base_types, generate_rollout)
    out = call(_args(dumps_dir, reward_key="format", eval_reward_key="accuracy"), 0, None, evaluation=False)
    assert type(out) is loaded.base_types.RolloutFnTrainOutput and type(out.samples) is list
    expected = slime_samples(seed=0, rollout_id=40)
    assert [type(s) for s in out.samples] == [loaded.Sample] * len(expected)
    first = out.samples[0]
    assert first.tokens == expected[0].tokens and first.rollout_id == 40
    assert first.status is loaded.Sample.Status(expected[0].status.value)
    assert first.spec_info == loaded.Sample.SpecInfo(**expected[0].spec_info.to_dict())
    assert out.metrics == {"forge_replay/fallback_used": 0, "forge_replay/fallbacks": 0}
    evaluated = call(_args(dumps_dir, eval_reward_key="accuracy"), 1, None, evaluation=True)
    assert type(evaluated) is loaded.base_types.RolloutFnEvalOutput
    samples = evaluated.data["forge_eval"]["samples"]
    assert samples[0].status is loaded.Sample.Status.TRUNCATED and type(samples[0]) is loaded.Sample
    missing = call(_args(dumps_dir), 3, None, evaluation=True)
    assert type(missing) is loaded.base_types.RolloutFnEvalOutput and missing.data == {}


def test_under_miles_samples_hold_miles_own_records(tmp_path, monkeypatch):
    """The loader keeps miles' AdapterRef / RewardSpec inert; miles' own Samples get the real ones back."""
    with upstream.upstream_modules():
        dicts = upstream.miles_sample_dicts(4)
        upstream.miles_dump(tmp_path / "rollout_0.pt", 0, dicts)
    loaded = frameworks.install(monkeypatch, "miles")
    types_module = sys.modules["miles.utils.types"]
    monkeypatch.setattr(types_module, "AdapterRef", upstream.AdapterRef, raising=False)
    monkeypatch.setattr(types_module, "RewardSpec", upstream.RewardSpec, raising=False)
    replay._SOURCES.clear()
    out = generate_rollout(_args(tmp_path), 0, None)
    for sample, source in zip(out.samples, dicts, strict=True):
        assert type(sample) is loaded.Sample and type(sample.adapter) is upstream.AdapterRef
        assert sample.adapter == upstream.AdapterRef(source["adapter"].name, source["adapter"].slot)
        assert (sample.reward_spec is None) == (source["reward_spec"] is None)
        assert sample.reward_spec is None or sample.reward_spec == upstream.RewardSpec(rm_type="math")
        assert sample.metadata["tools"] == {"search", "python"} and type(sample.metadata["span"]) is tuple
        assert sample.rollout_routed_experts is not None and sample.rollout_routed_experts.dtype.name == "int32"


def test_under_slime_vlm_samples_hold_pil_images(tmp_path, monkeypatch):
    """The loader keeps images inert; slime's own Samples get PIL images, one object where the dump had one."""
    from PIL import Image

    with upstream.upstream_modules():
        dicts = upstream.vlm_sample_dicts(2)
        upstream.vlm_dump(tmp_path / "rollout_0.pt", 0, dicts)
    frameworks.install(monkeypatch, "slime")
    replay._SOURCES.clear()
    out = generate_rollout(_args(tmp_path), 0, None)
    for sample, source in zip(out.samples, dicts, strict=True):
        (image,) = sample.multimodal_inputs["images"]
        expected = source["multimodal_inputs"]["images"][0]
        assert isinstance(image, Image.Image) and (image.mode, image.size) == (expected.mode, expected.size)
        assert image.tobytes() == expected.data
        assert sample.prompt[0]["content"][0]["image"] is image
    assert generate_rollout(_args(tmp_path), 0, None).samples[0].tokens == dicts[0]["tokens"]


# --- the rollout function's flags, in slime's and miles' parsers -----------------------------------


def test_add_arguments_adds_every_flag_the_rollout_function_reads():
    parser = argparse.ArgumentParser()
    assert generate_rollout.add_arguments is replay.add_arguments
    generate_rollout.add_arguments(parser)
    assert vars(parser.parse_args([])) == {"load_forge_rollout_data": None, "forge_replay_fallback_to_first": True}
    args = parser.parse_args(["--load-forge-rollout-data", "d/r_{rollout_id}.pt",
                              "--no-forge-replay-fallback-to-first"])
    assert (args.load_forge_rollout_data, args.forge_replay_fallback_to_first) == ("d/r_{rollout_id}.pt", False)


def test_add_arguments_leaves_flags_already_there_alone():
    parser = frameworks.slime_parser()  # slime defines --load-forge-rollout-data itself
    ours = replay.add_arguments(parser)
    replay.add_arguments(parser)  # twice: no conflicting-option error
    assert ours is parser
    (action,) = {a for a in parser._actions if "--load-forge-rollout-data" in a.option_strings}
    assert action.help == "slime's own definition"
    assert parser.parse_args(["--forge-replay-fallback-to-first"]).forge_replay_fallback_to_first is True


def test_miles_accepts_the_forge_flags_through_add_arguments(dumps_dir, monkeypatch):
    template = str(dumps_dir / "rollout_{rollout_id}.pt")
    argv = ["--rollout-function-path", "forge_replay.replay.generate_rollout", "--load-forge-rollout-data", template,
            "--num-rollout", "2", "--no-forge-replay-fallback-to-first"]
    args = frameworks.miles_parse_args(argv)
    assert (args.load_forge_rollout_data, args.forge_replay_fallback_to_first) == (template, False)
    replay._SOURCES.clear()
    assert {s.rollout_id for s in generate_rollout(args, 1, None).samples} == {41}
    with pytest.raises(ReplayError, match="fallback to rollout 0 is off"):
        generate_rollout(args, 2, None)
    monkeypatch.delattr(generate_rollout, "add_arguments")  # what miles did before: it refuses our flag
    with pytest.raises(SystemExit) as refused:
        frameworks.miles_parse_args(argv)
    assert refused.value.code == 2


BLOCKED = ("pydantic", "yaml", "kopf", "kubernetes", "rich", "click")


def test_replay_imports_with_only_torch_and_numpy():
    """A trainer image has torch and numpy, not the operator's dependencies: importing them fails here."""
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {BLOCKED!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked in a trainer image: " + name)
        sys.meta_path.insert(0, Block())
        from forge_replay.replay import generate_rollout, ReplaySource
        assert callable(generate_rollout.add_arguments)
        print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    probe = script.replace("from forge_replay.replay import generate_rollout, ReplaySource", "import forge_replay.cli")
    refused = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "blocked in a trainer image" in refused.stderr  # the blocker does block: the CLI needs click


def test_generate_rollout_prefetches_the_next_dump_while_this_one_trains(dumps_dir):
    replay._SOURCES.clear()
    args = _args(dumps_dir, num_rollout=2)
    first = generate_rollout(args, 0, data_source=None)
    assert {s.rollout_id for s in first.samples} == {40}
    prefetcher = replay._PREFETCHERS[id(replay._source_for(args))]
    assert prefetcher.scheduled(1)
    prefetcher._pending[1].result(timeout=30)  # rollout 1 was loaded in the background ...
    (dumps_dir / "rollout_1.pt").unlink()  # ... so removing its file now changes nothing
    second = generate_rollout(args, 1, data_source=None)
    assert {s.rollout_id for s in second.samples} == {41}
    assert second.metrics["forge_replay/fallback_used"] == 0
    again = generate_rollout(args, 1, data_source=None)  # out of order: loads afresh (and falls back now)
    assert again.metrics["forge_replay/fallback_used"] == 1


# --- eval schedule: before training (slime's train.py) and what a run says about its evals -----------

# start rollout, evalInterval, evalBeforeTrain -> the eval before the first step
BEFORE_TRAIN = [
    (0, 2, True, 0),  # eval on, run starts at rollout 0: eval_0 before the first step
    (0, 2, False, None),  # not asked (slime asks by default; --skip-eval-before-train there)
    (0, 0, True, None),  # eval off: slime evaluates nothing without an eval interval
    (3, 2, True, None),  # a run started later: slime's `rollout_id == 0` never holds
]


@pytest.mark.parametrize("start, interval, asked, expected", BEFORE_TRAIN)
def test_eval_before_train_follows_slime(start, interval, asked, expected):
    assert evals.eval_before_train_id(start, interval, asked) == expected


def test_eval_note_says_what_is_evaluated_and_that_debug_mode_only_does_so_when_asked():
    ids = evals.eval_rollout_ids(0, 4, 2)
    assert ids == [1, 3]
    debug = evals.eval_note("debug", 2, ids, 0)
    assert debug.startswith("debug mode evaluates because evalInterval is 2")
    assert "eval_0 before the first step, eval_1 after rollout 1, eval_3 after rollout 3" in debug
    assert evals.eval_note("debug", 0, [], None) == (
        "debug mode: no eval (evalInterval 0); slime's debug mode (--debug-train-only) never evaluates either")
    assert evals.eval_note("forge", 2, ids, None) == (
        "eval every 2 rollouts: eval_1 after rollout 1, eval_3 after rollout 3")
    assert evals.eval_note("forge", 0, [], None) == "forge mode: no eval (evalInterval 0)"
    assert evals.eval_note("forge", 5, [], None) == "eval every 5 rollouts: none in these rollouts"
