"""Scenario 13 (issue 32): a sweep in real pods whose largest points exceed the trainer pod's memory limit.

Scenario 8's data and model (one rollout's 64k tokens, a 32k vocabulary) swept over two micro-batch sizes and two
stretched lengths (a grid of 4 points, 2 rollouts each): at microBatchTokens 2048 a point holds 0.25 GiB of logits
and fits; at 65536 its float32 logits alone are 8 GiB, over the CPU worker pod's 6 GiB limit
(conftest.SMALL_RUNTIME_RESOURCES), so Ray's memory monitor or the kernel kills the trainer rank. Both large points
end outOfMemory, recorded, and the sweep goes on after the first (a new trainer actor for the next point): one job,
one Ray cluster, 4 points done; status.sweep and report.json's sweep agree; the job Succeeds (no expectation).
"""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import provide_volume, wait_for_phase
from tests.e2e.test_scenario8_out_of_memory import _job, _ray_pods, _write_dumps

SMALL, LARGE = 2048, 65536
STRETCH = [512, 576]


def test_a_sweep_survives_its_out_of_memory_points_in_real_pods(real_cluster, operator_release, e2e_namespace):
    namespace = e2e_namespace
    dumps = provide_volume(real_cluster, namespace, "oom-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, namespace, "results", "ReadWriteMany")
    _write_dumps(dumps)
    job = _job(namespace, "sweep", SMALL)
    job["spec"]["sweep"] = {"axes": [{"field": "trainer.microBatchTokens", "values": [SMALL, LARGE]},
                                     {"field": "replay.stretch.maxTokens", "values": STRETCH}],
                            "search": "grid", "budgetGiB": 5, "rolloutsPerPoint": 2}
    started = time.monotonic()
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    done = wait_for_phase(real_cluster, namespace, "sweep", {"Succeeded", "Failed"}, 1500)
    print(f"scenario 13: the sweep took {time.monotonic() - started:.0f}s from apply to {done['status']['phase']}")
    status = done["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    sweep = status["sweep"]
    assert sweep["pointsDone"] == 4 and sweep["finished"] is True and sweep["outOfMemory"] == 2, sweep

    (folder,) = (results / namespace / "sweep").iterdir()
    report = json.loads((folder / "report.json").read_text())["sweep"]
    outcomes = {(p["values"]["trainer.microBatchTokens"], p["values"]["replay.stretch.maxTokens"]): p["outcome"]
                for p in report["points"]}
    assert outcomes == {(SMALL, 512): "fits", (SMALL, 576): "fits", (LARGE, 512): "outOfMemory",
                        (LARGE, 576): "outOfMemory"}, report["points"]
    assert report["finished"] is True and report["points_run"] == 4
    frontier = {f["at"]["trainer.microBatchTokens"]: f for f in report["frontier"]}
    assert [e for e in sweep["frontier"]], sweep  # the status carries the frontier the report has
    assert set(frontier) == {SMALL, LARGE}, report["frontier"]
    assert (folder / "frontier.png").stat().st_size > 0

    deadline = time.monotonic() + 180  # the RayCluster goes after the job's TTL: nothing of the sweep left running
    while _ray_pods(real_cluster, namespace) and time.monotonic() < deadline:
        time.sleep(3)
    assert not _ray_pods(real_cluster, namespace), "Ray pods of the sweep are still there"
