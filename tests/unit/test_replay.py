"""forge_load semantics: literal vs template, counted fallback, eval without fallback, rollout ids kept."""

from __future__ import annotations

import logging
import sys
import types
from types import SimpleNamespace

import pytest

from forge_replay import replay
from forge_replay.dumps import DumpError, Sample
from forge_replay.replay import ReplayError, ReplaySource, generate_rollout
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


def test_generate_rollout_returns_the_running_frameworks_types(dumps_dir, monkeypatch):
    """Under slime, outputs must be slime's own classes (its call_rollout_fn wraps anything else)."""
    base = types.ModuleType("slime.rollout.base_types")
    utils_types = types.ModuleType("slime.utils.types")

    class TrainOut:
        def __init__(self, samples, metrics=None):
            self.samples, self.metrics = samples, metrics

    base.RolloutFnTrainOutput = TrainOut
    base.RolloutFnEvalOutput = replay.RolloutFnEvalOutput

    class SlimeLikeSample(SlimeSample):
        @staticmethod
        def from_dict(data):
            s = SlimeLikeSample()
            s.__dict__.update(data)
            return s

    utils_types.Sample = SlimeLikeSample
    for name, module in {"slime": types.ModuleType("slime"), "slime.rollout": types.ModuleType("slime.rollout"),
                         "slime.utils": types.ModuleType("slime.utils"), "slime.rollout.base_types": base,
                         "slime.utils.types": utils_types}.items():
        monkeypatch.setitem(sys.modules, name, module)
    replay._SOURCES.clear()
    out = generate_rollout(_args(dumps_dir), 0, None)
    assert isinstance(out, TrainOut) and all(isinstance(s, SlimeLikeSample) for s in out.samples)
    assert out.samples[0].tokens == slime_samples(seed=0)[0].tokens


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
