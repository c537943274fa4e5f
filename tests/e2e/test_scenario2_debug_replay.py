"""Scenario 2: a debug replay on CPU, end to end in real pods.

Dumps written onto the dumps volume by another uid (2000, mode 0644), `kubectl apply -f` of the tiny-model
debug job with 4 rollouts (examples/smoke-cpu.yaml). The verify Job's pod reads them as uid 10001 and succeeds;
KubeRay starts the head and the CPU trainer from our runtime image and the submitter; the runtime trains and
its ServiceAccount patches the progress ConfigMap; the job ends Succeeded with 4/4 rollouts and status.memory
from the pod; report.json and memory.png are in the job's own folder of the results volume; the RayCluster is
gone within the job's ttlSecondsAfterFinished.
"""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import TTL_SECONDS


def test_a_cpu_debug_replay_runs_to_succeeded_in_real_pods(real_cluster, smoke_run):
    namespace, status = smoke_run.namespace, smoke_run.status
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["rollouts"]["completed"] == status["rollouts"]["total"] == 4
    assert status["memory"]["source"] == "rss" and status["memory"]["peakRssGiB"] > 0

    verify = json.loads(real_cluster.kubectl("get", "-n", namespace, "job", "smoke-cpu-verify", "-o", "json").stdout)
    assert verify["status"].get("succeeded") == 1
    progress = json.loads(real_cluster.kubectl("get", "-n", namespace, "configmap", "smoke-cpu-progress",
                                               "-o", "json").stdout)
    assert json.loads(progress["data"]["progress.json"])["completed"] == 4, progress["data"]

    report = json.loads((smoke_run.folder / "report.json").read_text())
    assert [r["rollout_id"] for r in report["rollouts"]] == [0, 1, 2, 3]
    # Verified once, before the GPUs (issue 27): the verify Job's pod checks every dump and records it on the
    # results claim; the runtime's pre-flight trusts every file of that record and verifies none again.
    dumps = sorted(f"smoke/{p.name}" for p in (real_cluster.workdir / "volumes" / namespace / "smoke-dumps" / "smoke")
                   .glob("rollout_*.pt"))
    verify_log = real_cluster.kubectl("logs", "-n", namespace, "job/smoke-cpu-verify").stdout
    assert f"recorded {len(dumps)} verified file(s)" in verify_log, verify_log[-3000:]
    preflight = report["preflight"]
    assert preflight["verified"] == 0 and preflight["trusted"] == len(dumps) == 4, preflight
    assert sorted(preflight["trusted_files"]) == dumps, preflight
    assert (smoke_run.folder / "memory.png").stat().st_size > 0
    assert (smoke_run.folder / "report.json").stat().st_uid == 10001

    def cluster_gone() -> bool:
        return not json.loads(real_cluster.kubectl("get", "-n", namespace, "rayclusters.ray.io",
                                                   "-o", "json").stdout)["items"]

    deadline = smoke_run.finished + TTL_SECONDS + 60  # KubeRay requeues its TTL check; then the API server deletes
    while not cluster_gone() and time.monotonic() < deadline:
        time.sleep(3)
    assert cluster_gone(), f"the RayCluster outlived its job's ttlSecondsAfterFinished ({TTL_SECONDS}s) by a minute"
