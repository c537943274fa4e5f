"""Operator benchmark: apply-to-RayJob latency vs a direct RayJob create, a burst, API requests per job.

Starts the test control plane (tests/cluster: etcd, apiserver, controllers, KWOK, KubeRay) and the
operator as a subprocess, then prints figures (record them in docs/benchmarks.md, "Operator").

    python benches/bench_operator.py [--sequential 30] [--burst 200]

Jobs are created suspended so KubeRay creates no Ray cluster: the figures are the operator's own
(watch -> reconcile -> RayJob create -> status), not pod start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forge_replay.api import parse_job  # noqa: E402
from forge_replay.controller.render import ray_job  # noqa: E402
from forge_replay.controller.settings import OperatorSettings  # noqa: E402
from tests.cluster.manager import ControlPlane, Options  # noqa: E402
from tests.cluster.operator_harness import Api, OperatorProcess, claim_doc, job_doc  # noqa: E402

from bench_args import positive_int  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def wait(check, timeout: float = 120.0, interval: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("timed out")


def api_requests(metrics_text: str) -> float:
    return sum(counters(metrics_text, "forge_replay_operator_api_requests_total").values())


def counters(metrics_text: str, name: str) -> dict[str, float]:
    """label set -> value of one Prometheus counter family."""
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels[len(name):]] = float(value)
    return out


def per_job_breakdown(before: str, after: str, name: str, jobs: int) -> str:
    old, new = counters(before, name), counters(after, name)
    parts = [f"{key} {(new[key] - old.get(key, 0)) / jobs:.1f}" for key in sorted(new) if new[key] - old.get(key, 0)]
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=positive_int, default=30, help="jobs created one at a time for latency")
    parser.add_argument("--burst", type=positive_int, default=200, help="jobs created at once")
    args = parser.parse_args()

    with ControlPlane(Options(gpu_nodes=1, cpu_nodes=0)) as plane:
        api = Api(str(plane.kubeconfig))
        namespace = "bench"
        plane.kubectl("create", "namespace", namespace)
        # the claim every job names: the operator checks it before creating anything
        dumps_claim = job_doc("x", namespace)["spec"]["replay"]["dumps"]["claimName"]
        Api(str(plane.kubeconfig)).kube.create(claim_doc(dumps_claim, namespace))
        workdir = Path(tempfile.mkdtemp(prefix="forge-replay-bench-"))
        operator = OperatorProcess(str(plane.kubeconfig), [namespace], workdir / "operator.log",
                                  "--resync-seconds", "60").start()  # the production default
        try:
            kube = api.kube
            # Baseline: a direct create of the same RayJob, until a GET sees it.
            direct = []
            for i in range(args.sequential):
                doc = job_doc(f"direct-{i:03d}", namespace, suspend=True)
                body = ray_job(parse_job(doc), OperatorSettings())
                started = time.perf_counter()
                kube.create(body)
                wait(lambda: kube.get("ray.io/v1", "RayJob", namespace, body["metadata"]["name"]))
                direct.append(time.perf_counter() - started)

            # Through the operator: create the ForgeReplayJob, until its RayJob exists / status is written.
            before_text = operator.metrics()
            before = api_requests(before_text)
            to_rayjob, to_status = [], []
            for i in range(args.sequential):
                doc = job_doc(f"seq-{i:03d}", namespace, suspend=True)
                started = time.perf_counter()
                kube.create(doc)
                wait(lambda: kube.get("ray.io/v1", "RayJob", namespace, doc["metadata"]["name"]))
                to_rayjob.append(time.perf_counter() - started)
                wait(lambda: api.status(namespace, doc["metadata"]["name"]).get("phase") == "Suspended")
                to_status.append(time.perf_counter() - started)
            time.sleep(3)  # let child-event reconciles settle before counting
            after_text = operator.metrics()
            per_job = (api_requests(after_text) - before) / args.sequential
            requests_breakdown = per_job_breakdown(before_text, after_text,
                                                   "forge_replay_operator_api_requests_total", args.sequential)
            reconcile_breakdown = per_job_breakdown(before_text, after_text,
                                                    "forge_replay_operator_reconciles_total", args.sequential)

            # Burst.
            names = [f"burst-{i:03d}" for i in range(args.burst)]
            started = time.perf_counter()
            for name in names:
                kube.create(job_doc(name, namespace, suspend=True))
            created = time.perf_counter() - started

            def rayjobs() -> int:
                return sum(1 for r in kube.list("ray.io/v1", "RayJob", namespace, "app.kubernetes.io/managed-by=forge-replay")
                           if r["metadata"]["name"].startswith("burst-"))

            wait(lambda: rayjobs() == args.burst, timeout=900, interval=0.5)
            all_rayjobs = time.perf_counter() - started

            def suspended() -> bool:
                items = kube.list_all("forgereplay.io/v1alpha1", "ForgeReplayJob", namespace)
                return sum(1 for i in items if i["metadata"]["name"].startswith("burst-")
                           and (i.get("status") or {}).get("phase") == "Suspended") == args.burst

            wait(suspended, timeout=900, interval=0.5)
            all_status = time.perf_counter() - started
        finally:
            operator.stop()

    cpu = platform.processor() or platform.machine()
    print(f"# operator benchmark {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, {cpu}, "
          f"Python {platform.python_version()}")
    print(f"direct RayJob create -> visible      p50 {percentile(direct, .5)*1000:7.1f} ms   "
          f"p95 {percentile(direct, .95)*1000:7.1f} ms   (n={len(direct)})")
    print(f"ForgeReplayJob create -> RayJob      p50 {percentile(to_rayjob, .5)*1000:7.1f} ms   "
          f"p95 {percentile(to_rayjob, .95)*1000:7.1f} ms   (n={len(to_rayjob)})")
    print(f"ForgeReplayJob create -> status      p50 {percentile(to_status, .5)*1000:7.1f} ms   "
          f"p95 {percentile(to_status, .95)*1000:7.1f} ms")
    print(f"reconcile API requests per job       {per_job:.1f} (kopf's own watch/patch traffic not included)")
    print(f"  per job by request: {requests_breakdown}")
    print(f"  reconciles per job by trigger: {reconcile_breakdown}")
    print(f"burst of {args.burst}: created in {created:.1f} s, all RayJobs after {all_rayjobs:.1f} s, "
          f"all statuses after {all_status:.1f} s ({args.burst / all_status:.1f} jobs/s)")
    print(json.dumps({"direct_p50_ms": percentile(direct, .5) * 1000, "operator_p50_ms": percentile(to_rayjob, .5) * 1000,
                      "operator_p95_ms": percentile(to_rayjob, .95) * 1000, "api_requests_per_job": per_job,
                      "burst": args.burst, "burst_all_rayjobs_s": all_rayjobs, "burst_all_status_s": all_status}))


if __name__ == "__main__":
    main()
