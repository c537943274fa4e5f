"""Scenario 3: a bad dump on the volume. The verify Job's pod refuses it; the job ends Failed or Stalled with a
message naming the rollout's file, and no RayJob is ever created (no Ray pod ever asked for)."""

from __future__ import annotations

import json

from tests.e2e.conftest import provide_volume, smoke_job, wait_for_phase, write_dumps


def test_a_truncated_dump_is_refused_before_any_ray_pod(real_cluster, operator_release, e2e_namespace):
    dumps = provide_volume(real_cluster, e2e_namespace, "smoke-dumps", "ReadOnlyMany")
    provide_volume(real_cluster, e2e_namespace, "results", "ReadWriteMany")
    write_dumps(dumps, 4)
    bad = dumps / "smoke" / "rollout_2.pt"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated: not a readable torch.save archive
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(smoke_job(e2e_namespace)))

    job = wait_for_phase(real_cluster, e2e_namespace, "smoke-cpu", {"Failed", "Stalled", "Succeeded"}, 600)
    status = job["status"]
    assert status["phase"] in ("Failed", "Stalled"), json.dumps(status, indent=1)
    messages = " ".join(c.get("message", "") for c in status.get("conditions", []))
    assert "rollout_2.pt" in messages, messages
    verify = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "job", "smoke-cpu-verify",
                                             "-o", "json").stdout)
    assert verify["status"].get("failed", 0) >= 1 and not verify["status"].get("succeeded")
    assert not json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "rayjobs.ray.io", "-o",
                                               "json").stdout)["items"], "a RayJob was created for bad dumps"
