"""Scenario 12: the release gate learns from history on the results claim (issue 35). Three runs of one small CPU debug
job (each a new job name, one identity) with ``spec.expect.baseline.history: {last: 3}`` and a band on the trainer's
peak RSS build the history; a fourth with gradient checkpointing turned off (more memory, the same numbers) is
refused with a message naming that setting. Each run's report.json records the runtime image's digest, which the
operator read from the Ray pods' status (``forge_replay.controller.images``).

Sized so that gradient checkpointing's memory is clearly outside the band on CPU: 8 layers of hidden size 128
(intermediate 512), 2 rollouts of 8 samples x 1,024 tokens (16 prompt + 1,008 response), microBatchTokens 8192, a
band of rtol 0.1 around the mean of the runs' peak RSS per rank. The same four jobs run with ``forge-replay run``
(one ``--results`` folder per run under one parent, the history being its siblings: docs/gitops.md) on the 2-core
development machine gave peak RSS 1.27, 1.26 and 1.26 GiB with checkpointing (the band 1.136 .. 1.388 GiB, mean
1.262 GiB) and 1.94 GiB without, refused with "rank 0: peak rss 1.936 GiB, +0.5472 GiB over the band of 3 trusted
runs (1.136 GiB .. 1.388 GiB, mean 1.262 GiB); trainer.gradient_checkpointing True -> False", while the loss
matched exactly (0.14502, 0.33509 on every run); about 4 s a step.
"""

from __future__ import annotations

import json

from tests.e2e.conftest import provide_volume, smoke_job, wait_for_phase, write_dumps
from tests.unit.test_argocd_health import run_health

FINALS = {"Succeeded", "Failed", "Stalled"}
DUMPS = "history/rollout_{rollout_id}.pt"
ROLLOUTS = 2
EXPECT = {"baseline": {"history": {"last": 3}, "metrics": ["loss"],
                       "bands": [{"metric": "peak_rss_gib", "over": "peakPerRank", "rtol": 0.1}]}}


def history_job(namespace: str, name: str, checkpointing: bool) -> dict:
    """examples/smoke-cpu.yaml made big enough for gradient checkpointing to show in the peak RSS."""
    job = smoke_job(namespace, name, expect=EXPECT)
    spec = job["spec"]
    spec["replay"].update(numRollouts=ROLLOUTS, verify=False)  # the dumps are ours: verify costs a pod per run
    spec["replay"]["dumps"]["path"] = DUMPS
    spec["model"]["config"].update(hidden_size=128, intermediate_size=512, num_hidden_layers=8,
                                   max_position_embeddings=2048)
    spec["trainer"].update(gradientCheckpointing=checkpointing, microBatchTokens=8192)
    return job


def condition(job: dict, kind: str) -> dict:
    return next((c for c in job["status"].get("conditions", []) if c["type"] == kind), {})


def check(job: dict, name: str) -> dict:
    return next((c for c in job["status"].get("expectations") or [] if c["name"] == name), {})


def test_history_on_the_results_claim_refuses_a_run_without_gradient_checkpointing(real_cluster, operator_release,
                                                                                   e2e_namespace):
    namespace = e2e_namespace
    write_dumps(provide_volume(real_cluster, namespace, "smoke-dumps", "ReadOnlyMany"), ROLLOUTS,
                response_len=1008, path=DUMPS)
    results = provide_volume(real_cluster, namespace, "results", "ReadWriteMany")

    # One after the other: each run's references are the runs before it, and two Ray clusters at once leave no CPU
    # on the 2-core node for either submitter.
    for n in (1, 2, 3):
        name = f"history-{n}"
        real_cluster.kubectl("apply", "-f", "-", input=json.dumps(history_job(namespace, name, True)))
        done = wait_for_phase(real_cluster, namespace, name, FINALS, 900)
        assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"], indent=1)
        assert condition(done, "ExpectationsMet")["status"] == "True", done["status"]["conditions"]
        said = check(done, "baseline.history")["message"]
        assert ("starts the history" in said) if n == 1 else (f"{n - 1} trusted run(s)" in said), said

    name = "history-no-checkpointing"
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(history_job(namespace, name, False)))
    refused = wait_for_phase(real_cluster, namespace, name, FINALS, 900)
    assert refused["status"]["phase"] == "Failed", json.dumps(refused["status"], indent=1)
    verdict = condition(refused, "ExpectationsMet")
    assert verdict["status"] == "False" and verdict["reason"] == "ExpectationsNotMet", verdict
    assert "gradient_checkpointing" in verdict["message"], verdict
    band = check(refused, "baseline.peak_rss_gib.peakPerRank")
    assert not band["passed"] and "over the band of 3 trusted runs" in band["message"], band
    assert "trainer.gradient_checkpointing True -> False" in band["message"], band
    assert check(refused, "baseline.loss")["passed"], refused["status"]["expectations"]  # the same numbers
    assert run_health(refused)["status"] == "Degraded"

    # Every run kept its report on the claim, with the runtime image's digest as the operator recorded it.
    reports = sorted((results / namespace).glob("*/*/report.json"))
    assert len(reports) == 4, reports
    for path in reports:
        digests = json.loads(path.read_text())["environment"].get("image_digests") or {}
        assert str(digests.get("runtime", "")).startswith("sha256:"), (path, digests)
