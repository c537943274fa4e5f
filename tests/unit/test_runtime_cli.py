"""`forge-replay run` decisions that need no Ray: input errors, forge fail-fast, --synth-missing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.commands.run import run
from forge_replay.runtime.run_inputs import synthesize_if_absent

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


def doc(mode="debug", path="rollout_{rollout_id}.pt", num_rollouts=3, **spec):
    body = {"replay": {"mode": mode, "dumps": {"claimName": "d", "path": path}, "numRollouts": num_rollouts},
            "model": {"config": TINY}, "trainer": {"gpusPerNode": 0}, **spec}
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "t"}, "spec": body}


def invoke(tmp_path, document, *args):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    return CliRunner().invoke(run, [str(job_file), *args])


def test_an_invalid_spec_exits_2_naming_the_field(tmp_path):
    bad = doc()
    bad["spec"]["replay"]["numRollouts"] = 0
    result = invoke(tmp_path, bad)
    assert result.exit_code == 2
    assert "spec.replay.numRollouts" in result.output


WITHOUT_SGLANG = ("import sys; sys.modules['sglang'] = None; from forge_replay.cli import main; "
                  "main(prog_name='forge-replay')")
"""`forge-replay` as on a machine without sglang (installed here for the conformance tests): None in sys.modules
makes both `import sglang` and importlib's find_spec say it is not there."""


