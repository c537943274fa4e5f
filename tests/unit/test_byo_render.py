"""render(job) for backend slime / miles (issue 15): golden files plus the rules the RayJob must keep.

Regenerate goldens after an intended change: FORGE_REPLAY_UPDATE_GOLDEN=1 pytest tests/unit/test_byo_render.py
and review the diff like any other change.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT, RESULTS_MOUNT
from forge_replay.backends import injected_argv, worker_nodes
from forge_replay.backends.launch import FORGE_LIB_MOUNT
from forge_replay.backends.probe import HOOK, PROBE_DIR_ENV
from forge_replay.controller.cli import objects_yaml, render as render_command
from forge_replay.controller.render import render
from forge_replay.controller.settings import OperatorSettings

GOLDEN = Path(__file__).parent / "golden" / "byo"
CASES = sorted(p.name.removesuffix(".in.yaml") for p in GOLDEN.glob("*.in.yaml"))
SETTINGS = OperatorSettings(runtime_image="registry.example.com/forge-replay/runtime:golden")


def _job(case: str):
    return parse_job(yaml.safe_load((GOLDEN / f"{case}.in.yaml").read_text()))


def _ray_job(case: str) -> dict:
    [ray_job] = [o for o in render(_job(case), SETTINGS) if o["kind"] == "RayJob"]
    return ray_job


def _pods(ray_job: dict) -> list[dict]:
    cluster = ray_job["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden(case: str) -> None:
    text = objects_yaml(render(_job(case), SETTINGS))
    golden = GOLDEN / f"{case}.out.yaml"
    if os.environ.get("FORGE_REPLAY_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with FORGE_REPLAY_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text(), f"render output differs from {golden}; review, then regenerate"


def test_golden_cases_cover_both_backends_and_modes() -> None:
    assert {"slime-forge", "slime-debug-upstream", "miles-forge-colocated", "miles-debug"} <= set(CASES)


def shell_commands(line: str) -> list[list[str]]:
    """A shell line's commands (split at ``;``), each as its words, ``&&`` kept as a word."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word == ";":
            commands.append([])
        else:
            commands[-1].append(word)
    return commands


@pytest.mark.parametrize("case", CASES)
def test_entrypoint_runs_the_team_script_with_the_injected_flags(case: str) -> None:
    job = _job(case)
    trainer = job.spec.trainer
    script, *after = shell_commands(_ray_job(case)["spec"]["entrypoint"])
    assert script[:4] == ["cd", trainer.working_dir, "&&", "python3"]
    assert script[4] == trainer.script
    assert script[5:] == [*trainer.args, *injected_argv(job.spec, DUMPS_MOUNT)]
    # then the memory report, whatever the script's status, and the script's status as the job's
    assert after[0] == ["code=$?"] and after[-1] == ["exit", "$code"]
    publish = after[1]
    assert publish[:3] == ["python3", "-m", "forge_replay.backends.publish"]
    options = dict(zip(publish[3::2], publish[4::2]))
    probe_dir = json.loads(_ray_job(case)["spec"]["runtimeEnvYAML"])["env_vars"][PROBE_DIR_ENV]
    assert options["--results"] == probe_dir.removesuffix("/probe") and options["--results"].startswith(RESULTS_MOUNT)
    assert options["--configmap"] == f"{job.metadata.name}-progress" and options["--exit-code"] == "$code"
    assert options["--total"] == str(job.spec.replay.num_rollouts)


