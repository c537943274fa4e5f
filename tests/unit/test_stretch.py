"""spec.replay.stretch.maxTokens (issue 32, item 3): recorded samples stretched so each rollout's longest reaches
maxTokens, every per-token field tiled in step, through the trainer's own Conversion and batch packing; refused
beyond the model's positions before Ray; recorded in report.json."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.cli import main
from forge_replay.dumps import Sample, SampleError, save
from forge_replay.dumps.convert import Conversion, ModelLimits
from forge_replay.dumps.stretch import STRETCH_FIELD, stretch_samples
from forge_replay.dumps.verify_request import verify_command
from forge_replay.runtime.driver import UnusableInput, preflight
from forge_replay.runtime.report import RunReport, combine_rank_results, stretch_report, write_json
from forge_replay.runtime.rollout_manager import RolloutManager
from forge_replay.runtime.trainer.batching import build_micro_batch, segment_bounds
from tests.unit.spec_factory import byo_job, debug_job
from tests.unit.test_report import rank_result

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}


@st.composite
def rollouts(draw):
    """One rollout as a dump holds it: groups of samples with their own prompt and response lengths, loss masks, log
    probs, teacher log probs, routed experts (one row per predicted position, a numpy array or a torch tensor, or
    none), and an extra per-token field of a newer dump; and a maxTokens at or above the longest sample."""
    groups = draw(st.integers(1, 3))
    per_group = draw(st.integers(1, 3))
    experts_as = draw(st.sampled_from([None, "numpy", "torch"]))
    samples = []
    for g in range(groups):
        prompt = draw(st.lists(st.integers(0, 127), min_size=1, max_size=6))
        for k in range(per_group):
            response = draw(st.lists(st.integers(0, 127), min_size=1, max_size=9))
            r, total = len(response), len(prompt) + len(response)
            mask = draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=r, max_size=r)))
            experts = np.arange((total - 1) * 2, dtype=np.int32).reshape(total - 1, 2)
            sample = Sample(
                group_index=g, index=g * per_group + k, rollout_id=7, prompt=f"prompt {g}", tokens=prompt + response,
                response="text", response_length=r, reward=draw(st.floats(-2, 2, allow_nan=False)),
                loss_mask=mask, rollout_log_probs=[-(j + 1) / 10 for j in range(r)],
                teacher_log_probs=[-(j + 1) / 20 for j in range(r)],
                rollout_routed_experts=None if experts_as is None else (
                    experts if experts_as == "numpy" else torch.from_numpy(experts)),
                remove_sample=draw(st.booleans()) and mask is not None, weight_versions=["3"],
            )
            sample.token_entropy = [float(j) for j in range(total)]  # one per token: a run-time extra field
            samples.append(sample)
    samples[0].remove_sample, samples[0].loss_mask = False, None  # a rollout with no loss token is refused anyway
    longest = max(len(s.tokens) for s in samples)
    return samples, longest + draw(st.integers(0, 3 * longest))


def _rows(value):
    return value.tolist() if hasattr(value, "tolist") else list(value)


@settings(max_examples=60, deadline=None)
@given(rollouts())
def test_stretched_samples_keep_every_per_token_field_aligned_and_pass_the_trainers_own_conversion(case):
    samples, max_tokens = case
    before = [s.to_dict() for s in samples]
    plain = Conversion()(samples)
    data = Conversion(stretch_max_tokens=max_tokens, limits=ModelLimits(128, max_tokens))(samples)
    stretched, record = stretch_samples(samples, max_tokens)
    longest = max(len(s.tokens) for s in samples)

    assert [s.to_dict() for s in samples] == before  # the recorded samples are never changed
    assert record.longest_before == longest and record.longest_after == max_tokens == max(map(len, data.tokens))
    assert record.factor == pytest.approx(max_tokens / longest)
    # prompts, rewards, groups and what grouping makes of them are kept
    assert (data.rewards, data.group_ids, data.rollout_ids, data.truncated) == (
        plain.rewards, plain.group_ids, plain.rollout_ids, plain.truncated)
    assert data.advantages == pytest.approx(plain.advantages)
    assert [(s.group_index, s.index, s.prompt, s.reward, s.weight_versions) for s in stretched] == [
        (s.group_index, s.index, s.prompt, s.reward, s.weight_versions) for s in samples]

    batch = build_micro_batch(data, list(range(len(samples))), vocab_size=128)  # what a trainer rank trains
    bounds = segment_bounds(batch.position_ids)
    for i, (old, new) in enumerate(zip(samples, stretched)):
        total, r = len(old.tokens), old.response_length
        prompt, new_total = total - r, total * max_tokens // longest  # its share of maxTokens, rounded down
        new_r = new_total - prompt
        tile = [j % r for j in range(new_r)]  # response position j of the stretched sample is old position j % r
        assert len(data.tokens[i]) == new_total and data.response_lengths[i] == new_r
        assert data.tokens[i][:prompt] == old.tokens[:prompt]
        assert data.tokens[i][prompt:] == [old.tokens[prompt + t] for t in tile]
        mask = [0] * r if old.remove_sample else old.loss_mask or [1] * r
        assert data.loss_masks[i] == [mask[t] for t in tile]
        assert data.rollout_log_probs[i] == [old.rollout_log_probs[t] for t in tile]
        assert new.teacher_log_probs == [old.teacher_log_probs[t] for t in tile]
        assert new.token_entropy == old.token_entropy[:prompt] + [old.token_entropy[prompt + t] for t in tile]
        if old.rollout_routed_experts is not None:
            assert type(new.rollout_routed_experts) is type(old.rollout_routed_experts)
            rows = _rows(old.rollout_routed_experts)
            assert _rows(new.rollout_routed_experts) == rows[:prompt - 1] + [rows[prompt - 1 + t] for t in tile]
        start, end = bounds[i], bounds[i + 1]  # the packed sequence: every per-token array in step with the tokens
        assert end - start == new_total
        assert batch.input_ids[start:end].tolist() == data.tokens[i]
        assert batch.loss_mask[start + prompt:end].tolist() == data.loss_masks[i]
        assert not batch.loss_mask[start:start + prompt].any() and not batch.has_old_logp[start:start + prompt].any()
        assert batch.old_logp[start + prompt:end].tolist() == pytest.approx(data.rollout_log_probs[i])
        assert batch.advantages[start:end].tolist() == pytest.approx([data.advantages[i]] * new_total)


def _samples(lengths=((3, 5), (3, 2), (4, 4))):
    return [Sample(group_index=0, index=i, rollout_id=0, tokens=list(range(p + r)), response_length=r, reward=float(i))
            for i, (p, r) in enumerate(lengths)]


def test_max_tokens_below_the_longest_sample_is_refused_naming_the_field_and_the_sample():
    with pytest.raises(SampleError) as info:
        Conversion(stretch_max_tokens=7)(_samples())
    assert (info.value.index, info.value.field) == (0, STRETCH_FIELD)
    assert "7 is below this sample's 8 tokens" in str(info.value) and "at least 8" in str(info.value)
    data = Conversion(stretch_max_tokens=8)(_samples())  # equal: nothing to stretch, nothing refused
    assert [len(t) for t in data.tokens] == [8, 5, 8] and data.stretch.factor == 1.0


def test_a_per_response_field_of_another_length_is_refused_not_left_misaligned():
    samples = _samples()
    samples[1].rollout_log_probs = [-0.1] * 3
    with pytest.raises(SampleError, match="sample 1, field 'rollout_log_probs': has length 3, expected"):
        stretch_samples(samples, 16)


def _stretch_job(max_tokens: int, positions: int = 64) -> dict:
    return debug_job(spec__replay__stretch={"maxTokens": max_tokens}, spec__replay__numRollouts=1,
                     spec__replay__dumps__path="rollout_{rollout_id}.pt",
                     spec__model__config={**TINY, "max_position_embeddings": positions},
                     spec__trainer={"gpusPerNode": 0})


def test_max_tokens_beyond_the_models_positions_is_refused_before_ray_and_by_the_verify_job(tmp_path):
    """The run's pre-flight refuses it before any dump is read or Ray started, and the
    operator's verify Job command refuses it once (exit 2), naming the field."""
    (tmp_path / "dumps").mkdir()
    save(tmp_path / "dumps" / "rollout_0.pt", 0, _samples())
    job = parse_job(_stretch_job(65))
    config = RuntimeConfig(job=job, dumps_root=str(tmp_path / "dumps"), results_dir=str(tmp_path / "out"))
    with pytest.raises(UnusableInput) as refused:
        preflight(config)
    assert str(refused.value).startswith(f"{STRETCH_FIELD}: 65 is more than the model's 64 positions")
    argv = verify_command(job, str(tmp_path / "dumps"), None, in_pod=False)
    assert argv[argv.index("--stretch-max-tokens") + 1] == "65"
    verified = CliRunner().invoke(main, argv[1:])
    assert verified.exit_code == 2 and f"{STRETCH_FIELD}: 65 is more than the model's 64 positions" in verified.output
    within = parse_job(_stretch_job(64))
    assert preflight(config.model_copy(update={"job": within})).max_positions == 64  # at the limit: it verifies
    assert CliRunner().invoke(main, verify_command(within, str(tmp_path / "dumps"), None, in_pod=False)[1:]).exit_code == 0


