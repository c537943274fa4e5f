"""render(job) -> objects: golden files plus the rules each object must keep.

Regenerate goldens after an intended change: FORGE_REPLAY_UPDATE_GOLDEN=1 pytest tests/unit/test_render.py
and review the diff like any other change.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.paths import CONFIG_DIR, DUMPS_MOUNT, MODEL_MOUNT, RESULTS_MOUNT
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.controller import naming
from forge_replay.commands.render import objects_yaml
from forge_replay.controller.render import render, spec_hash
from forge_replay.dumps.verify_request import verify_command
from forge_replay.controller.settings import OperatorSettings

GOLDEN = Path(__file__).parent / "golden" / "render"
CASES = sorted(p.name.removesuffix(".in.yaml") for p in GOLDEN.glob("*.in.yaml"))
SETTINGS = OperatorSettings(runtime_image="registry.example.com/forge-replay/runtime:golden")


def _job(case: str):
    return parse_job(yaml.safe_load((GOLDEN / f"{case}.in.yaml").read_text()))


def _by_kind(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize("case", CASES)
def test_render_matches_golden(case: str) -> None:
    text = objects_yaml(render(_job(case), SETTINGS))
    golden = GOLDEN / f"{case}.out.yaml"
    if os.environ.get("FORGE_REPLAY_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run with FORGE_REPLAY_UPDATE_GOLDEN=1 and review it"
    assert text == golden.read_text(), f"render output differs from {golden}; review, then regenerate"


def test_golden_cases_exist() -> None:
    assert {"forge-memtest", "debug-checkpoint", "forge-colocated-cpu"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_every_child_is_owned_and_labelled(case: str) -> None:
    job = _job(case)
    for obj in render(job, SETTINGS):
        meta = obj["metadata"]
        assert meta["namespace"] == job.metadata.namespace
        assert meta["labels"][naming.LABEL_MANAGED_BY] == "forge-replay"
        assert meta["labels"][naming.LABEL_JOB] == job.metadata.name
        assert meta["annotations"][naming.ANNOTATION_SPEC_HASH] == spec_hash(job)
        [owner] = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "forgereplay.io/v1alpha1",
            "kind": "ForgeReplayJob",
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_forge_rayjob_shape() -> None:
    job = _job("forge-memtest")
    objects = render(job, SETTINGS)
    assert [o["kind"] for o in objects] == [
        "ConfigMap", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Job", "RayJob",
    ]  # fmt: skip
    rayjob = objects[-1]
    assert rayjob["metadata"]["name"] == "qwen3-8b-64k-memtest"
    assert rayjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "h200-memtests"
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "python -m forge_replay.runtime --config /etc/forge-replay/config.yaml"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert spec["suspend"] is True  # queued: Kueue unsuspends it on admission
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    trainer, rollout = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert (trainer["groupName"], trainer["replicas"], trainer["minReplicas"], trainer["maxReplicas"]) == (
        "trainer", 2, 2, 2,
    )  # fmt: skip
    assert trainer["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert (rollout["groupName"], rollout["replicas"]) == ("rollout", 4)  # 8 GPUs / 2 per engine
    assert rollout["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    for group in (trainer, rollout):
        pod = group["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert pod["priorityClassName"] == "gpu-batch"
        assert pod["automountServiceAccountToken"] is False
        assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    # the head (no GPU) lands anywhere, but shares the GPU pods' priority: preempting it ends the Ray cluster
    assert "nodeSelector" not in head and "affinity" not in head and "topologySpreadConstraints" not in head
    assert head["priorityClassName"] == "gpu-batch"
    assert head["serviceAccountName"] == "qwen3-8b-64k-memtest-runtime"
    for pod in (head, trainer["template"]["spec"], rollout["template"]["spec"]):
        assert pod["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts[DUMPS_MOUNT]["readOnly"] is True
        assert mounts[CONFIG_DIR]["readOnly"] is True
        assert not mounts[RESULTS_MOUNT].get("readOnly")
        assert MODEL_MOUNT not in mounts  # model from config: nothing to mount
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["dumps"]["persistentVolumeClaim"] == {"claimName": "rollout-dumps", "readOnly": True}
        assert volumes["results"]["persistentVolumeClaim"] == {"claimName": "replay-results"}
        assert pod["containers"][0]["image"] == SETTINGS.runtime_image


def test_debug_mode_has_no_engines_and_mounts_the_model_read_only() -> None:
    job = _job("debug-checkpoint")
    objects = render(job, SETTINGS)
    kinds = [o["kind"] for o in objects]
    assert "Job" not in kinds  # verify: false
    rayjob = objects[-1]
    groups = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer"]
    assert rayjob["spec"]["suspend"] is True  # spec.suspend
    assert "kueue.x-k8s.io/queue-name" not in rayjob["metadata"]["labels"]
    pod = groups[0]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/forge-replay/runtime:1.2.3"
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[MODEL_MOUNT]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["results"] == {"name": "results", "emptyDir": {}}  # no results PVC: still writable
    assert not mounts[RESULTS_MOUNT].get("readOnly")
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_colocated_engines_share_the_trainer_pods() -> None:
    rayjob = render(_job("forge-colocated-cpu"), SETTINGS)[-1]
    assert [g["groupName"] for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]] == ["trainer"]


def test_cpu_trainer_asks_for_no_gpu() -> None:
    doc = yaml.safe_load((GOLDEN / "debug-checkpoint.in.yaml").read_text())
    doc["spec"]["trainer"]["gpusPerNode"] = 0
    rayjob = render(parse_job(doc), SETTINGS)[-1]
    resources = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "resources"
    ]
    assert "nvidia.com/gpu" not in resources["limits"]


def test_cpu_forge_engines_get_pods_of_their_own_without_gpus_and_the_head_takes_no_work() -> None:
    """examples/forge-cpu.yaml in a cluster: one rollout pod per engine, with no nvidia.com/gpu (the runtime gives
    CPU engines none: a GPU request could never be scheduled), offering Ray the one engine slot each engine takes
    and no CPU, so the trainer's CPU bundle lands on the trainer pod, as it does with the head's num-cpus 0."""
    from forge_replay.api.paths import ENGINE_RAY_RESOURCE

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "forge-cpu.yaml").read_text())
    doc["metadata"]["namespace"] = "ml"
    spec = render(parse_job(doc), SETTINGS)[-1]["spec"]["rayClusterSpec"]
    trainer, rollout = spec["workerGroupSpecs"]
    assert (rollout["groupName"], rollout["replicas"]) == ("rollout", 2)
    resources = rollout["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources["limits"] and "nvidia.com/gpu" not in resources["requests"]
    assert resources["requests"]["cpu"] == SETTINGS.cpu_worker_cpu
    params = rollout["rayStartParams"]
    assert params["num-cpus"] == "0"
    assert json.loads(params["resources"].strip("'")) == {ENGINE_RAY_RESOURCE: 1}  # as KubeRay reads it
    assert shlex.split(f"--resources={params['resources']}") == [f'--resources={{"{ENGINE_RAY_RESOURCE}": 1}}']
    assert trainer["rayStartParams"] == {} and spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


def test_config_map_holds_a_runtime_config_the_runtime_can_read() -> None:
    job = _job("forge-memtest")
    config = render(job, SETTINGS)[0]
    runtime = RuntimeConfig.model_validate(yaml.safe_load(config["data"]["config.yaml"]))
    assert runtime.job.spec == job.spec
    assert runtime.job.metadata.name == job.metadata.name
    assert runtime.job.metadata.uid is None  # no live-object noise in the runtime's input
    assert runtime.dumps_root == DUMPS_MOUNT
    # its own folder of the claim: <namespace>/<name>/<uid prefix>
    assert runtime.results_dir == f"{RESULTS_MOUNT}/ml-platform/qwen3-8b-64k-memtest/3f1c2a9e"
    assert runtime.progress_configmap == "qwen3-8b-64k-memtest-progress"


def test_runtime_role_allows_only_its_progress_configmap() -> None:
    objects = _by_kind(render(_job("forge-memtest"), SETTINGS))
    role = objects[("Role", "qwen3-8b-64k-memtest-runtime")]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["qwen3-8b-64k-memtest-progress"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = objects[("RoleBinding", "qwen3-8b-64k-memtest-runtime")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "qwen3-8b-64k-memtest-runtime", "namespace": "ml-platform"}
    ]


RECORD = f"{RESULTS_MOUNT}/ml-platform/qwen3-8b-64k-memtest/3f1c2a9e/verify-record.json"
"""Where forge-memtest's verify Job records what it checked: the run's folder of its results claim."""


def test_verify_job_runs_dumps_verify_read_only_and_non_root() -> None:
    objects = _by_kind(render(_job("forge-memtest"), SETTINGS))
    verify = objects[("Job", "qwen3-8b-64k-memtest-verify")]
    assert verify["spec"]["backoffLimit"] == 0
    pod = verify["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == [
        "forge-replay", "dumps", "verify", "--root", DUMPS_MOUNT, "--path", "run-42/rollout_{rollout_id}.pt",
        "--num-rollouts", "8", "--start-rollout-id", "2", "--eval-interval", "4", "--no-reward-key",
        "--model-config", '{"architectures":["Qwen3ForCausalLM"],"hidden_size":4096,"num_hidden_layers":36}',
        "--jobs", "2", "--record", RECORD,
    ]  # fmt: skip
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # dumps read-only; the results claim, where it records what it checked for the runtime's pre-flight
    assert container["volumeMounts"] == [{"name": "dumps", "mountPath": DUMPS_MOUNT, "readOnly": True},
                                         {"name": "results", "mountPath": RESULTS_MOUNT}]
    assert pod["volumes"][-1] == {"name": "results", "persistentVolumeClaim": {"claimName": "replay-results"}}
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["restartPolicy"] == "Never"
    assert "nodeSelector" not in pod  # verify needs no GPU node


def test_verify_command_no_fallback() -> None:
    doc = yaml.safe_load((GOLDEN / "debug-checkpoint.in.yaml").read_text())
    command = verify_command(parse_job(doc))
    assert "--no-fallback" in command
    assert "--start-rollout-id" not in command and "--eval-interval" not in command


def test_verify_job_checks_dict_rewards_under_the_spec_reward_key(tmp_path) -> None:
    """The verify Job reads rewards under replay.rewardKey as training does (issue 19); none without one."""
    from forge_replay.commands.dumps import dumps

    doc = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    assert "--reward-key" not in verify_command(parse_job(doc))
    doc["spec"]["replay"]["rewardKey"] = "accuracy"
    job = parse_job(doc)
    verify = _by_kind(render(job, SETTINGS))[("Job", f"{job.metadata.name}-verify")]
    command = verify["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-8:-6] == ["--reward-key", "accuracy"]
    args = [str(tmp_path) if a == DUMPS_MOUNT else a for a in command[3:]]
    assert dumps.get_command(None, "verify").make_context("verify", args).params["reward_key"] == "accuracy"
    doc["spec"]["replay"]["evalRewardKey"] = "pass"  # eval dumps are read under their own key
    command = verify_command(parse_job(doc), record=RECORD)
    assert command[-10:-6] == ["--reward-key", "accuracy", "--eval-reward-key", "pass"]
    args = [str(tmp_path) if a == DUMPS_MOUNT else a for a in command[3:]]
    assert dumps.get_command(None, "verify").make_context("verify", args).params["eval_reward_key"] == "pass"


def test_spec_hash_ignores_suspend_only() -> None:
    doc = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    del doc["spec"]["scheduling"]["queueName"]  # a queued job cannot be suspended by spec (Kueue owns that)
    base = spec_hash(parse_job(doc))
    doc["spec"]["suspend"] = True
    assert spec_hash(parse_job(doc)) == base
    doc["spec"]["replay"]["numRollouts"] = 9
    assert spec_hash(parse_job(doc)) != base


def test_file_rendering_has_no_owner_references() -> None:
    doc = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    del doc["metadata"]["uid"]
    for obj in render(parse_job(doc), SETTINGS):
        assert "ownerReferences" not in obj["metadata"]


@pytest.mark.parametrize("case", ["forge-memtest", "debug-checkpoint"])
def test_verify_command_is_accepted_by_the_dumps_cli(case: str, tmp_path) -> None:
    """The verify Job's argv must parse with the real `forge-replay dumps verify` command."""
    from forge_replay.commands.dumps import dumps

    argv = verify_command(_job(case))
    assert argv[:3] == ["forge-replay", "dumps", "verify"]
    args = [str(tmp_path) if a == DUMPS_MOUNT else a for a in argv[3:]]  # --root must exist here
    verify = dumps.get_command(None, "verify")
    ctx = verify.make_context("verify", args)
    assert ctx.params["num_rollouts"] == _job(case).spec.replay.num_rollouts
    assert ctx.params["template"] == _job(case).spec.replay.dumps.path
    assert ctx.params["no_fallback"] is (not _job(case).spec.replay.dumps.fallback_to_first)


