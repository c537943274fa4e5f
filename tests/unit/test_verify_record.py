"""Verify once, before the GPUs (issue 27): the verify Job records what it checked, the runtime's pre-flight trusts
what is unchanged under the same settings and verifies the rest; verify runs files in parallel processes; the model's
limits are read without transformers; a dumps root or model folder that does not exist is unusable input (2)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT, RESULTS_MOUNT
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.controller.render import render
from forge_replay.controller.settings import OperatorSettings
from forge_replay.dumps import save
from forge_replay.commands.dumps import dumps
from forge_replay.dumps.convert import Conversion, ModelLimits
from forge_replay.dumps.synth import synth_samples
from forge_replay.dumps.model_limits import model_limits
from forge_replay.dumps.verify import cgroup_cpu_quota, verify_dumps
from forge_replay.dumps.verify_record import RECORD_FILE, read_record
from forge_replay.runtime.driver import preflight

TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}


def _doc(num_rollouts=4, **replay):
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": "once", "namespace": "team", "uid": "0a1b2c3d-0000-4000-8000-000000000000"},
            "spec": {"replay": {"mode": "debug", "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"},
                                "numRollouts": num_rollouts, **replay},
                     "model": {"config": TINY}, "trainer": {"gpusPerNode": 0}, "results": {"claimName": "results"}}}


def _write_dumps(root, num_rollouts=4) -> list[str]:
    paths = []
    for n in range(num_rollouts):
        path = os.path.join(root, "run", f"rollout_{n}.pt")
        save(path, n, synth_samples(n, 2, 2, prompt_len=4, response_len=6, seed=n, vocab_size=128))
        paths.append(path)
    return paths


def _mounted(value: str | None, tmp_path) -> str | None:
    """A pod's mount path as this machine's folder standing in for it."""
    if value is None:
        return None
    for mount, folder in ((DUMPS_MOUNT, tmp_path / "dumps"), (RESULTS_MOUNT, tmp_path / "results")):
        if value.startswith(mount):
            return str(folder) + value[len(mount):]
    return value


def _run_verify_job(job, tmp_path):
    """The rendered verify Job's own command, on this machine's folders; returns its CLI result."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(job, OperatorSettings())}
    container = objects[("Job", "once-verify")]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["forge-replay", "dumps", "verify"]
    args = [_mounted(a, tmp_path) for a in container["command"][3:]]
    return CliRunner().invoke(dumps, ["verify", *args]), objects


def _runtime_config(objects, tmp_path) -> RuntimeConfig:
    """The runtime config the operator mounts in the RayJob's pods, on this machine's folders."""
    config = RuntimeConfig.model_validate(yaml.safe_load(objects[("ConfigMap", "once-config")]["data"]["config.yaml"]))
    return config.model_copy(update={"dumps_root": _mounted(config.dumps_root, tmp_path),
                                     "results_dir": _mounted(config.results_dir, tmp_path),
                                     "verify_record": _mounted(config.verify_record, tmp_path)})


