"""Scenario 8 (issue 31): does it fit? A debug replay whose trainer exceeds its pod's memory limit, in real pods.

The chart's CPU worker pods of these tests have a 6 GiB memory limit (conftest.SMALL_RUNTIME_RESOURCES). The job
trains one rollout of 64k tokens in one micro-batch on a model with a 32k vocabulary: its float32 logits alone are
8 GiB, so the trainer rank runs out of memory in its forward pass, through the replay's own tensors. Ray's memory
monitor (it sees the container's limit) or the kernel's OOM killer fires first, either is accepted and recorded.
The job ends Failed with reason OutOfMemory, status.outcome outOfMemory naming the trainer's pod, the rollout and
the phase; the RayCluster is deleted at once, nothing of the job is left running. The same job with a micro-batch
of 4k tokens (0.5 GiB of logits) fits: Succeeded, outcome fits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import yaml

from tests.e2e.conftest import (
    DUMPS_UID, REPO, SMALL_VERIFY_RESOURCES, TTL_SECONDS, provide_volume, wait_for_phase,
)

VOCAB = 32768
TOKENS = 65536  # 32 prompts x 4 samples x (64 + 448) tokens: one micro-batch of 64k tokens -> 8 GiB of logits


def _job(namespace: str, name: str, micro_batch_tokens: int) -> dict:
    job = yaml.safe_load((REPO / "examples" / "smoke-cpu.yaml").read_text())
    job["metadata"].update(name=name, namespace=namespace)
    spec = job["spec"]
    spec["replay"].update(numRollouts=1, verifyResources=SMALL_VERIFY_RESOURCES)
    spec["replay"]["dumps"].update(claimName="oom-dumps", path="oom/rollout_{rollout_id}.pt")
    spec["model"]["config"].update(vocab_size=VOCAB, num_hidden_layers=1, max_position_embeddings=1024)
    spec["trainer"].update(microBatchTokens=micro_batch_tokens)
    spec["results"] = {"claimName": "results"}
    spec["ttlSecondsAfterFinished"] = TTL_SECONDS
    return job


def _write_dumps(folder) -> None:
    subprocess.run([sys.executable, "-m", "forge_replay.cli", "dumps", "synth", "--out",
                    str(folder / "oom" / "rollout_{rollout_id}.pt"), "--num-rollouts", "1", "--prompts", "32",
                    "--samples-per-prompt", "4", "--prompt-len", "64", "--response-len", "448",
                    "--vocab-size", str(VOCAB)], check=True, capture_output=True, timeout=300)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(path, DUMPS_UID, DUMPS_UID)


def _ray_pods(plane, namespace: str) -> list[dict]:
    pods = json.loads(plane.kubectl("get", "-n", namespace, "pods", "-o", "json").stdout)["items"]
    return [p for p in pods if "ray.io/cluster" in p["metadata"].get("labels", {})]


def test_a_trainer_over_its_pod_memory_limit_ends_out_of_memory_and_a_smaller_micro_batch_fits(
        real_cluster, operator_release, e2e_namespace):
    namespace = e2e_namespace
    dumps = provide_volume(real_cluster, namespace, "oom-dumps", "ReadOnlyMany")
    provide_volume(real_cluster, namespace, "results", "ReadWriteMany")
    _write_dumps(dumps)

    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(_job(namespace, "too-big", TOKENS)))
    job = wait_for_phase(real_cluster, namespace, "too-big", {"Succeeded", "Failed"}, 900)
    status = job["status"]
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    assert status.get("outcome") == "outOfMemory", json.dumps(status, indent=1)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "OutOfMemory", ready
    oom = status["outOfMemory"]
    assert oom["signal"] in ("rayMemoryMonitor", "kernelOomKiller", "containerOOMKilled"), oom
    assert oom["where"]["component"] == "trainer" and oom["where"].get("pod"), oom
    assert "-trainer-" in oom["where"]["pod"], oom  # the trainer group's pod (KubeRay: <cluster>-trainer-<...>), not the head
    assert oom["when"].get("rollout") == 0, oom
    events = real_cluster.kubectl("get", "-n", namespace, "events", "--field-selector", "reason=OutOfMemory",
                                  "-o", "json").stdout
    assert json.loads(events)["items"], "no OutOfMemory event"

    deadline = time.monotonic() + 120  # deleted at once: the operator sets the RayJob's TTL to 0
    while _ray_pods(real_cluster, namespace) and time.monotonic() < deadline:
        time.sleep(3)
    assert not _ray_pods(real_cluster, namespace), "Ray pods of the out-of-memory job are still there"

    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(_job(namespace, "fits", 4096)))
    job = wait_for_phase(real_cluster, namespace, "fits", {"Succeeded", "Failed"}, 900)
    assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"], indent=1)
    assert job["status"].get("outcome") == "fits", json.dumps(job["status"], indent=1)