def test_verify_command_checks_the_eval_before_the_first_step(tmp_path) -> None:
    """With replay.evalBeforeTrain the verify Job checks eval_0 too, as `forge-replay run` does before Ray."""
    from forge_replay.commands.dumps import dumps

    doc = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    assert "--eval-before-train" not in verify_command(parse_job(doc))
    doc["spec"]["replay"].update(evalInterval=4, evalBeforeTrain=True)
    args = [str(tmp_path) if a == DUMPS_MOUNT else a for a in verify_command(parse_job(doc))[3:]]
    assert dumps.get_command(None, "verify").make_context("verify", args).params["eval_before_train"] is True


def _pod_specs(objects):
    """(where, pod template) for every pod the job creates: verify Job, head, each worker group, submitter."""
    out = []
    for obj in objects:
        if obj["kind"] == "Job":
            out.append(("verify", obj["spec"]["template"]))
        if obj["kind"] == "RayJob":
            spec = obj["spec"]
            out.append(("head", spec["rayClusterSpec"]["headGroupSpec"]["template"]))
            out += [(g["groupName"], g["template"]) for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
            out.append(("submitter", spec["submitterPodTemplate"]))
    return out


def test_every_pod_carries_spec_pod_and_runs_as_the_runtime_account() -> None:
    job = _job("forge-memtest")
    pods = _pod_specs(render(job, SETTINGS))
    assert [where for where, _ in pods] == ["verify", "head", "trainer", "rollout", "submitter"]
    for where, template in pods:
        spec = template["spec"]
        assert spec["serviceAccountName"] == "qwen3-8b-64k-memtest-runtime", where
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}], where
        assert spec["automountServiceAccountToken"] is (where == "head"), where
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch", where
        assert template["metadata"]["annotations"] == {"cost-center.example.com/team": "ml-platform"}, where
        assert template["metadata"]["labels"]["team"] == "ml-platform", where
        for container in spec["containers"]:
            names = [e["name"] for e in container["env"]]
            assert names[-2:] == ["HF_HUB_OFFLINE", "WANDB_API_KEY"], where
            assert container["env"][-1]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
            gpu = "nvidia.com/gpu" in container["resources"].get("limits", {})
            assert (container["resources"]["limits"].get("rdma/ib") == "1") is gpu, where
    account = _by_kind(render(job, SETTINGS))[("ServiceAccount", "qwen3-8b-64k-memtest-runtime")]
    assert account["imagePullSecrets"] == [{"name": "registry-creds"}]


