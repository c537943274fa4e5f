"""Every rule of the ForgeReplayJob contract, with valid and invalid cases."""

from __future__ import annotations

import pytest
import yaml

from forge_replay.api import NotAForgeReplayJob, SpecInvalid, parse_job
from tests.unit.spec_factory import DELETE, debug_job, forge_job


def problems(doc):
    with pytest.raises(SpecInvalid) as info:
        parse_job(doc)
    return [str(p) for p in info.value.problems]


def assert_refused(doc, path, fragment=""):
    found = problems(doc)
    assert any(p.startswith(path + ":") and fragment in p for p in found), found


@pytest.mark.parametrize("doc", [forge_job(), debug_job()])
def test_valid_jobs_parse(doc):
    job = parse_job(doc)
    assert job.metadata.name == "memtest"


# Rule 1: mode
def test_mode_must_be_forge_or_debug():
    assert_refused(forge_job(spec__replay__mode="fast"), "spec.replay.mode", "'forge' or 'debug'")


# Rule 2: forge needs rollout, debug forbids it
def test_forge_needs_rollout():
    assert_refused(forge_job(spec__rollout=DELETE), "spec.rollout", "required in forge mode")


def test_debug_forbids_rollout():
    doc = debug_job(spec__rollout={"numGpus": 2, "numGpusPerEngine": 1})
    assert_refused(doc, "spec.rollout", "debug replay never starts sglang engines")


# Rule 3: engine sizes
def test_gpus_per_engine_must_divide():
    doc = forge_job(spec__rollout={"numGpus": 8, "numGpusPerEngine": 3})
    assert problems(doc) == [
        "spec.rollout.numGpusPerEngine: must divide spec.rollout.numGpus (8 is not divisible by 3)"
    ]


@pytest.mark.parametrize("field", ["numGpus", "numGpusPerEngine"])
def test_engine_sizes_at_least_one(field):
    doc = forge_job()
    doc["spec"]["rollout"][field] = 0
    assert_refused(doc, f"spec.rollout.{field}", "greater than or equal to 1")


def test_colocate_must_fit_on_trainer_gpus():
    doc = forge_job(spec__rollout={"numGpus": 16, "numGpusPerEngine": 2, "colocate": True})
    assert_refused(doc, "spec.rollout.numGpus", "= 8")
    ok = forge_job(spec__rollout={"numGpus": 16, "numGpusPerEngine": 2, "colocate": True},
                   spec__trainer={"nodes": 2, "gpusPerNode": 8})
    assert parse_job(ok).spec.rollout.colocate


# Rule 4: fault tolerance components
def test_ft_components_default_to_rollout_when_enabled():
    job = parse_job(forge_job(spec__faultTolerance={"enabled": True}))
    assert job.spec.fault_tolerance.active_components == ["rollout"]


def test_ft_components_only_train_and_rollout():
    assert_refused(forge_job(spec__faultTolerance={"enabled": True, "components": ["trainer"]}),
                   "spec.faultTolerance.components[0]")


def test_ft_components_no_repeats():
    assert_refused(forge_job(spec__faultTolerance={"enabled": True, "components": ["train", "train"]}),
                   "spec.faultTolerance.components", "repeats train")


def test_ft_components_while_disabled_is_an_error():
    assert_refused(forge_job(spec__faultTolerance={"enabled": False, "components": ["train"]}),
                   "spec.faultTolerance.components", "enabled is false")


def test_ft_rollout_in_debug_mode_is_an_error():
    assert_refused(debug_job(spec__faultTolerance={"enabled": True, "components": ["rollout"]}),
                   "spec.faultTolerance.components", "debug mode has no engines")
    assert_refused(debug_job(spec__faultTolerance={"enabled": True}),
                   "spec.faultTolerance.components", "default")
    job = parse_job(debug_job(spec__faultTolerance={"enabled": True, "components": ["train"]}))
    assert job.spec.fault_tolerance.active_components == ["train"]


# Rule 5: dump paths
@pytest.mark.parametrize(
    "path,fragment",
    [
        ("", "at least 1 character"),
        ("/abs/rollout_{rollout_id}.pt", "relative"),
        ("run/../secret.pt", "'..'"),
        ("run/rollout_{step}.pt", "{step}"),
        ("run/rollout_{rollout_id:03d}.pt", "format spec"),
        ("run/rollout_{.pt", "not a valid template"),
    ],
)
def test_bad_dump_paths(path, fragment):
    assert_refused(forge_job(spec__replay__dumps__path=path), "spec.replay.dumps.path", fragment)


@pytest.mark.parametrize("path", ["dumps.pt", "a/b/rollout_{rollout_id}.pt", "x{{literal}}.pt", "..a/b.pt"])
def test_good_dump_paths(path):
    assert parse_job(forge_job(spec__replay__dumps__path=path)).spec.replay.dumps.path == path


def test_eval_needs_a_template():
    assert_refused(forge_job(spec__replay__dumps__path="all.pt", spec__replay__evalInterval=2),
                   "spec.replay.evalInterval", "template")
    assert parse_job(forge_job(spec__replay__evalInterval=2)).spec.replay.eval_interval == 2


