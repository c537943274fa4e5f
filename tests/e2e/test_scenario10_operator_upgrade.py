"""Scenario 10 (issue 33): an operator upgrade mid-run loses no job, in real pods.

While the 40-rollout job of scenario 5 trains, `helm upgrade` moves the release to a second operator image
(tests/cluster/images.py `operator-next`: another image, another version label). The Deployment rolls; the new
operator takes the Lease and adopts the running RayJob (the same UID, none created twice); progress keeps flowing
into the job's status and the job completes. The release goes back to the first image afterwards, for the scenarios
that follow.
"""

from __future__ import annotations

import json
import time

from tests.cluster import images
from tests.e2e.conftest import CHART, OPERATOR_NAMESPACE, RELEASE, helm, wait_for_phase
from tests.e2e.test_scenario5_faults import ROLLOUTS, long_job, pods, wait_until_training

SELECTOR = "app.kubernetes.io/name=forge-replay-operator"


def _upgrade(plane, values: dict, image: str) -> None:
    repository, tag = image.rsplit(":", 1)
    path = plane.workdir / f"operator-values-{tag[:12]}.json"
    path.write_text(json.dumps({**values, "image": {**values["image"], "repository": repository, "tag": tag}}))
    helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--values", str(path), "--wait",
         "--timeout=300s", plane=plane)


def _running_operators(plane) -> list[dict]:
    return [p for p in pods(plane, OPERATOR_NAMESPACE, SELECTOR) if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running"]


def _rayjob_uids(plane, namespace: str) -> list[str]:
    found = json.loads(plane.kubectl("get", "-n", namespace, "rayjobs.ray.io", "-o", "json").stdout)["items"]
    return [r["metadata"]["uid"] for r in found]


def test_helm_upgrade_to_another_operator_image_mid_run_adopts_the_job(real_cluster, operator_release,
                                                                       e2e_namespace) -> None:
    (nxt,) = images.build_images(("operator-next",))
    real_cluster.node.import_image(nxt.archive, name=nxt.reference)
    namespace = e2e_namespace
    long_job(real_cluster, namespace)
    wait_until_training(real_cluster, namespace)
    (rayjob,) = _rayjob_uids(real_cluster, namespace)
    (old,) = _running_operators(real_cluster)
    try:
        _upgrade(real_cluster, operator_release, nxt.reference)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            running = _running_operators(real_cluster)
            if len(running) == 1 and running[0]["spec"]["containers"][0]["image"] == nxt.reference:
                break
            time.sleep(2)
        (new,) = _running_operators(real_cluster)
        assert new["spec"]["containers"][0]["image"] == nxt.reference and new["metadata"]["name"] != \
            old["metadata"]["name"]
        assert _rayjob_uids(real_cluster, namespace) == [rayjob]  # the same RayJob, none created twice
        before = json.loads(real_cluster.kubectl("get", "-n", namespace, "forgereplayjob", "smoke-cpu", "-o",
                                                 "json").stdout)["status"]["rollouts"]["completed"]
        job = wait_for_phase(real_cluster, namespace, "smoke-cpu", {"Succeeded", "Failed", "Stalled"}, 900)
        assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"], indent=1)
        assert before < ROLLOUTS == job["status"]["rollouts"]["completed"]  # progress kept flowing after the upgrade
        assert _rayjob_uids(real_cluster, namespace) in ([rayjob], [])  # adopted: never created twice
        lease = json.loads(real_cluster.kubectl("get", "-n", OPERATOR_NAMESPACE, "lease", "forge-replay-operator",
                                                "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"].startswith(f"{new['metadata']['name']}_")
        log = real_cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, new["metadata"]["name"]).stdout
        assert "Resuming is processed: 1 succeeded" in log, log[-3000:]  # kopf resumed the one running job
    finally:
        _upgrade(real_cluster, operator_release, operator_release["image"]["repository"] + ":" +
                 operator_release["image"]["tag"])
