"""Scenario 2: a debug replay on CPU, end to end in real pods.

Dumps written onto the dumps volume by another uid (2000, mode 0644), `kubectl apply -f` of the tiny-model
debug job with 4 rollouts (examples/smoke-cpu.yaml). The verify Job's pod reads them as uid 10001 and succeeds;
KubeRay starts the head and the CPU trainer from our runtime image and the submitter; the runtime trains and
its ServiceAccount patches the progress ConfigMap; the job ends Succeeded with 4/4 rollouts and status.memory
from the pod; report.json and memory.png are in the job's own folder of the results volume; the RayCluster is
gone after the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import yaml

from tests.e2e.conftest import REPO, provide_volume

DUMPS_UID = 2000
TTL_SECONDS = 15


def write_dumps(folder, num_rollouts: int) -> None:
    subprocess.run([sys.executable, "-m", "forge_replay.cli", "dumps", "synth", "--out",
                    str(folder / "smoke" / "rollout_{rollout_id}.pt"), "--num-rollouts", str(num_rollouts),
                    "--prompts", "2", "--samples-per-prompt", "4", "--prompt-len", "16", "--response-len", "16",
                    "--vocab-size", "512"], check=True, capture_output=True, timeout=300)
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, DUMPS_UID, DUMPS_UID)
        path.chmod(0o755 if path.is_dir() else 0o644)


def smoke_job(namespace: str) -> dict:
    job = yaml.safe_load((REPO / "examples" / "smoke-cpu.yaml").read_text())
    job["metadata"]["namespace"] = namespace
    job["spec"]["results"] = {"claimName": "results"}
    job["spec"]["ttlSecondsAfterFinished"] = TTL_SECONDS
    return job


def wait_for_phase(plane, namespace: str, name: str, phases: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = json.loads(plane.kubectl("get", "-n", namespace, "forgereplayjob", name, "-o", "json").stdout)
        if job.get("status", {}).get("phase") in phases:
            return job
        time.sleep(3)
    raise AssertionError(f"{name} did not reach {phases} in {timeout:.0f}s; status:\n"
                         f"{json.dumps(job.get('status'), indent=1)}")


def test_a_cpu_debug_replay_runs_to_succeeded_in_real_pods(real_cluster, operator_release, e2e_namespace):
    dumps = provide_volume(real_cluster, e2e_namespace, "smoke-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, e2e_namespace, "results", "ReadWriteMany")
    write_dumps(dumps, 4)
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(smoke_job(e2e_namespace)))

    job = wait_for_phase(real_cluster, e2e_namespace, "smoke-cpu", {"Succeeded", "Failed", "Stalled"}, 900)
    status = job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["rollouts"]["completed"] == status["rollouts"]["total"] == 4
    assert status["memory"]["source"] == "rss" and status["memory"]["peakRssGiB"] > 0

    verify = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "job", "smoke-cpu-verify",
                                             "-o", "json").stdout)
    assert verify["status"].get("succeeded") == 1
    progress = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "configmap", "smoke-cpu-progress",
                                               "-o", "json").stdout)
    assert json.loads(progress["data"]["progress.json"])["completed"] == 4, progress["data"]

    (run_folder,) = (results / e2e_namespace / "smoke-cpu").iterdir()
    report = json.loads((run_folder / "report.json").read_text())
    assert report, "report.json is empty"
    assert (run_folder / "memory.png").stat().st_size > 0
    assert (run_folder / "report.json").stat().st_uid == 10001

    def cluster_gone() -> bool:
        return not json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "rayclusters.ray.io",
                                                   "-o", "json").stdout)["items"]

    deadline = time.monotonic() + TTL_SECONDS + 60  # KubeRay requeues the TTL check; the API server deletes
    while not cluster_gone() and time.monotonic() < deadline:
        time.sleep(3)
    assert cluster_gone(), f"the RayCluster outlived its job's ttlSecondsAfterFinished ({TTL_SECONDS}s) by a minute"