def test_the_spec_takes_a_positive_max_tokens_for_the_builtin_trainer_only():
    assert parse_job(_stretch_job(64)).spec.replay.stretch.max_tokens == 64
    for doc, path in ((_stretch_job(0), "spec.replay.stretch.maxTokens"),
                      (byo_job("slime", "debug", spec__replay__stretch={"maxTokens": 64}), "spec.replay.stretch")):
        with pytest.raises(SpecInvalid) as invalid:
            parse_job(doc)
        assert path in [p.path for p in invalid.value.problems]


def test_report_json_carries_the_stretch_of_every_rollout_trained(tmp_path):
    """The rollout manager's real conversion (no Ray: the batches stay local) to report.json."""
    os.makedirs(tmp_path / "dumps")
    save(tmp_path / "dumps" / "rollout_0.pt", 0, _samples())
    job = parse_job(_stretch_job(32))
    batch = RolloutManager(job, str(tmp_path / "dumps"), world_size=1, use_object_store=False).get_rollout(0)
    assert batch.tokens == 32 + 5 * 4 + 32  # shares of 32 of samples of 8, 5 and 8 tokens
    report = RunReport(job="stretch", mode="debug", world_size=1, device="cpu", num_params=1, started_at="now")
    report.rollouts.append(combine_rank_results(0, batch, [rank_result(0, -1.0, 10, 1.0)], 0.0, 1.0))
    report.stretch = stretch_report(32, report.rollouts)
    write_json(report, tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["stretch"] == {"max_tokens": 32, "rollouts": 1, "longest_before": 8, "longest_after": 32,
                                  "factor_min": 4.0, "factor_max": 4.0, "tokens_before": 21, "tokens_after": 84}
    assert written["rollouts"][0]["stretch"]["longest_after"] == 32


def test_validate_refuses_max_tokens_beyond_an_inline_model_configs_positions(tmp_path):
    for max_tokens, code in ((65, 1), (64, 0)):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(_stretch_job(max_tokens)))
        result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")])
        assert result.exit_code == code, result.output
        assert (f"job.yaml: {STRETCH_FIELD}: 65 is more than the model's 64 positions" in result.output) == (code == 1)