def test_the_preflight_trusts_the_verify_jobs_record_and_verifies_only_the_file_changed_after_it(tmp_path, caplog):
    """Done when (issue 27): given the verify Job's record, the runtime's pre-flight trusts every file it covers and
    verifies again exactly the one file changed after it, and says so in its log and in report.json's preflight."""
    job = parse_job(_doc())
    paths = _write_dumps(tmp_path / "dumps")
    result, objects = _run_verify_job(job, tmp_path)
    assert result.exit_code == 0, result.output
    config = _runtime_config(objects, tmp_path)
    assert config.verify_record == str(tmp_path / "results" / "team" / "once" / "0a1b2c3d" / RECORD_FILE)
    assert f"recorded 4 verified file(s) in {config.verify_record}" in result.output
    record = json.loads(open(config.verify_record).read())
    assert [(f["path"], f["kind"], f["size"]) for f in record["files"]] == [
        (f"run/rollout_{n}.pt", "train", os.path.getsize(p)) for n, p in enumerate(paths)]
    assert record["settings"]["conversion"] == {"n_samples_per_prompt": None, "normalize_std": True, "reward_key": None,
                                                "vocab_size": 128, "max_position_embeddings": 64}

    with caplog.at_level(logging.INFO, logger="forge_replay.runtime.driver"):
        untouched = preflight(config).preflight
    assert (untouched["verified"], untouched["trusted"], untouched["note"], untouched["workers"]) == (0, 4, "", 1)
    assert untouched["trusted_files"] == [f"run/rollout_{n}.pt" for n in range(4)]

    stat = os.stat(paths[2])  # the same bytes, touched: a changed mtime is never trusted
    os.utime(paths[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="forge_replay.runtime.driver"):
        checked = preflight(config).preflight
    assert (checked["verified"], checked["trusted"]) == (1, 3)
    assert checked["verified_files"] == ["run/rollout_2.pt"] and checked["record"] == config.verify_record
    assert checked["seconds"] >= 0
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("preflight:")]
    assert line.startswith(f"preflight: verified 1 file(s), trusted 3 file(s) from the verify record "
                           f"{config.verify_record} (")
    assert line.endswith("verified: run/rollout_2.pt (changed since the verify record (size or mtime))")

    samples = synth_samples(1, 2, 2, prompt_len=4, response_len=6, seed=1, vocab_size=128)
    samples[0].tokens[0] = 500  # outside the vocabulary: the changed file is verified, and refused
    save(paths[1], 1, samples)
    from forge_replay.runtime.driver import DumpsRefused

    with pytest.raises(DumpsRefused, match=r"rollout_1.pt: sample 0, field 'tokens': token 0 is 500"):
        preflight(config)


def _rewrite(path: str, **changes) -> None:
    with open(path) as handle:
        document = json.load(handle)
    with open(path, "w") as handle:
        json.dump({**document, **changes}, handle)


@pytest.mark.parametrize("spoil, says", [
    (lambda path: os.unlink(path), "no verify record at {record}: every file is verified here"),
    (lambda path: open(path, "w").write("{not json"), "cannot read the verify record {record} ("),
    (lambda path: _rewrite(path, version=99),
     "cannot read the verify record {record} (version 99, this forge-replay reads version 1)"),
])
def test_a_record_that_is_missing_or_unreadable_trusts_nothing_and_says_so(tmp_path, spoil, says):
    job = parse_job(_doc(num_rollouts=2))
    _write_dumps(tmp_path / "dumps", 2)
    result, objects = _run_verify_job(job, tmp_path)
    assert result.exit_code == 0, result.output
    config = _runtime_config(objects, tmp_path)
    spoil(config.verify_record)
    checked = preflight(config).preflight
    assert (checked["verified"], checked["trusted"]) == (2, 0)
    assert checked["note"].startswith(says.format(record=config.verify_record))


def test_a_record_made_under_other_settings_trusts_nothing_and_names_them(tmp_path):
    root = str(tmp_path / "dumps")
    _write_dumps(root, 2)
    record = str(tmp_path / "record.json")
    runner = CliRunner()
    base = ["verify", "--root", root, "--path", "run/rollout_{rollout_id}.pt", "--num-rollouts", "2", "--jobs", "1"]
    result = runner.invoke(dumps, [*base, "--no-reward-key", "--model-config", json.dumps(TINY), "--record", record])
    assert result.exit_code == 0, result.output
    same = Conversion(limits=ModelLimits(128, 64))
    assert verify_dumps(root, "run/rollout_{rollout_id}.pt", 2, conversion=same, trust=record).preflight()[
        "trusted"] == 2
    other = Conversion(limits=ModelLimits(256, 64))  # another model config: its vocabulary is not the one verified
    report = verify_dumps(root, "run/rollout_{rollout_id}.pt", 2, conversion=other, trust=record)
    assert (report.preflight()["verified"], report.preflight()["trusted"]) == (2, 0)
    assert report.record_note == (f"the verify record {record} was made under other settings (conversion.vocab_size: "
                                  "128 there, 256 here): every file is verified here")
    settings = report.settings.to_dict()
    assert read_record(record, settings).entries == {}
    assert read_record(None, settings).note == "no verify record was given: every file is verified here"


