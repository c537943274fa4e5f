"""Scenario 4: forge mode across pods, in real pods.

examples/forge-cpu.yaml (a tiny model, two engines, rollout fault tolerance) with the trainer and each engine on a
Ray pod of its own: the runtime's own engine command, ``python -m sglang.launch_server``, runs in the engine pods of
a TEST-ONLY image (``sglang-standin``, tests/cluster/images.py: the runtime image plus a stand-in ``sglang`` whose
launch_server is the sglang test double, and sglang-router). The engines are health-checked before use and by the
fault-tolerance monitor, sglang_router runs in front of them, and the weights are pushed to both after every step:
once with ``weightSync: disk`` (staged on each engine's pod through Ray's object store) and once with
``distributed`` (a gloo group from the trainer's pod to the engines' pods over the pod network). Each engine's
double records what it received on the results volume: the two runs' engines got the same weights.
Jobs run one after the other (the node has 2 CPUs): disk, then distributed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from forge_replay.api.paths import RESULTS_MOUNT
from tests.cluster import images
from tests.integration.test_forge_run import received_by_version  # what the sglang double received, per version
from tests.e2e.conftest import (
    REPO,
    SMALL_VERIFY_RESOURCES,
    TTL_SECONDS,
    provide_volume,
    run_noting_roles,
    write_dumps,
)

ROLLOUTS = 3
NAMESPACE = "e2e-forge"
RECORDS = "engine-calls"  # under the results volume: SGLANG_DOUBLE_RECORD_DIR of each job's engines


@dataclass(frozen=True)
class ForgeRun:
    status: dict
    report: dict
    engines: list[dict]  # per engine: its double's starts and calls
    roles: dict[str, str]  # pod IP and pod name -> the role of that pod of the job (head, trainer, rollout, ...)
    folder: Path  # the run's folder on the results volume


def forge_job(name: str, weight_sync: str, image: str) -> dict:
    job = yaml.safe_load((REPO / "examples" / "forge-cpu.yaml").read_text())
    job["metadata"].update(name=name, namespace=NAMESPACE)
    spec = job["spec"]
    spec["image"] = image
    spec["replay"]["numRollouts"] = ROLLOUTS
    spec["replay"]["verifyResources"] = SMALL_VERIFY_RESOURCES
    spec["rollout"]["weightSync"] = weight_sync
    # Probed every second as in the example, but given time: 2 cores run the trainer, two engines and Ray.
    spec["faultTolerance"]["healthCheck"]["timeoutSeconds"] = 30
    spec["results"] = {"claimName": "results"}
    spec["ttlSecondsAfterFinished"] = TTL_SECONDS
    records = f"{RESULTS_MOUNT}/{RECORDS}/{name}"
    spec["pod"] = {"env": [{"name": "SGLANG_DOUBLE_RECORD_DIR", "value": records}]}
    return job


def run_to_the_end(plane, name: str, job: dict, results: Path, timeout: float = 900) -> ForgeRun:
    """Apply ``job`` and wait for its end, noting which pod of the job had which IP while it ran."""
    status, roles = run_noting_roles(plane, NAMESPACE, name, job, timeout)
    assert status.get("phase") == "Succeeded", f"{name}: {json.dumps(status, indent=1)}"
    (folder,) = (results / NAMESPACE / name).iterdir()
    report = json.loads((folder / "report.json").read_text())
    records = results / RECORDS / name
    engines = []
    for starts in sorted(records.glob("starts-*.jsonl")):
        port = starts.stem.split("-")[1]
        calls = records / f"calls-{port}.jsonl"
        engines.append({"starts": [json.loads(line) for line in starts.read_text().splitlines()],
                        "calls": [json.loads(line) for line in calls.read_text().splitlines()]})
    return ForgeRun(status, report, engines, roles, folder)


@pytest.fixture(scope="module")
def forge_runs(real_cluster, operator_release) -> dict[str, ForgeRun]:
    """Both forge jobs run to their end, disk first (the sglang stand-in image built if missing, and imported)."""
    (standin,) = images.build_images(("sglang-standin",))
    real_cluster.node.import_image(standin.archive, name=standin.reference)
    real_cluster.kubectl("create", "namespace", NAMESPACE)
    real_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", NAMESPACE, "--timeout=60s")
    dumps = provide_volume(real_cluster, NAMESPACE, "forge-cpu-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, NAMESPACE, "results", "ReadWriteMany")
    write_dumps(dumps, ROLLOUTS, path="forge-cpu/rollout_{rollout_id}.pt")
    runs = {}
    for weight_sync in ("disk", "distributed"):
        name = f"forge-{weight_sync}"
        started = time.monotonic()
        runs[weight_sync] = run_to_the_end(real_cluster, name, forge_job(name, weight_sync, standin.reference),
                                           results)
        print(f"scenario 4: {name} took {time.monotonic() - started:.0f}s from apply to Succeeded")
    return runs


def check_engines_in_their_own_pods(run: ForgeRun) -> None:
    """Two engines, each on a rollout pod of its own, health-checked, behind sglang_router, pushed every step."""
    engines = run.report["engines"]
    assert run.status["rollouts"] == {"completed": ROLLOUTS, "total": ROLLOUTS}
    assert engines["engines"] == 2 and engines["restarts"] == 0
    assert engines["weight_versions"] == [str(v) for v in range(1, ROLLOUTS + 1)]
    assert engines["router"].startswith("sglang_router in front of 2"), engines["router"]
    assert engines["health_monitors"] == 1 and engines["health_probes"] > 0 and engines["health_failures"] == 0
    logs = sorted(run.folder.rglob("engine-*.log"))
    assert len(logs) == 2, list(run.folder.rglob("*"))
    pods = []
    for log in logs:  # the runtime's own engine command started them (no --engine-command in a cluster)
        first = log.read_text().splitlines()[0]
        assert first.startswith("sglang stand-in (TEST ONLY): python -m sglang.launch_server --host "), first
        pods.append(first.rsplit("(in pod ", 1)[1].rstrip(")"))
    assert [run.roles.get(pod) for pod in pods] == ["rollout", "rollout"] and len(set(pods)) == 2, (pods, run.roles)
    # An engine listens on its pod's address, or on loopback when the rollout manager shares its pod.
    hosts = [urlparse(url).hostname for url in engines["urls"]]
    assert all(run.roles.get(host) == "rollout" or host == "127.0.0.1" for host in hosts), (hosts, run.roles)
    assert len(run.engines) == 2
    for engine in run.engines:
        paths = [c["path"] for c in engine["calls"]]
        assert paths[0] == "/health_generate" and paths.count("/health_generate") > 1  # at start, then the monitor
        # every version read back and the KV cache flushed (sglang_router reads /model_info once more at its start)
        assert paths.count("/flush_cache") == ROLLOUTS and paths.count("/model_info") >= ROLLOUTS


def test_forge_mode_with_disk_weight_sync_in_pods_of_their_own(forge_runs) -> None:
    run = forge_runs["disk"]
    check_engines_in_their_own_pods(run)
    assert run.report["engines"]["weight_sync"] == "disk"
    for engine in run.engines:
        got = received_by_version(engine, "/update_weights_from_disk")
        assert list(got) == ["1", "2", "3"] and all(v["tensors"] > 0 for v in got.values())
        # staged on the engine's own pod (Ray's object store carried it from the trainer's)
        assert all("forge-replay-engine-" in c["body"]["model_path"] for c in engine["calls"]
                   if c["path"] == "/update_weights_from_disk")


def test_forge_mode_with_distributed_weight_sync_over_the_pod_network(forge_runs) -> None:
    run = forge_runs["distributed"]
    check_engines_in_their_own_pods(run)
    assert run.report["engines"]["weight_sync"] == "distributed"
    expected = received_by_version(forge_runs["disk"].engines[0], "/update_weights_from_disk")
    for engine in run.engines:
        paths = [c["path"] for c in engine["calls"]]
        assert "/update_weights_from_disk" not in paths
        (init,) = [c["body"] for c in engine["calls"] if c["path"] == "/init_weights_update_group"]
        assert init["backend"] == "gloo" and init["world_size"] == 3
        assert run.roles.get(init["master_address"]) == "trainer", (init, run.roles)  # trainer rank 0's own pod
        got = received_by_version(engine, "/update_weights_from_distributed")
        assert list(got) == ["1", "2", "3"]
        for version, summary in got.items():  # what the disk run's engines loaded, step by step
            assert summary["tensors"] == expected[version]["tensors"]
            assert summary["abs_sum"] == pytest.approx(expected[version]["abs_sum"], rel=1e-6)