def test_our_labels_win_over_spec_pod_labels() -> None:
    doc = yaml.safe_load((GOLDEN / "debug-checkpoint.in.yaml").read_text())
    doc["spec"]["pod"] = {"labels": {naming.LABEL_JOB: "someone-else", "team": "a"}}
    for _, template in _pod_specs(render(parse_job(doc), SETTINGS)):
        assert template["metadata"]["labels"][naming.LABEL_JOB] == doc["metadata"]["name"]
        assert template["metadata"]["labels"]["team"] == "a"


def test_two_jobs_on_one_claim_and_a_rerun_write_to_different_folders() -> None:
    doc = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    other = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    other["metadata"]["name"] = "another-memtest"
    rerun = yaml.safe_load((GOLDEN / "forge-memtest.in.yaml").read_text())
    rerun["metadata"]["uid"] = "9a8b7c6d-0000-4000-8000-000000000002"
    dirs = {RuntimeConfig.model_validate(yaml.safe_load(render(parse_job(d), SETTINGS)[0]["data"]["config.yaml"]))
            .results_dir for d in (doc, other, rerun)}
    assert len(dirs) == 3 and all(d.startswith(RESULTS_MOUNT + "/ml-platform/") for d in dirs)


def test_head_shm_is_never_larger_than_its_memory_limit() -> None:
    job = _job("debug-checkpoint")
    for settings, want in ((SETTINGS, "8Gi"), (OperatorSettings(head_memory="32Gi"), "16Gi"),
                           (OperatorSettings(head_memory="4000M"), "4000M")):
        head = render(job, settings)[-1]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        [shm] = [v for v in head["volumes"] if v["name"] == "shm"]
        assert shm["emptyDir"]["sizeLimit"] == want


