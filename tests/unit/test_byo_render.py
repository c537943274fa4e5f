"""render(job) for backend slime / miles (issue 15): golden files plus the rules the RayJob must keep.

Regenerate goldens after an intended change: FORGE_REPLAY_UPDATE_GOLDEN=1 pytest tests/unit/test_byo_render.py
and review the diff like any other change.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.api.paths import DUMPS_MOUNT, RESULTS_MOUNT
from forge_replay.backends import entry
from forge_replay.backends.argv import injected_argv, worker_nodes
from forge_replay.backends.launch import FORGE_LIB_MOUNT
from forge_replay.backends.probe import HOOK, PROBE_DIR_ENV
from forge_replay.commands.render import objects_yaml, render as render_command
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


def entrypoint_line(ray_job: dict) -> str:
    """The shell line a slime / miles RayJob runs on its head (its entrypoint is ``backends.entry`` and the line)."""
    python, flag, module, payload = ray_job["spec"]["entrypoint"].split(" ")
    assert (python, flag, module) == ("python3", "-m", entry.MODULE)
    line = entry.decode(payload)
    assert ray_job["metadata"]["annotations"]["forgereplay.io/entrypoint"] == line  # readable, for review
    return line


SUBMITTER_STUBS = r"""
record() { printf '%s\037' "$@" >> "$RECORD"; printf '\036' >> "$RECORD"; }
ray() { record ray "$@"; [ "$2" != status ]; }
cd() { record cd "$@"; }
python3() { record python3 "$@"; }
python() { record python "$@"; }
exit() { record exit "$@"; }
"""
"""Every command the submitter could run, recorded (``ray job status`` answers "not submitted yet")."""


def kuberay_submitter(entrypoint: str, tmp_path: Path) -> list[list[str]]:
    """What KubeRay v1.5.0's submitter pod runs for a RayJob's entrypoint, every command recorded instead of run:
    its command line (controllers/ray/common/job.go BuildJobSubmitCommand, K8sJobMode: words joined by spaces, the
    entrypoint pasted in as it is) run by ``bash -ce`` (rayjob_controller.go configureSubmitterContainer)."""
    address = "http://byo-head-svc.ml.svc.cluster.local:8265"
    command = " ".join(["if", "!", "ray", "job", "status", "--address", address, "byo-x1", ">/dev/null", "2>&1", ";",
                        "then", "ray", "job", "submit", "--address", address, "--no-wait", "--submission-id", "byo-x1",
                        "--", entrypoint, ";", "fi", ";", "ray", "job", "logs", "--address", address, "--follow",
                        "byo-x1"])
    record = tmp_path / "calls"
    subprocess.run(["bash", "-ce", SUBMITTER_STUBS + command], env={"RECORD": str(record), "PATH": "/usr/bin:/bin"},
                   cwd=tmp_path, check=False, timeout=30)
    calls = record.read_text().split("\036")[:-1] if record.exists() else []
    return [call.split("\037")[:-1] for call in calls]


@pytest.mark.parametrize("case", CASES)
def test_kuberays_submitter_submits_the_whole_entrypoint_and_runs_nothing_of_it(case: str, tmp_path: Path) -> None:
    """The submitter's shell must pass the entrypoint to `ray job submit` whole and run none of it itself (a `cd DIR
    && python3 train.py ...; code=$?; ...` line once ran `train.py` in the submitter pod, which has no forge_replay,
    and submitted `cd DIR` alone as the Ray job, which succeeded); `ray job submit` re-quotes the words after `--`
    with list2cmdline (ray/dashboard/modules/job/cli.py) for the job's `sh -c`, which must give them back as they
    are; and the line the Ray head then runs is the script's."""
    ray_job = _ray_job(case)
    entrypoint = ray_job["spec"]["entrypoint"]
    calls = kuberay_submitter(entrypoint, tmp_path)
    assert [c[:3] for c in calls] == [["ray", "job", "status"], ["ray", "job", "submit"], ["ray", "job", "logs"]], calls
    submitted = calls[1][calls[1].index("--") + 1:]
    assert subprocess.list2cmdline(submitted) == entrypoint
    assert re.fullmatch(r"[A-Za-z0-9._=/ -]+", entrypoint), entrypoint  # nothing `sh -c` would interpret
    assert shell_commands(entrypoint_line(ray_job))[0][:2] == ["cd", _job(case).spec.trainer.working_dir]


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
    script, *after = shell_commands(entrypoint_line(_ray_job(case)))
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
    # the shell line the head runs, readable in the RayJob's annotation (its entrypoint carries it encoded)
    [ray_job] = [o for o in yaml.safe_load_all(result.output) if o and o["kind"] == "RayJob"]
    assert ray_job["metadata"]["annotations"]["forgereplay.io/entrypoint"].startswith(
        "cd /root/miles && python3 train.py --rollout-batch-size 16 --global-batch-size 16 --actor-num-nodes")


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


def test_the_entry_module_runs_the_line_with_bash_and_exits_with_its_status(tmp_path: Path) -> None:
    line = f'cd {shlex.quote(str(tmp_path))} && pwd && false; code=$?; echo "published $code"; exit 3'
    word = entry.encode(line).split(" ")[-1]
    done = subprocess.run([sys.executable, "-m", entry.MODULE, word], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(entry.__file__).parents[2])})
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == [f"forge-replay: running {line}", str(tmp_path), "published 1"]
