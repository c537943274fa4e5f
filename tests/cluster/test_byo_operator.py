"""A slime / miles job through the operator on the real control plane (issue 15): the RayJob it creates runs the
team's script with the injected flags on the team's image, and every object render() makes for such a job passes
the API server's and KubeRay's strict schema validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT
from forge_replay.backends.argv import injected_argv
from forge_replay.controller.render import render
from tests.cluster.operator_harness import apply, job_doc, wait_for
from forge_replay.backends.publish import publish
from forge_replay.controller import naming
from tests.cluster.test_operator import api, assert_strict_dry_run, operator, operator_kubeconfig  # noqa: F401
from tests.unit.test_byo_publish import write_probe_files
from tests.unit.test_byo_render import entrypoint_line, shell_commands

pytestmark = pytest.mark.cluster

GOLDEN = Path(__file__).parents[1] / "unit" / "golden" / "byo"


@pytest.mark.parametrize("case", sorted(p.name.removesuffix(".in.yaml") for p in GOLDEN.glob("*.in.yaml")))
def test_rendered_byo_objects_pass_strict_server_side_validation(control_plane, namespace, case) -> None:
    doc = yaml.safe_load((GOLDEN / f"{case}.in.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    assert_strict_dry_run(control_plane, render(parse_job(doc)))


def test_operator_launches_the_team_script(control_plane, operator, api, namespace) -> None:  # noqa: F811
    trainer = {"backend": "miles", "image": "registry.example.com/team/miles:v1", "workingDir": "/root/miles",
               "nodes": 1, "gpusPerNode": 1, "args": ["--seq-length", "4096", "--rollout-batch-size", "8"]}
    doc = job_doc("byo", namespace, trainer=trainer)
    apply(control_plane, doc)
    rayjob = wait_for("the RayJob", lambda: api.rayjob(namespace, "byo"))
    words, *after = shell_commands(entrypoint_line(rayjob))
    assert words[:5] == ["cd", "/root/miles", "&&", "python3", "train.py"]
    assert words[5:] == [*trainer["args"], *injected_argv(parse_job(doc).spec, DUMPS_MOUNT)]
    assert after[1][:3] == ["python3", "-m", "forge_replay.backends.publish"]  # then the memory report
    cluster = rayjob["spec"]["rayClusterSpec"]
    [group] = cluster["workerGroupSpecs"]
    for template in (cluster["headGroupSpec"]["template"], group["template"]):
        assert template["spec"]["containers"][0]["image"] == trainer["image"]
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["forge-replay-lib"]
    assert json.loads(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_the_memory_report_reaches_the_status(control_plane, operator, api, namespace, tmp_path) -> None:  # noqa: F811
    """What the entrypoint runs after the team's script, with the token the head pod mounts (the job's runtime
    ServiceAccount, allowed to patch its progress ConfigMap only): the probe's peak lands in status.memory, each
    figure naming its source, and the rollouts count as trained."""
    trainer = {"backend": "miles", "image": "registry.example.com/team/miles:v1", "workingDir": "/root/miles",
               "nodes": 1, "gpusPerNode": 1, "args": ["--rollout-batch-size", "8"]}
    apply(control_plane, job_doc("byo-mem", namespace, trainer=trainer))
    wait_for("the RayJob", lambda: api.rayjob(namespace, "byo-mem"))
    write_probe_files(tmp_path / "probe")
    token = control_plane.kubectl("create", "token", naming.runtime_account_name("byo-mem"), "-n", namespace,
                                  "--duration=10m").stdout.strip()
    head_pod = (control_plane.server, token, str(control_plane.ca.pair.cert), namespace)
    assert publish(str(tmp_path), "byo-mem", "miles", "train.py", 0, 4, "byo-mem-progress", head_pod) == []
    # least privilege: the same token may not write the job's other ConfigMap
    [refused] = publish(str(tmp_path), "byo-mem", "miles", "train.py", 0, 4, "byo-mem-config", head_pod)
    assert "403" in refused
    api.patch_rayjob_status(namespace, "byo-mem", {
        "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "rayClusterName": "byo-mem-raycluster-x",
        "startTime": "2026-12-01T01:00:00Z", "endTime": "2026-12-01T02:00:00Z"})
    status = wait_for("memory in the status", lambda: api.status(namespace, "byo-mem").get("memory")
                      and api.status(namespace, "byo-mem"))
    assert status["memory"] == {
        "source": "cuda", "peakAllocatedGiB": 61.5, "peakReservedGiB": 70.25, "host": "node-1", "pid": 41,
        "device": "cuda:3", "processes": 2,
        "gpus": {"node-1": {"source": "nvml", "peakUsedGiB": {"0": 131.5, "3": 120.0}}}}
    assert status["rollouts"] == {"completed": 4, "total": 4}