@pytest.mark.parametrize("case", CASES)
def test_every_ray_pod_runs_the_team_image_with_forge_replay_importable(case: str) -> None:
    job = _job(case)
    ray_job = _ray_job(case)
    assert ray_job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"] == job.spec.trainer.image
    for pod in _pods(ray_job):
        [container] = pod["spec"]["containers"]
        assert container["image"] == job.spec.trainer.image
        [init] = pod["spec"]["initContainers"]
        assert init["image"] == SETTINGS.image_for(job.spec.image)  # our runtime image holds forge_replay
        shared = {m["name"] for m in init["volumeMounts"]} & {m["name"] for m in container["volumeMounts"]}
        assert [v for v in pod["spec"]["volumes"] if v["name"] in shared] == [{"name": shared.pop(), "emptyDir": {}}]
    env = json.loads(ray_job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["PYTHONPATH"].split(":")[-1] == FORGE_LIB_MOUNT
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


@pytest.mark.parametrize("case", CASES)
def test_one_homogeneous_gpu_group(case: str) -> None:
    job = _job(case)
    [group] = _ray_job(case)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == worker_nodes(job.spec)
    gpus = group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == job.spec.trainer.gpus_per_node


def test_separate_engines_add_whole_nodes() -> None:
    [group] = _ray_job("slime-forge")["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 3  # 2 trainer nodes + 8 engine GPUs on nodes of 8


def test_team_env_overrides_the_defaults_but_keeps_forge_replay_importable() -> None:
    env = json.loads(_ray_job("slime-debug-upstream")["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["PYTHONPATH"] == f"/opt/team/Megatron-LM:{FORGE_LIB_MOUNT}"
    slime = json.loads(_ray_job("slime-forge")["spec"]["runtimeEnvYAML"])["env_vars"]
    assert slime == {"PYTHONPATH": f"/root/Megatron-LM/:{FORGE_LIB_MOUNT}", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                     "NCCL_NVLS_ENABLE": "1", PROBE_DIR_ENV: f"{RESULTS_MOUNT}/ml-platform/qwen3-8b-slime-memtest/3f1c2a9e/probe"}


@pytest.mark.parametrize("case", CASES)
def test_every_ray_worker_starts_the_memory_probe_writing_to_the_run_results(case: str) -> None:
    env = json.loads(_ray_job(case)["spec"]["runtimeEnvYAML"])
    assert env["worker_process_setup_hook"] == HOOK
    [config] = [o for o in render(_job(case), SETTINGS) if o["metadata"]["name"].endswith("-config")]
    results_dir = yaml.safe_load(config["data"]["config.yaml"])["resultsDir"]
    assert env["env_vars"][PROBE_DIR_ENV] == f"{results_dir}/probe"


def test_builtin_jobs_keep_our_runtime() -> None:
    doc = yaml.safe_load((GOLDEN / "slime-forge.in.yaml").read_text())
    for key in ("backend", "image", "workingDir", "args", "env"):
        del doc["spec"]["trainer"][key]
    [ray_job] = [o for o in render(parse_job(doc), SETTINGS) if o["kind"] == "RayJob"]
    assert ray_job["spec"]["entrypoint"].startswith("python -m forge_replay.runtime")
    assert "runtimeEnvYAML" not in ray_job["spec"]
    assert all("initContainers" not in pod["spec"] for pod in _pods(ray_job))


def test_forge_replay_render_shows_the_entrypoint() -> None:
    result = CliRunner().invoke(render_command, [str(GOLDEN / "miles-debug.in.yaml")])
    assert result.exit_code == 0, result.output
    assert "entrypoint: cd /root/miles && python3 train.py --rollout-batch-size 16 --actor-num-nodes" in result.output


@pytest.mark.parametrize("case", CASES)
def test_team_pods_keep_the_image_user_and_ours_stay_non_root(case: str) -> None:
    objects = render(_job(case), SETTINGS)
    [ray_job] = [o for o in objects if o["kind"] == "RayJob"]
    for pod in [*_pods(ray_job), ray_job["spec"]["submitterPodTemplate"]]:
        assert not {"runAsUser", "runAsGroup", "runAsNonRoot"} & set(pod["spec"]["securityContext"])
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for init in pod["spec"].get("initContainers", []):
            assert init["securityContext"]["runAsUser"] == SETTINGS.runtime_uid
            assert init["securityContext"]["runAsNonRoot"] is True
    for verify in (o for o in objects if o["kind"] == "Job"):  # our image: our non-root user
        assert verify["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == SETTINGS.runtime_uid