def test_a_sweeps_stretch_beyond_an_inline_model_configs_positions_is_refused_before_anything_runs(tmp_path):
    """Each point stretched past the model would be refused when it ran; validate, the pre-flight (and the operator,
    through the same function) refuse the sweep first, naming the axis and the points."""
    from forge_replay.dumps.model_limits import inline_position_problems

    axis = {"field": "replay.stretch.maxTokens", "values": [32, 64, 96, 128]}
    doc = _stretch_job(32)
    doc["spec"]["sweep"] = {"axes": [axis], "budgetGiB": 4}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")])
    assert result.exit_code == 1, result.output
    refusal = "job.yaml: spec.sweep.axes[0]: replay.stretch.maxTokens 96, 128 are more than the model's 64 positions"
    assert refusal in result.output
    job = parse_job(doc)
    assert [p.path for p in inline_position_problems(job.spec)] == ["spec.sweep.axes[0]"]
    (tmp_path / "dumps").mkdir()
    save(tmp_path / "dumps" / "rollout_0.pt", 0, _samples())
    config = RuntimeConfig(job=job, dumps_root=str(tmp_path / "dumps"), results_dir=str(tmp_path / "out"))
    with pytest.raises(UnusableInput, match=r"spec\.sweep\.axes\[0\]: replay\.stretch\.maxTokens 96, 128 are"):
        preflight(config)
    axis["values"] = [32, 64]
    assert inline_position_problems(parse_job(doc).spec) == []
    unknown_type = {**doc["spec"]["model"]["config"], "architectures": ["SomeNewForCausalLM"]}
    doc["spec"]["model"]["config"], axis["values"] = unknown_type, [32, 128]
    assert inline_position_problems(parse_job(doc).spec) == []  # read only through transformers: the pre-flight's
