"""Scenario 1: `helm install` of the chart with the local operator image. The operator pod becomes Ready
through its probes, holds its Lease and serves /metrics (read through the API server's service proxy)."""

from __future__ import annotations

import json

from tests.cluster.node import NODE_NAME
from tests.e2e.conftest import OPERATOR_NAMESPACE, RELEASE

SELECTOR = "app.kubernetes.io/name=forge-replay-operator"


def test_the_chart_installs_a_ready_operator_that_leads_and_serves_metrics(real_cluster, operator_release):
    real_cluster.kubectl("wait", "-n", OPERATOR_NAMESPACE, "pod", "-l", SELECTOR, "--for=condition=Ready",
                         "--timeout=180s")
    (pod,) = json.loads(real_cluster.kubectl("get", "-n", OPERATOR_NAMESPACE, "pod", "-l", SELECTOR,
                                             "-o", "json").stdout)["items"]
    assert pod["spec"]["nodeName"] == NODE_NAME
    (container,) = pod["status"]["containerStatuses"]
    assert container["ready"] and container["restartCount"] == 0, container
    assert container["image"].endswith(operator_release["image"]["tag"])

    lease = json.loads(real_cluster.kubectl("get", "-n", OPERATOR_NAMESPACE, "lease", "forge-replay-operator",
                                            "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"].startswith(f"{pod['metadata']['name']}_")

    metrics = real_cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/services/"
                                   f"http:{RELEASE}-forge-replay-operator-metrics:9090/proxy/metrics").stdout
    assert "forge_replay_operator_jobs" in metrics
    logs = real_cluster.kubectl("logs", "-n", OPERATOR_NAMESPACE, pod["metadata"]["name"]).stdout
    assert "Traceback" not in logs, logs[-3000:]
