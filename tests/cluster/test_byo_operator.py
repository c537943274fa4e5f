"""A slime / miles job through the operator on the real control plane (issue 15): the RayJob it creates runs the
team's script with the injected flags on the team's image, and every object render() makes for such a job passes
the API server's and KubeRay's strict schema validation."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT
from forge_replay.backends import injected_argv
from forge_replay.controller.render import render
from tests.cluster.operator_harness import apply, job_doc, wait_for
from tests.cluster.test_operator import api, assert_strict_dry_run, operator, operator_kubeconfig  # noqa: F401

pytestmark = pytest.mark.cluster

GOLDEN = Path(__file__).parents[1] / "unit" / "golden" / "byo"


@pytest.mark.parametrize("case", sorted(p.name.removesuffix(".in.yaml") for p in GOLDEN.glob("*.in.yaml")))
def test_rendered_byo_objects_pass_strict_server_side_validation(control_plane, namespace, case) -> None:
    doc = yaml.safe_load((GOLDEN / f"{case}.in.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    assert_strict_dry_run(control_plane, render(parse_job(doc)))


def test_operator_launches_the_team_script(control_plane, operator, api, namespace) -> None:  # noqa: F811
    trainer = {"backend": "miles", "image": "registry.example.com/team/miles:v1", "workingDir": "/root/miles",
               "nodes": 1, "gpusPerNode": 1, "args": ["--seq-length", "4096"]}
    doc = job_doc("byo", namespace, trainer=trainer)
    apply(control_plane, doc)
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "byo"))
    words = shlex.split(rayjob["spec"]["entrypoint"])
    assert words[:5] == ["cd", "/root/miles", "&&", "python3", "train.py"]
    assert words[5:] == ["--seq-length", "4096", *injected_argv(parse_job(doc).spec, DUMPS_MOUNT)]
    cluster = rayjob["spec"]["rayClusterSpec"]
    [group] = cluster["workerGroupSpecs"]
    for template in (cluster["headGroupSpec"]["template"], group["template"]):
        assert template["spec"]["containers"][0]["image"] == trainer["image"]
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["forge-replay-lib"]
    assert json.loads(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