def test_rayjob_names_its_ray_version_and_a_short_ttl_by_default() -> None:
    doc = yaml.safe_load((GOLDEN / "debug-checkpoint.in.yaml").read_text())
    doc["spec"].pop("ttlSecondsAfterFinished", None)
    rayjob = render(parse_job(doc), OperatorSettings(ray_version="2.99.0"))[-1]
    assert rayjob["spec"]["rayClusterSpec"]["rayVersion"] == "2.99.0"
    assert rayjob["spec"]["ttlSecondsAfterFinished"] <= 300


def test_active_deadline_reaches_the_rayjob_only_when_set() -> None:
    doc = yaml.safe_load((GOLDEN / "debug-checkpoint.in.yaml").read_text())
    assert "activeDeadlineSeconds" not in render(parse_job(doc), SETTINGS)[-1]["spec"]
    doc["spec"]["activeDeadlineSeconds"] = 7200
    assert render(parse_job(doc), SETTINGS)[-1]["spec"]["activeDeadlineSeconds"] == 7200


BYO_GOLDEN = Path(__file__).parent / "golden" / "byo"


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.in.yaml")) + sorted(BYO_GOLDEN.glob("*.in.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.in.yaml')}")
def test_reward_flags_follow_reward_key_and_every_verify_flag_is_the_clis(path: Path, tmp_path) -> None:
    """A job without rewardKey: no --reward-key anywhere, --no-reward-key only to `dumps verify` (which declares
    it: a dict reward is then refused, as training refuses it), never to the trainer; with one, --reward-key."""
    from forge_replay.commands.dumps import dumps

    job = parse_job(yaml.safe_load(path.read_text()))
    key = job.spec.replay.reward_key
    for obj in render(job, SETTINGS):
        if obj["kind"] == "RayJob":
            entrypoint = (obj["metadata"]["annotations"].get("forgereplay.io/entrypoint")  # slime / miles: the line
                          or obj["spec"]["entrypoint"]).split()
            assert "--no-reward-key" not in entrypoint
            assert ("--reward-key" in entrypoint) == (key is not None and job.spec.trainer.backend != "builtin")
        if obj["kind"] == "Job":
            argv = obj["spec"]["template"]["spec"]["containers"][0]["command"]
            args = [str(tmp_path) if a == DUMPS_MOUNT else a for a in argv[3:]]
            params = dumps.get_command(None, "verify").make_context("verify", args).params  # unknown flags fail here
            assert (params["reward_key"], params["no_reward_key"]) == (key, key is None)
