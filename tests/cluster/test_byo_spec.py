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


def job(trainer=None, mode="forge", **spec):
    doc = minimal_job("byo")
    doc["spec"]["trainer"] = {"nodes": 1, "gpusPerNode": 8, **TEAM, **(trainer or {})}
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
    # issue 25: a gate that checks nothing, and what a foreign trainer's report does not hold
    ("builtin-expect-empty", {"backend": "builtin", "image": "", "workingDir": ""}, "forge", {"expect": {}},
     "spec.expect"),
    ("slime-expect-tokens", {}, "forge", {"expect": {"maxPeakMemoryGiB": 130, "minTokensPerSecond": 1}}, "spec.expect"),
]
ACCEPTED = [
    ("slime-forge", {}, "forge", {}),
    ("slime-defaults-filled", {"microBatchTokens": 65536, "dtype": "bfloat16"}, "forge", {}),
    ("miles-debug-upstream", {"backend": "miles"}, "debug", {"replay__loader": "upstream"}),
    ("miles-no-fallback", {"backend": "miles"}, "forge", {"replay__dumps__fallbackToFirst": False}),
    ("miles-ft-train", {"backend": "miles"}, "debug", {"faultTolerance": {"enabled": True, "components": ["train"]}}),
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
