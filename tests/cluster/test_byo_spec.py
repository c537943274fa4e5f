"""spec.trainer backend slime / miles (issue 15): `forge-replay validate` and the real API server (the CRD's CEL
twins of the models' rules) refuse and accept the same specs, naming the same field. The team's args are
refused by the CRD as a whole (spec.trainer.args), by validate and the operator per item (spec.trainer.args[i])."""

from __future__ import annotations

import copy

import pytest

from tests.cluster.test_control_plane import minimal_job, project_crd  # noqa: F401
from tests.cluster.test_spec_bounds import create, validate

pytestmark = pytest.mark.cluster

TEAM = {"backend": "slime", "image": "registry.example.com/team/slime:v1", "workingDir": "/root/slime"}
REQUIRED = ["--rollout-batch-size", "32"]  # slime's and miles' parsers require it
EVAL_DATA = ["--eval-prompt-data", "aime", "/data/aime.jsonl"]


def job(trainer=None, mode="forge", **spec):
    """A slime job; ``trainer`` over TEAM, with REQUIRED after its args unless ``required: False``."""
    doc = minimal_job("byo")
    trainer = dict(trainer or {})
    args = trainer.pop("args", [])
    if trainer.pop("required", True):
        args = [*args, *REQUIRED]
    doc["spec"]["trainer"] = {"nodes": 1, "gpusPerNode": 8, **TEAM, "args": args, **trainer}
    if mode == "debug":
        doc["spec"]["replay"]["mode"] = "debug"
        del doc["spec"]["rollout"]
    for key, value in spec.items():
        node = doc["spec"]
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return doc


