"""replay.verify refuses bad data before any GPU (issue 14): the trainer's own conversion (dumps/convert.Conversion)
on every train sample, with the model's vocabulary and positions from its config, in `dumps verify` (the operator's
verify Job) and in `forge-replay run`'s pre-flight, which stops before Ray starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT, MODEL_MOUNT
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.controller.render import render
from forge_replay.controller.settings import OperatorSettings
from forge_replay.dumps import Sample, SampleError, save
from forge_replay.dumps.convert import NO_LIMITS, Conversion, ModelLimits, check_samples, to_train_data
from forge_replay.dumps.synth import synth_samples
from forge_replay.dumps.model_limits import model_limits
from forge_replay.dumps.verify import verify_dumps

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 32}


def _samples(n=4, prompt_len=4, response_len=6, vocab=128):
    return synth_samples(0, n // 2, 2, prompt_len=prompt_len, response_len=response_len, seed=0, vocab_size=vocab)


def _job(tmp_path, *, reward_key=None, model=None, n_samples_per_prompt=None, verify=True):
    replay = {"mode": "debug", "dumps": {"claimName": "d", "path": "rollout_{rollout_id}.pt"}, "numRollouts": 2,
              "verify": verify}
    if reward_key:
        replay["rewardKey"] = reward_key
    trainer = {"gpusPerNode": 0, **({"nSamplesPerPrompt": n_samples_per_prompt} if n_samples_per_prompt else {})}
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": "refuse", "namespace": "default"},
            "spec": {"replay": replay, "model": model or {"config": TINY}, "trainer": trainer}}


# --- the conversion: one function for the trainer and verify ------------------------------------------------------


@pytest.mark.parametrize("limits, change, problem", [
    (ModelLimits(vocab_size=100), lambda s: s.tokens.__setitem__(2, 100),
     "token 2 is 100, outside the model's vocabulary [0, 100) (vocab_size)"),
    (ModelLimits(max_positions=9), lambda s: None, "holds 10 tokens, more than the model's 9 positions"),
])
def test_the_conversion_refuses_what_the_model_cannot_take(limits, change, problem):
    samples = _samples(vocab=50)
    change(samples[3])
    assert len(to_train_data(samples)) == 4  # within no limits, the same samples convert
    for convert in (Conversion(limits=limits), lambda s: check_samples(s, limits=limits)):
        with pytest.raises(SampleError) as info:
            convert(samples)
        assert info.value.field == "tokens" and info.value.index == (3 if limits.vocab_size else 0)
        assert problem in str(info.value)
    assert len(Conversion(limits=ModelLimits(vocab_size=101, max_positions=10))(samples)) == 4  # at the edge: fits


def test_conversion_for_job_is_what_the_rollout_manager_trains_with(tmp_path):
    spec = parse_job(_job(tmp_path, reward_key="acc", n_samples_per_prompt=4)).spec
    limits = ModelLimits(128, 32)
    assert Conversion.for_job(spec, limits) == Conversion(4, True, "acc", limits)
    samples = _samples(n=6)
    with pytest.raises(SampleError, match="6 samples do not split into groups of 4"):
        Conversion.for_job(spec)(samples)


# --- the model's limits: read from its config, without weights ---------------------------------------------------


def test_model_limits_from_a_config_dict_and_a_checkpoint_directory(tmp_path):
    assert model_limits(TINY) == (ModelLimits(128, 32), "")
    from forge_replay.dumps.model_config import config_from_dict

    config_from_dict({**TINY, "vocab_size": 77, "max_position_embeddings": 55}).save_pretrained(tmp_path / "ckpt")
    assert not [p for p in os.listdir(tmp_path / "ckpt") if p != "config.json"]  # a config, no weights
    assert model_limits(str(tmp_path / "ckpt")) == (ModelLimits(77, 55), "")
    defaults, _ = model_limits({"architectures": ["LlamaForCausalLM"]})  # transformers' defaults, as training builds
    assert defaults.vocab_size == 32000 and defaults.max_positions == 2048


def test_an_unreadable_model_config_is_noted_and_its_checks_skipped(tmp_path):
    (tmp_path / "empty").mkdir()
    limits, note = model_limits(str(tmp_path / "empty"))
    assert limits == NO_LIMITS
    assert note.startswith(f"cannot read the model config of {tmp_path / 'empty'} (") and "not checked" in note
    save(tmp_path / "rollout_0.pt", 0, _samples())
    report = verify_dumps(str(tmp_path), "rollout_{rollout_id}.pt", 1, conversion=Conversion(), notes=(note,))
    assert report.ok and report.to_dict()["notes"] == [note] and report.summary().startswith(f"note: {note}\n")
    limits, note = model_limits({"model_type": "no-such-model"})  # another trainer's transformers may know it
    assert limits == NO_LIMITS and note.startswith("cannot read the model config of spec.model.config (")
    with pytest.raises(ValueError, match="model_type"):  # the builtin trainer builds from it: the spec's error
        model_limits({"model_type": "no-such-model"}, builds_from_config=True)


# --- verify: every refusal names rollout, file, sample and field -------------------------------------------------


def test_verify_with_the_job_settings_refuses_each_kind_of_bad_data(tmp_path):
    def refusal(samples, conversion) -> str:
        save(tmp_path / "rollout_1.pt", 1, samples)
        report = verify_dumps(str(tmp_path), "rollout_{rollout_id}.pt", 2, conversion=conversion)
        assert [c.status for c in report.checks] == ["ok", "unreadable"], report.summary()
        assert "UNREADABLE train 1" in report.summary()
        return report.checks[1].message

    save(tmp_path / "rollout_0.pt", 0, _samples())
    good = Conversion(limits=ModelLimits(128, 32))
    where = f"{tmp_path / 'rollout_1.pt'}: sample 1, field"
    keyed = _samples()
    keyed[1].reward = {"acc": 1.0}
    assert f"{where} 'reward': is a dict (keys ['acc']); set replay.rewardKey" in refusal(keyed, good)
    for s in keyed:
        s.reward = {"acc": 1.0}
    keyed[1].reward = {"format": 1.0}
    assert f"{where} 'reward': has no key 'acc' (keys ['format'])" in refusal(keyed, Conversion(reward_key="acc"))
    wide = _samples()
    wide[1].tokens[0] = 128
    assert f"{where} 'tokens': token 0 is 128, outside the model's vocabulary" in refusal(wide, good)
    long = _samples()
    long[1].tokens += [1] * 30
    long[1].response_length += 30
    long[1].loss_mask = None
    assert f"{where} 'tokens': holds 40 tokens, more than the model's 32 positions" in refusal(long, good)
    lengths = _samples()
    lengths[1].response_length = 12
    assert f"{where} 'response_length': 12 is outside 0..len(tokens)=10" in refusal(lengths, good)
    masks = _samples()
    masks[1].loss_mask = [1, 0]
    assert f"{where} 'loss_mask': has length 2, expected response_length=6" in refusal(masks, good)
    huge = _samples()
    huge[1].rollout_log_probs = [-0.1] * 5 + [10**400]  # beyond float range: float() alone would raise OverflowError
    assert f"{where} 'rollout_log_probs': value 5 is 1000000" in refusal(huge, good)
    # without the job's settings (a bare `dumps verify`) dict rewards and positions are not judged
    assert verify_dumps(str(tmp_path), "rollout_{rollout_id}.pt", 2).checks[1].status == "unreadable"  # masks
    save(tmp_path / "rollout_1.pt", 1, keyed)
    assert verify_dumps(str(tmp_path), "rollout_{rollout_id}.pt", 2).ok


def test_the_verify_cli_takes_the_model_and_the_grouping(tmp_path):
    from forge_replay.cli import main

    samples = _samples(n=6, vocab=100)
    samples[4].tokens[1] = 120
    save(tmp_path / "rollout_0.pt", 0, samples)
    base = ["dumps", "verify", "--root", str(tmp_path), "--path", "rollout_{rollout_id}.pt", "--num-rollouts", "1"]
    assert CliRunner().invoke(main, base).exit_code == 0
    small = json.dumps({**TINY, "vocab_size": 100})
    result = CliRunner().invoke(main, [*base, "--no-reward-key", "--model-config", small])
    assert result.exit_code == 1 and "sample 4, field 'tokens': token 1 is 120, outside" in result.output
    result = CliRunner().invoke(main, [*base, "--no-reward-key", "--n-samples-per-prompt", "4"])
    assert result.exit_code == 1 and "6 samples do not split into groups of 4" in result.output
    result = CliRunner().invoke(main, [*base, "--model", str(tmp_path / "nowhere"), "--json"])
    assert result.exit_code == 0, result.output
    assert "cannot read the model config" in json.loads(result.output)["notes"][0]
    for bad in ("[1]", "{not json"):
        result = CliRunner().invoke(main, [*base, "--model-config", bad])
        assert result.exit_code == 2 and "--model-config: " in result.output, bad
    result = CliRunner().invoke(main, [*base, "--model-config", json.dumps({"model_type": "no-such-model"})])
    assert result.exit_code == 0 and "note: cannot read the model config of spec.model.config" in result.output


# --- the verify Job and `forge-replay run` run the same checks ----------------------------------------------------


def _verify_job_argv(document, dumps_root, model_root=None) -> list[str]:
    objects = render(parse_job(document), OperatorSettings(runtime_image="example.com/runtime:test"))
    (job,) = [o for o in objects if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    local = {DUMPS_MOUNT: str(dumps_root), MODEL_MOUNT: str(model_root)}
    assert all(m["readOnly"] for m in pod["containers"][0]["volumeMounts"])
    argv = []
    for arg in pod["containers"][0]["command"][1:]:
        mount = next((m for m in mounts if arg == m or arg.startswith(m + "/")), None)
        argv.append(arg.replace(mount, local[mount], 1) if mount else arg)
    return argv


@pytest.mark.parametrize("case", ["dict reward, no rewardKey", "token outside the vocabulary", "ok"])
@pytest.mark.parametrize("model", ["config", "path"])
def test_the_verify_job_and_run_refuse_the_same_samples(tmp_path, case, model):
    """The rendered verify Job's command (run here with the PVC mounts mapped to folders) and `forge-replay run`'s
    pre-flight give the same verdict and the same message, the model's limits read from the same config."""
    from forge_replay.cli import main
    from forge_replay.runtime.driver import DumpsRefused, preflight
    from forge_replay.dumps.model_config import config_from_dict

    samples = _samples()
    if case.startswith("dict"):
        for s in samples:
            s.reward = {"acc": 1.0}
    elif case.startswith("token"):
        samples[2].tokens[3] = 128
    for n in (0, 1):
        save(tmp_path / "dumps" / f"rollout_{n}.pt", n, samples)
    spec_model = {"config": TINY}
    if model == "path":
        config_from_dict(TINY).save_pretrained(tmp_path / "models" / "tiny")
        spec_model = {"claimName": "models", "path": "tiny"}
    document = _job(tmp_path, model=spec_model)
    argv = _verify_job_argv(document, tmp_path / "dumps", tmp_path / "models")
    verified = CliRunner().invoke(main, argv)
    config = RuntimeConfig(job=parse_job(document), dumps_root=str(tmp_path / "dumps"),
                           results_dir=str(tmp_path / "out"), model_root=str(tmp_path / "models"))
    if case == "ok":
        assert verified.exit_code == 0, verified.output
        assert preflight(config).vocab_size == 128 and preflight(config).max_positions == 32
        return
    assert verified.exit_code == 1, verified.output
    with pytest.raises(DumpsRefused) as refused:
        preflight(config)
    field = "'reward': is a dict" if case.startswith("dict") else "'tokens': token 3 is 128, outside"
    line = next(line for line in verified.output.splitlines() if line.startswith("UNREADABLE train 0"))
    assert f"rollout_0.pt: sample {0 if case.startswith('dict') else 2}, field {field}" in line
    assert line in str(refused.value)


