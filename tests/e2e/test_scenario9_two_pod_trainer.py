"""Scenario 9 (issue 33): a trainer across pods, in real pods.

`trainer.nodes: 2` on CPU: KubeRay makes two trainer pods (one Ray CPU each: KubeRay rounds the chart's 250m request
up to 1), the trainer's two bundles cannot share one, so rank 0 and rank 1 run in different pods and find each other
over the pod network (gloo; the rendezvous address is rank 0's pod). Every rollout is trained by both ranks in step,
and report.json has both ranks' memory, each naming its pod.

Then forge mode with one engine (the sglang stand-in image, as scenario 4) and `weightSync: distributed`: the
weights go from trainer rank 0's pod to the engine's pod at every step. Sized for the 2-core node: head, two
trainer pods, one engine pod, the submitter.
"""

from __future__ import annotations

import json
import time

import yaml

from forge_replay.api.paths import RESULTS_MOUNT
from tests.cluster import images
from tests.e2e.conftest import (REPO, SMALL_VERIFY_RESOURCES, TTL_SECONDS, provide_volume, run_noting_roles,
                                smoke_job, write_dumps)
from tests.integration.test_forge_run import received_by_version

NAMESPACE = "e2e-two-pods"
ROLLOUTS = 3
RECORDS = "engine-calls"


def _run(plane, name: str, job: dict, results, timeout: float = 900) -> tuple[dict, dict, dict[str, str]]:
    """Apply ``job``, wait for its end; (status, report, pod name and IP -> role) of the run."""
    status, roles = run_noting_roles(plane, NAMESPACE, name, job, timeout)
    assert status.get("phase") == "Succeeded", f"{name}: {json.dumps(status, indent=1)}"
    (folder,) = (results / NAMESPACE / name).iterdir()
    return status, json.loads((folder / "report.json").read_text()), roles


def _check_both_ranks_trained_every_rollout_in_pods_of_their_own(status: dict, report: dict, roles: dict) -> None:
    assert status["rollouts"] == {"completed": ROLLOUTS, "total": ROLLOUTS}
    assert report["world_size"] == 2 and [r["rollout_id"] for r in report["rollouts"]] == list(range(ROLLOUTS))
    hosts = set()
    for rollout in report["rollouts"]:
        memory = rollout["memory"]
        assert [m["rank"] for m in memory] == [0, 1], memory
        assert all(m["peak_rss_gib"] > 0 for m in memory), memory
        assert memory[0]["host"] != memory[1]["host"], memory  # two pods
        hosts.update(m["host"] for m in memory)
    assert len(hosts) == 2 and all(roles.get(host) == "trainer" for host in hosts), (hosts, roles)


def test_a_trainer_across_two_pods_debug_then_forge(real_cluster, operator_release) -> None:
    (standin,) = images.build_images(("sglang-standin",))
    real_cluster.node.import_image(standin.archive, name=standin.reference)
    real_cluster.kubectl("create", "namespace", NAMESPACE)
    real_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", NAMESPACE, "--timeout=60s")
    dumps = provide_volume(real_cluster, NAMESPACE, "smoke-dumps", "ReadOnlyMany")
    results = provide_volume(real_cluster, NAMESPACE, "results", "ReadWriteMany")
    write_dumps(dumps, ROLLOUTS)

    debug = smoke_job(NAMESPACE, name="two-pods-debug")
    debug["spec"]["replay"]["numRollouts"] = ROLLOUTS
    debug["spec"]["trainer"]["nodes"] = 2
    started = time.monotonic()
    status, report, roles = _run(real_cluster, "two-pods-debug", debug, results)
    print(f"scenario 9: two-pods-debug took {time.monotonic() - started:.0f}s from apply to Succeeded")
    _check_both_ranks_trained_every_rollout_in_pods_of_their_own(status, report, roles)

    forge = yaml.safe_load((REPO / "examples" / "forge-cpu.yaml").read_text())
    forge["metadata"].update(name="two-pods-forge", namespace=NAMESPACE)
    spec = forge["spec"]
    spec["image"] = standin.reference
    spec["replay"].update(numRollouts=ROLLOUTS, verifyResources=SMALL_VERIFY_RESOURCES)
    spec["replay"]["dumps"]["claimName"] = "smoke-dumps"
    spec["replay"]["dumps"]["path"] = "smoke/rollout_{rollout_id}.pt"
    spec["trainer"]["nodes"] = 2
    spec["rollout"].update(numGpus=1, numGpusPerEngine=1, weightSync="distributed")
    spec["faultTolerance"]["healthCheck"]["timeoutSeconds"] = 30
    spec["results"] = {"claimName": "results"}
    spec["ttlSecondsAfterFinished"] = TTL_SECONDS
    records = f"{RESULTS_MOUNT}/{RECORDS}/two-pods-forge"
    spec["pod"] = {"env": [{"name": "SGLANG_DOUBLE_RECORD_DIR", "value": records}]}
    started = time.monotonic()
    status, report, roles = _run(real_cluster, "two-pods-forge", forge, results)
    print(f"scenario 9: two-pods-forge took {time.monotonic() - started:.0f}s from apply to Succeeded")
    _check_both_ranks_trained_every_rollout_in_pods_of_their_own(status, report, roles)
    engines = report["engines"]
    assert engines["engines"] == 1 and engines["weight_sync"] == "distributed"
    assert engines["weight_versions"] == [str(v) for v in range(1, ROLLOUTS + 1)]
    folder = results / RECORDS / "two-pods-forge"
    (starts,) = folder.glob("starts-*.jsonl")
    calls = [json.loads(line) for line in (folder / f"calls-{starts.stem.split('-')[1]}.jsonl").read_text()
             .splitlines()]
    (init,) = [c["body"] for c in calls if c["path"] == "/init_weights_update_group"]
    assert roles.get(init["master_address"]) == "trainer", (init, roles)  # trainer rank 0's pod
    rank0 = report["rollouts"][0]["memory"][0]["host"]
    assert roles.get(rank0) == "trainer"
    got = received_by_version({"calls": calls}, "/update_weights_from_distributed")
    assert list(got) == [str(v) for v in range(1, ROLLOUTS + 1)] and all(v["tensors"] > 0 for v in got.values())