def test_forge_mode_without_sglang_or_engine_command_fails_fast(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc(mode="forge", rollout={"numGpus": 1, "numGpusPerEngine": 1})))
    result = subprocess.run([sys.executable, "-c", WITHOUT_SGLANG, "run", str(job_file), "--dumps-root", str(tmp_path),
                             "--synth-missing"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "sglang is not installed" in result.stderr and "--engine-command" in result.stderr, result.stderr
    assert not list(tmp_path.glob("rollout_*.pt"))  # refused before anything was synthesized


def test_a_missing_dumps_root_is_unusable_input_said_before_anything_is_written(tmp_path):
    result = invoke(tmp_path, doc(), "--dumps-root", str(tmp_path / "nowhere"), "--results", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output  # unusable input, as the README says
    assert "dumps root" in result.output and "--dumps-root" in result.output and "--synth-missing" in result.output
    assert not (tmp_path / "out").exists()  # no results folder made, no previous report set aside


def test_a_missing_model_folder_is_unusable_input_before_synth_missing_writes_dumps(tmp_path):
    document = doc()
    document["spec"]["model"] = {"claimName": "models", "path": "Qwen3-8B"}
    result = invoke(tmp_path, document, "--synth-missing", "--dumps-root", str(tmp_path / "dumps"),
                    "--model-root", str(tmp_path / "models"), "--results", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert f"spec.model.path: checkpoint directory {tmp_path / 'models' / 'Qwen3-8B'} does not exist" in result.output
    assert not (tmp_path / "dumps").exists() and not (tmp_path / "out").exists()  # nothing synthesized or set aside


def test_the_in_cluster_runtime_exits_2_for_a_missing_model_folder_before_ray(tmp_path):
    import ray

    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.runtime.__main__ import main

    document = doc()
    document["spec"]["model"] = {"claimName": "models", "path": "Qwen3-8B"}
    (tmp_path / "dumps").mkdir()
    config = RuntimeConfig(job=parse_job(document), dumps_root=str(tmp_path / "dumps"),
                           results_dir=str(tmp_path / "out"), model_root=str(tmp_path / "models"))
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert main(["--config", str(tmp_path / "config.yaml"), "--no-progress"]) == 2
    assert "does not exist" in (tmp_path / "out" / "progress.json").read_text()
    assert not ray.is_initialized()
    config = config.model_copy(update={"dumps_root": str(tmp_path / "no-dumps")})
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert main(["--config", str(tmp_path / "config.yaml"), "--no-progress"]) == 2
    assert f"dumps root {tmp_path / 'no-dumps'} does not exist" in (tmp_path / "out" / "progress.json").read_text()


def test_verify_refuses_a_missing_dump_before_ray_starts(tmp_path):
    import ray

    document = doc()
    document["spec"]["replay"]["dumps"]["fallbackToFirst"] = False
    result = invoke(tmp_path, document, "--dumps-root", str(tmp_path))
    assert result.exit_code == 2  # verify refused the dumps: unusable input
    assert "dump verification failed" in result.output and str(tmp_path / "rollout_0.pt") in result.output
    assert not ray.is_initialized()


@pytest.mark.parametrize(("reward_key", "problem"), [
    (None, "is a dict (keys ['accuracy', 'format']); set replay.rewardKey"),
    ("score", "has no key 'score' (keys ['accuracy', 'format'])"),
])
def test_verify_refuses_dict_rewards_the_reward_key_cannot_read_before_ray_starts(tmp_path, reward_key, problem):
    """Rewards are checked under spec.replay.rewardKey as training reads them, before Ray starts (issue 19)."""
    import ray

    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples
    from forge_replay.runtime.driver import ReplayRunError, preflight

    samples = synth_samples(0, 2, 2, prompt_len=4, response_len=6, seed=0, vocab_size=128)
    for sample in samples:
        sample.reward = {"accuracy": 1.0, "format": 0.5}
    samples[3].reward = {"format": 0.5} if reward_key else samples[3].reward
    save(tmp_path / "rollout_0.pt", 0, samples)
    document = doc(num_rollouts=1)
    if reward_key:
        document["spec"]["replay"]["rewardKey"] = reward_key
    result = invoke(tmp_path, document, "--dumps-root", str(tmp_path), "--results", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output  # unusable input, before Ray
    assert "dump verification failed" in result.output and "train 0" in result.output
    assert f"{tmp_path / 'rollout_0.pt'}: sample 0, field 'reward': {problem}" in result.output
    assert not ray.is_initialized()
    # the key every sample has passes the same pre-flight; the one a sample lacks is named with its index
    document["spec"]["replay"]["rewardKey"] = "format"
    good = parse_job(document)
    config = RuntimeConfig(job=good, dumps_root=str(tmp_path), results_dir=str(tmp_path / "out"), model_root=None)
    assert preflight(config).vocab_size == 128
    if reward_key:
        config.job.spec.replay.reward_key = "accuracy"
        with pytest.raises(ReplayRunError, match=r"sample 3, field 'reward': has no key 'accuracy'"):
            preflight(config)
    assert not ray.is_initialized()


def test_synth_missing_writes_dumps_only_when_none_exist(tmp_path):
    job = parse_job(doc(num_rollouts=3))
    messages = []
    written = synthesize_if_absent(job, str(tmp_path / "a"), messages.append)
    assert sorted(p.rsplit("/", 1)[1] for p in written) == ["rollout_0.pt", "rollout_1.pt", "rollout_2.pt"]
    assert "synthesized 3 dump(s)" in messages[0]
    # one file present: nothing is filled in (that would hide the fallback a user may be testing)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rollout_0.pt").write_bytes((tmp_path / "a" / "rollout_0.pt").read_bytes())
    assert synthesize_if_absent(job, str(tmp_path / "b"), messages.append) == []
    assert sorted(f.name for f in (tmp_path / "b").iterdir()) == ["rollout_0.pt"]


def test_synthesized_tokens_fit_the_model_vocabulary(tmp_path):
    from forge_replay.dumps import load

    job = parse_job(doc(path="fixed.pt", num_rollouts=2))
    (path,) = synthesize_if_absent(job, str(tmp_path), lambda _: None)
    assert max(max(s.tokens) for s in load(path).samples) < TINY["vocab_size"]


def test_synth_missing_refuses_a_million_rollouts_before_filling_the_disk(tmp_path):
    result = invoke(tmp_path, doc(num_rollouts=1_000_000), "--synth-missing", "--dumps-root", str(tmp_path / "d"),
                    "--results", str(tmp_path / "results"))
    assert result.exit_code == 2, result.output
    assert "--synth-missing would write 1000000 dumps of" in result.output and "more than the 1 GiB" in result.output
    assert not list((tmp_path / "d").iterdir())  # the one dump written to measure is gone again


def test_synth_missing_into_an_unwritable_place_says_so_without_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = invoke(tmp_path, doc(), "--synth-missing", "--dumps-root", str(blocker / "dumps"),
                    "--results", str(tmp_path / "results"))
    assert result.exit_code == 1, result.output
    assert f"--synth-missing cannot write dumps under {blocker / 'dumps'}: " in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_run_takes_a_gitops_file_with_one_job_and_other_kinds(tmp_path):
    """Issue 25: a GitOps folder's file holds the job and its baseline ConfigMap; run skips the ConfigMap, as
    validate does, and still refuses a file with no job or two."""
    from forge_replay.runtime.run_inputs import Unusable as _Unusable, load_one_job

    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"report.json": "{}"}}
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump_all([configmap, doc()]))
    assert load_one_job(str(path)).spec.replay.mode == "debug"
    for docs, fragment in (([configmap], "holds 0 ForgeReplayJob document(s) and 1 of other kinds"),
                           ([doc(), doc()], "holds 2 ForgeReplayJob document(s)")):
        path.write_text(yaml.safe_dump_all(docs))
        with pytest.raises(_Unusable, match=re.escape(fragment)):
            load_one_job(str(path))


def test_a_stop_written_off_as_unraisable_is_acted_on_and_not_shown(capsys):
    # A SIGTERM whose KeyboardInterrupt landed inside Ray's Cython import: Python wrote it off ("Exception ignored
    # ... Traceback" on stderr) and the run went on to finish with exit 0.
    import signal
    import sys

    from forge_replay.runtime import local_run as cli

    class WrittenOff:
        def __del__(self):
            raise KeyboardInterrupt

    hook, sys.unraisablehook = sys.unraisablehook, cli._unraisable_unless_our_stop
    try:
        WrittenOff()  # no stop asked: shown as Python shows it
        assert "KeyboardInterrupt" in capsys.readouterr().err
        cli._STOPPED_BY.append(signal.SIGTERM)
        WrittenOff()
        assert capsys.readouterr().err == ""
        with pytest.raises(KeyboardInterrupt):  # the next phase of the run acts on it
            cli._stop_point()
    finally:
        sys.unraisablehook = hook
        cli._STOPPED_BY.clear()