def test_run_refuses_a_dict_reward_without_reward_key_before_ray_starts(tmp_path):
    """`forge-replay run` on a dump with dict rewards and no replay.rewardKey: exit 2 quickly, and no Ray process
    was ever started (Ray would have made its session folder under $RAY_TMPDIR)."""
    samples = _samples()
    for s in samples:
        s.reward = {"accuracy": 1.0, "format": 0.5}
    for n in (0, 1):
        save(tmp_path / "dumps" / f"rollout_{n}.pt", n, samples)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_job(tmp_path)))
    ray_tmp = tmp_path / "ray-tmp"
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "forge_replay.cli", "run", str(tmp_path / "job.yaml"),
                           "--dumps-root", str(tmp_path / "dumps"), "--results", str(tmp_path / "out"), "--no-progress"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{tmp_path / 'dumps' / 'rollout_0.pt'}: sample 0, field 'reward': is a dict (keys ['accuracy', 'format']);" \
           " set replay.rewardKey" in done.stderr
    assert "UNREADABLE train 0" in done.stderr and "UNREADABLE train 1" in done.stderr
    assert "starting a local Ray" not in done.stderr and not ray_tmp.exists()
    assert time.monotonic() - started < 60  # no Ray start, no trainer: seconds (imports), never minutes
