"""Scenario 7: bring your own trainer, in real pods.

A slime-backend debug replay whose image is a TEST-ONLY stand-in for a team's slime image (``byo-standin``,
tests/cluster/images.py: Python, torch and Ray like our runtime image, no forge_replay, tests/byo/train.py under
/root/slime, running as root). Every Ray pod runs that image; the init container (our runtime image, uid 10001)
copies forge_replay into the pods, so the script imports forge-replay's rollout function; the script gets the
injected flags, trains 4 rollouts (each in a Ray worker the memory probe watches), and the entrypoint's publish step
writes report.json and patches the progress ConfigMap, which the operator copies into status.memory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from forge_replay.api.paths import DUMPS_MOUNT, RESULTS_MOUNT
from tests.cluster import images
from tests.e2e.conftest import (
    REPO,
    SMALL_VERIFY_RESOURCES,
    TTL_SECONDS,
    provide_volume,
    wait_for_phase,
    write_dumps,
)

ROLLOUTS = 4
TRAIN_MIB = 64  # what each stand-in step holds in a Ray worker (the probe's peak must see it)
NAME = "byo-slime"


def byo_job(namespace: str, image: str) -> dict:
    model = yaml.safe_load((REPO / "examples" / "smoke-cpu.yaml").read_text())["spec"]["model"]
    return {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "replay": {"mode": "debug", "numRollouts": ROLLOUTS, "verifyResources": SMALL_VERIFY_RESOURCES,
                       "dumps": {"claimName": "smoke-dumps", "path": "smoke/rollout_{rollout_id}.pt"}},
            "model": model,
            "trainer": {"backend": "slime", "image": image, "workingDir": images.BYO_WORKING_DIR, "script": "train.py",
                        "nodes": 1, "gpusPerNode": 0,
                        "args": ["--stand-in-backend", "slime", "--stand-in-report",
                                 f"{RESULTS_MOUNT}/stand-in-report.json", "--stand-in-train-mib", str(TRAIN_MIB),
                                 "--rollout-batch-size", "2"],
                        "env": {"FORGE_REPLAY_PROBE_INTERVAL_S": "0.2"}},
            "results": {"claimName": "results"},
            "ttlSecondsAfterFinished": TTL_SECONDS,
        },
    }


@pytest.fixture(scope="module")
def byo_image(real_cluster) -> images.Image:
    (image,) = images.build_images(("byo-standin",))
    real_cluster.node.import_image(image.archive, name=image.reference)
    return image


def test_a_slime_job_runs_the_teams_script_on_the_teams_image(real_cluster, operator_release, byo_image,
                                                             e2e_namespace) -> None:
    dumps = provide_volume(real_cluster, e2e_namespace, "smoke-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, e2e_namespace, "results", "ReadWriteMany")
    write_dumps(dumps, ROLLOUTS)
    started = time.monotonic()
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(byo_job(e2e_namespace, byo_image.reference)))
    job = wait_for_phase(real_cluster, e2e_namespace, NAME, {"Succeeded", "Failed", "Stalled"}, 900)
    print(f"scenario 7: {NAME} took {time.monotonic() - started:.0f}s from apply to Succeeded")
    status = job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["rollouts"] == {"completed": ROLLOUTS, "total": ROLLOUTS}
    memory = status["memory"]
    assert memory["source"] == "rss" and memory["peakRssGiB"] >= TRAIN_MIB / 1024, memory

    # Every Ray pod ran the team's image, with forge_replay brought in by the init container on ours.
    rayjob = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "rayjobs.ray.io", NAME, "-o", "json").stdout)
    cluster = rayjob["spec"]["rayClusterSpec"]
    runtime = operator_release["runtimeImage"]
    for template in (cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])):
        assert template["spec"]["containers"][0]["image"] == byo_image.reference
        (init,) = template["spec"]["initContainers"]
        assert init["image"] == f"{runtime['repository']}:{runtime['tag']}"

    # The script got the injected flags and trained every rollout from its own dump, through forge_replay's loader.
    stand_in = json.loads((results / "stand-in-report.json").read_text())
    args = stand_in["args"]
    assert (stand_in["backend"], args["debug_train_only"], args["start_rollout_id"], args["num_rollout"]) == (
        "slime", True, 0, ROLLOUTS)
    assert args["load_forge_rollout_data"] == f"{DUMPS_MOUNT}/smoke/rollout_{{rollout_id}}.pt"
    assert args["rollout_function_path"] == "forge_replay.replay.generate_rollout"
    # rollouts 0..3, each its own dump's 8 samples (made for that rollout: none from rollout 0's file), each an
    # episode of its own (Sample.rollout_id as dumped), each step in a Ray worker
    assert [(r["rollout_id"], r["made_for"], r["samples"], r["rollout_ids"], r["metrics"]["forge_replay/fallback_used"],
             r["trained_mib"]) for r in stand_in["train"]] == [(i, [i], 8, list(range(8)), 0, TRAIN_MIB)
                                                              for i in range(ROLLOUTS)]
    assert stand_in["eval"] == []  # slime's --debug-train-only: no eval

    # The publish step after the script: report.json in the run's own folder.
    (folder,) = (results / e2e_namespace / NAME).iterdir()
    report = json.loads((folder / "report.json").read_text())
    assert (report["backend"], report["exit_code"], report["job"]) == ("slime", 0, NAME)
    assert report["summary"]["memory_peak"]["peak_rss_gib"] == pytest.approx(memory["peakRssGiB"], rel=1e-2)
    assert Path(folder / "progress.json").exists()