def test_eval_before_train_needs_eval_on():
    assert_refused(forge_job(spec__replay__evalBeforeTrain=True), "spec.replay.evalBeforeTrain", "evalInterval > 0")
    replay = parse_job(forge_job(spec__replay__evalBeforeTrain=True, spec__replay__evalInterval=2)).spec.replay
    assert replay.eval_before_train is True
    assert parse_job(forge_job()).spec.replay.eval_before_train is False


# Rule 6: counts
@pytest.mark.parametrize("field,value", [("numRollouts", 0), ("startRolloutId", -1), ("evalInterval", -1)])
def test_rollout_counts(field, value):
    doc = forge_job()
    doc["spec"]["replay"][field] = value
    assert_refused(doc, f"spec.replay.{field}")


# Rule 7: names
@pytest.mark.parametrize("name", ["a" * 48, "Upper", "1starts-with-digit", "ends-", "has_underscore", "a.b"])
def test_bad_names(name):
    assert_refused(forge_job(metadata={"name": name}), "metadata.name")


def test_name_of_47_characters_is_fine():
    assert parse_job(forge_job(metadata={"name": "a" * 47})).metadata.name == "a" * 47


def test_name_is_required():
    assert_refused(forge_job(metadata={}), "metadata.name", "required")


@pytest.mark.parametrize("claim", ["Bad_Claim", "-x", "a" * 254])
def test_claim_names_are_dns1123_subdomains(claim):
    assert_refused(forge_job(spec__replay__dumps__claimName=claim), "spec.replay.dumps.claimName")
    assert_refused(forge_job(spec__results={"claimName": claim}), "spec.results.claimName")


# Rule 8: trainer and model
def test_trainer_bounds():
    assert_refused(forge_job(spec__trainer={"nodes": 0}), "spec.trainer.nodes")
    assert_refused(forge_job(spec__trainer={"gpusPerNode": -1}), "spec.trainer.gpusPerNode")
    assert parse_job(debug_job(spec__trainer={"gpusPerNode": 0})).spec.trainer.gpus_per_node == 0


def test_model_exactly_one_source():
    assert_refused(forge_job(spec__model={}), "spec.model", "neither")
    assert_refused(forge_job(spec__model={"config": {"a": 1}, "path": "m", "claimName": "models"}),
                   "spec.model", "both")


def test_model_path_needs_claim():
    assert_refused(forge_job(spec__model={"path": "Qwen3-8B"}), "spec.model.claimName", "required")
    job = parse_job(forge_job(spec__model={"path": "Qwen3-8B", "claimName": "models"}))
    assert job.spec.model.path == "Qwen3-8B"


# Rule 9: unknown fields
def test_unknown_fields_are_rejected_with_a_suggestion():
    doc = forge_job()
    doc["spec"]["replay"]["numRollout"] = 3
    assert_refused(doc, "spec.replay.numRollout", "did you mean 'numRollouts'")


def test_unknown_top_level_spec_field():
    assert_refused(forge_job(spec__trainr={}), "spec.trainr", "did you mean 'trainer'")


# Defaults
def test_defaults():
    job = parse_job(forge_job(spec__trainer={"clipEps": 0.3}))
    t = job.spec.trainer
    assert t.clip_eps_high == 0.3 and t.dtype == "bfloat16" and t.micro_batch_tokens == 65536
    assert job.spec.replay.dumps.fallback_to_first is True and job.spec.replay.verify is True
    assert job.spec.ttl_seconds_after_finished == 300  # the GPUs go back 5 minutes after the end


def test_engine_args_scalars_become_strings():
    doc = forge_job()
    doc["spec"]["rollout"]["engineArgs"] = {"mem-fraction-static": 0.7, "context-length": 65536,
                                            "enable-metrics": True}
    args = parse_job(doc).spec.rollout.engine_args
    assert args == {"mem-fraction-static": "0.7", "context-length": "65536", "enable-metrics": "true"}


def test_other_kinds_are_not_forge_replay_jobs():
    with pytest.raises(NotAForgeReplayJob):
        parse_job({"apiVersion": "v1", "kind": "ConfigMap"})
    with pytest.raises(NotAForgeReplayJob):
        parse_job(["a list"])


def test_round_trip_spec_yaml_spec():
    job = parse_job(forge_job(spec__faultTolerance={"enabled": True, "components": ["train", "rollout"]}))
    text = yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True))
    again = parse_job(yaml.safe_load(text))
    assert again == job


@pytest.mark.parametrize("key", ["port", "--host", "model-path", "tp-size", "base-gpu-id"])
def test_engine_args_forge_replay_sets_itself_are_refused(key):
    doc = forge_job()
    doc["spec"]["rollout"]["engineArgs"] = {key: "1", "mem-fraction-static": "0.7"}
    assert_refused(doc, f"spec.rollout.engineArgs.{key}", "set by forge-replay itself")