REFUSED = [
    ("builtin-with-image", {"backend": "builtin", "workingDir": ""}, "forge", {}, "spec.trainer"),
    ("slime-micro-batch", {"microBatchTokens": 1024}, "forge", {}, "spec.trainer"),
    ("slime-without-image", {"image": ""}, "forge", {}, "spec.trainer.image"),
    ("builtin-upstream", {"backend": "builtin", "image": "", "workingDir": ""}, "forge",
     {"replay__loader": "upstream"}, "spec.replay.loader"),
    ("miles-forge-upstream", {"backend": "miles"}, "forge", {"replay__loader": "upstream"}, "spec.replay.loader"),
    ("slime-no-fallback", {}, "forge", {"replay__dumps__fallbackToFirst": False},
     "spec.replay.dumps.fallbackToFirst"),
    ("slime-ft-train", {}, "forge", {"faultTolerance": {"enabled": True, "components": ["train"]}},
     "spec.faultTolerance.components"),
    ("slime-half-node-engines", {}, "forge", {"rollout": {"numGpus": 4, "numGpusPerEngine": 2}}, "spec.rollout.numGpus"),
    ("slime-args-num-rollout", {"args": ["--lr", "1", "--num-rollout=3"]}, "forge", {}, "spec.trainer.args"),
    ("slime-args-colocate", {"args": ["--colocate"]}, "forge", {}, "spec.trainer.args"),
    ("miles-args-fully-async", {"backend": "miles", "args": ["--fully-async"]}, "forge", {}, "spec.trainer.args"),
    ("miles-args-no-fallback", {"backend": "miles", "args": ["--no-forge-replay-fallback-to-first"]}, "forge", {},
     "spec.trainer.args"),
    # issue 26: what slime's and miles' own code refuses
    ("miles-no-batch-size", {"backend": "miles", "args": ["--lr", "1"], "required": False}, "forge", {},
     "spec.trainer.args"),
    ("slime-debug-eval", {}, "debug", {"replay__evalInterval": 2}, "spec.replay.evalInterval"),
    ("miles-eval-without-datasets", {"backend": "miles"}, "forge", {"replay__evalInterval": 2},
     "spec.replay.evalInterval"),
    ("slime-debug-upstream-fallback", {}, "debug", {"replay__loader": "upstream"}, "spec.replay.dumps.fallbackToFirst"),
    ("slime-env-name", {"env": {"PATH=x": "1"}}, "forge", {}, "spec.trainer.env"),
    ("miles-env-ray-address", {"backend": "miles", "env": {"RAY_ADDRESS": "ray://elsewhere:10001"}}, "forge", {},
     "spec.trainer.env"),
    ("slime-image-spaces", {"image": "UPPER CASE image with spaces"}, "forge", {}, "spec.trainer.image"),
    ("runtime-image-spaces", {}, "forge", {"image": "Runtime Image"}, "spec.image"),
    ("slime-script-up", {"script": "../train.py"}, "forge", {}, "spec.trainer.script"),
    ("slime-working-dir-up", {"workingDir": "/root/../etc"}, "forge", {}, "spec.trainer.workingDir"),
    # issue 25: a gate that checks nothing, and what a foreign trainer's report does not hold
    ("builtin-expect-empty", {"backend": "builtin", "image": "", "workingDir": ""}, "forge", {"expect": {}},
     "spec.expect"),
    ("slime-expect-tokens", {}, "forge", {"expect": {"maxPeakMemoryGiB": 130, "minTokensPerSecond": 1}}, "spec.expect"),
]
ACCEPTED = [
    ("slime-forge", {}, "forge", {}),
    ("slime-defaults-filled", {"microBatchTokens": 65536, "dtype": "bfloat16"}, "forge", {}),
    ("miles-debug-upstream", {"backend": "miles"}, "debug",
     {"replay__loader": "upstream", "replay__dumps__fallbackToFirst": False}),
    ("slime-debug-upstream-literal", {}, "debug", {"replay__loader": "upstream", "replay__dumps__path": "r/0.pt"}),
    ("miles-eval-with-datasets", {"backend": "miles", "args": EVAL_DATA}, "forge", {"replay__evalInterval": 2}),
    ("slime-eval-config", {"args": ["--eval-config=/data/eval.yaml"]}, "forge", {"replay__evalInterval": 2}),
    ("slime-env-and-image", {"env": {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/opt/team"},
                             "image": "registry.example.com:5000/ml/slime@sha256:" + "ab" * 32}, "forge", {}),
    ("miles-no-fallback", {"backend": "miles"}, "forge", {"replay__dumps__fallbackToFirst": False}),
    # Its 8 cells need a global batch size to step at all (issue 34: validate refuses Megatron's default of 1 here).
    ("miles-ft-train", {"backend": "miles", "args": ["--global-batch-size", "32"]}, "debug",
     {"faultTolerance": {"enabled": True, "components": ["train"]}}),
    ("slime-cpu", {"gpusPerNode": 0, "args": ["--micro-batch-size", "2"], "env": {"A": "1"}}, "debug", {}),
    ("slime-args-miles-refuses", {"args": ["--fully-async", "--num-rollouts-per-epoch=2", "--colocated"]}, "forge", {}),
    ("slime-expect-memory", {}, "forge", {"expect": {"maxPeakMemoryGiB": 130}}),
]


@pytest.mark.parametrize("case, trainer, mode, spec, field", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_by_validate_and_the_api_server(control_plane, project_crd, namespace, tmp_path,
                                                case, trainer, mode, spec, field):
    document = job(trainer, mode, **spec)
    code, out = validate(tmp_path, document)
    assert code == 1 and f": {field}" in out, out
    message = create(control_plane, namespace, document)
    assert message is not None, f"the API server stored {case}, which validate refuses"
    assert field in message, message


@pytest.mark.parametrize("case, trainer, mode, spec", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_by_both(control_plane, project_crd, namespace, tmp_path, case, trainer, mode, spec):
    document = job(trainer, mode, **spec)
    document["metadata"]["name"] = case
    code, out = validate(tmp_path, document)
    assert code == 0, out
    assert create(control_plane, namespace, document) is None