def test_a_file_whose_size_differs_is_verified_again(tmp_path):
    root = str(tmp_path / "dumps")
    paths = _write_dumps(root, 2)
    record = str(tmp_path / "record.json")
    result = CliRunner().invoke(dumps, ["verify", "--root", root, "--path", "run/rollout_{rollout_id}.pt",
                                        "--num-rollouts", "2", "--record", record])
    assert result.exit_code == 0, result.output
    stat = os.stat(paths[0])
    save(paths[0], 0, synth_samples(0, 3, 2, prompt_len=4, response_len=6, seed=0, vocab_size=128))
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old mtime, another size
    report = verify_dumps(root, "run/rollout_{rollout_id}.pt", 2, trust=record)
    assert report.preflight()["verified_files"] == ["run/rollout_0.pt"] and report.checks[0].samples == 6


def test_files_verified_in_parallel_processes_give_the_same_report(tmp_path):
    root = str(tmp_path / "dumps")
    paths = _write_dumps(root, 4)
    bad = synth_samples(1, 2, 2, prompt_len=4, response_len=6, seed=1, vocab_size=128)
    bad[2].loss_mask = [1, 0]
    save(paths[1], 1, bad)
    os.unlink(paths[2])  # falls back to rollout 0's file
    reports = [verify_dumps(root, "run/rollout_{rollout_id}.pt", 4, conversion=Conversion(), jobs=jobs)
               for jobs in (1, 3)]
    one, three = (r.to_dict() for r in reports)
    assert one == three
    assert [f["status"] for f in one["files"]] == ["ok", "unreadable", "fallback", "ok"]
    assert "sample 2, field 'loss_mask': has length 2" in one["files"][1]["message"]


def test_cgroup_cpu_quota_bounds_the_default_jobs():
    assert cgroup_cpu_quota("max 100000\n") is None
    assert cgroup_cpu_quota("200000 100000\n") == 2
    assert cgroup_cpu_quota("50000 100000") == 1  # half a CPU: one worker
    assert cgroup_cpu_quota(None, "-1", "100000") is None
    assert cgroup_cpu_quota(None, "400000", "100000") == 4
    assert cgroup_cpu_quota(None, None, None) is None


def test_the_verify_job_gets_its_cpus_and_memory_from_the_spec_and_runs_that_many_workers():
    job = parse_job(_doc(verifyResources={"cpus": 6, "memoryGiB": 24}))
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(job, OperatorSettings())}
    container = objects[("Job", "once-verify")]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "6", "memory": "24Gi"}, "limits": {"memory": "24Gi"}}
    jobs = container["command"].index("--jobs")
    assert container["command"][jobs + 1] == "6"
    from forge_replay.api import SpecInvalid

    for bad, field in (({"cpus": 0}, "cpus"), ({"memoryGiB": 2048}, "memoryGiB"), ({"cpus": "2"}, "cpus")):
        with pytest.raises(SpecInvalid) as info:
            parse_job(_doc(verifyResources=bad))
        assert f"spec.replay.verifyResources.{field}" in str(info.value)


def test_without_a_results_claim_there_is_no_record_and_the_runtime_says_it_verifies_everything(tmp_path):
    doc = _doc(num_rollouts=1)
    del doc["spec"]["results"]
    job = parse_job(doc)
    _write_dumps(tmp_path / "dumps", 1)
    result, objects = _run_verify_job(job, tmp_path)
    assert result.exit_code == 0 and "--record" not in json.dumps(objects[("Job", "once-verify")])
    config = _runtime_config(objects, tmp_path)
    assert config.verify_record is None
    checked = preflight(config).preflight
    assert (checked["verified"], checked["trusted"]) == (1, 0)
    assert checked["note"] == "no verify record was given: every file is verified here"


