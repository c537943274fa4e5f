"""Valid ForgeReplayJob documents to start test cases from (plain dicts, as YAML gives them)."""

from __future__ import annotations

import copy
from typing import Any


def forge_job(**overrides: Any) -> dict[str, Any]:
    """A valid forge-mode job."""
    doc = {
        "apiVersion": "forgereplay.io/v1alpha1",
        "kind": "ForgeReplayJob",
        "metadata": {"name": "memtest"},
        "spec": {
            "replay": {
                "mode": "forge",
                "dumps": {"claimName": "rollout-dumps", "path": "run-42/rollout_{rollout_id}.pt"},
                "numRollouts": 8,
            },
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 64}},
            "trainer": {"nodes": 1, "gpusPerNode": 8},
            "rollout": {"numGpus": 8, "numGpusPerEngine": 2},
        },
    }
    return _apply(doc, overrides)


def debug_job(**overrides: Any) -> dict[str, Any]:
    """A valid debug-mode job."""
    doc = forge_job()
    doc["spec"]["replay"]["mode"] = "debug"
    del doc["spec"]["rollout"]
    return _apply(doc, overrides)


REQUIRED_ARGS = ["--rollout-batch-size", "32"]
"""What slime's and miles' parsers require of the team's args (the flag tables' ``required`` rows)."""


def byo_job(backend: str, mode: str = "forge", **overrides: Any) -> dict[str, Any]:
    """A valid job of backend slime or miles: the team's image and folder, REQUIRED_ARGS after any args given
    (``spec__trainer__args``), so the indices of those stay as written."""
    args = overrides.pop("spec__trainer__args", [])
    trainer = {"backend": backend, "nodes": 1, "gpusPerNode": 8, "image": f"registry.example.com/team/{backend}:v1",
               "workingDir": f"/root/{backend}", "args": [*args, *REQUIRED_ARGS]}
    make = forge_job if mode == "forge" else debug_job
    return make(**{"spec__trainer": trainer, **overrides})


def _apply(doc: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply overrides given as dotted paths with '__' for '.', e.g. spec__rollout__numGpus=4.
    A value of DELETE removes the key."""
    doc = copy.deepcopy(doc)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


DELETE = object()