# --- the model's limits, without transformers ---------------------------------------------------------------------


def test_the_model_limits_table_is_what_transformers_builds():
    """Every model type read without transformers gives transformers' own defaults, and every architecture the type
    transformers pairs it with (its causal-LM mapping)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from forge_replay.dumps.model_limits import ARCHITECTURES, POSITION_ALIASES, TYPE_DEFAULTS

    for model_type, (vocab, positions) in TYPE_DEFAULTS.items():
        config = AutoConfig.for_model(model_type)
        assert (config.vocab_size, config.max_position_embeddings) == (vocab, positions), model_type
        positions_key = POSITION_ALIASES.get(model_type, "max_position_embeddings")
        given = AutoConfig.for_model(model_type, vocab_size=77, **{positions_key: 99})
        assert (given.vocab_size, given.max_position_embeddings) == (77, 99), model_type
    for architecture, model_type in ARCHITECTURES.items():
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type] == architecture
    assert set(ARCHITECTURES.values()) == set(TYPE_DEFAULTS)


def test_model_limits_of_the_common_types_read_no_transformers(tmp_path, monkeypatch):
    """`dumps verify` reads vocab_size / max_position_embeddings itself (start-up: no transformers import)."""
    import sys

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 1000}))
    assert model_limits({"model_type": "phi", "vocab_size": 5})[0] == ModelLimits(5, 2048)  # through transformers
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it fails: the limits would be noted away
    assert model_limits({"architectures": ["LlamaForCausalLM"]}) == (ModelLimits(32000, 2048), "")
    assert model_limits({"model_type": "gpt2", "n_positions": 77}) == (ModelLimits(50257, 77), "")
    assert model_limits(str(tmp_path / "ckpt")) == (ModelLimits(1000, 32768), "")
    assert model_limits({"model_type": "qwen2", "vocab_size": "many"}) == (ModelLimits(None, 32768), "")
    limits, note = model_limits({"model_type": "phi", "vocab_size": 5})  # another type: transformers reads it
    assert limits == ModelLimits() and "cannot read the model config of spec.model.config" in note


def test_the_verify_progress_bar_counts_files_and_bytes(tmp_path):
    import re

    root = str(tmp_path / "dumps")
    paths = _write_dumps(root, 3)
    megabytes = sum(os.path.getsize(p) for p in paths) / 1e6
    result = CliRunner().invoke(dumps, ["verify", "--root", root, "--path", "run/rollout_{rollout_id}.pt",
                                        "--num-rollouts", "3", "--jobs", "2"])
    assert result.exit_code == 0, result.output
    bar = result.output.splitlines()[0]
    assert bar.startswith("verifying (2 workers)") and " 3/3 files " in bar, bar
    done, total = re.search(r"([\d.]+)/([\d.]+) kB", bar).groups()  # rich's decimal units
    assert done == total and abs(float(total) / 1e3 - megabytes) < 0.01, bar


def test_the_workers_are_no_more_than_the_memory_holds_of_the_largest_dump():
    from forge_replay.dumps.verify import worker_count

    assert worker_count(4, 10, 200_000_000, None) == (4, "")  # memory unknown: the CPUs decide
    assert worker_count(4, 2, 200_000_000, 64 * 2**30) == (2, "")  # no more workers than files
    workers, note = worker_count(64, 100, 200_000_000, 8 * 2**30)  # a head pod seeing 64 CPUs, 8 GiB left
    assert workers == 5 and note == ("verify ran 5 worker(s), not 64: the 8.0 GiB of memory available hold about 5 of"
                                     " the largest dump (200 MB, about 8x that once loaded)")
    assert worker_count(8, 8, 2_000_000_000, 2**30)[0] == 1  # never fewer than one
