"""The real node itself: a pod really runs on it, logs, resolves Service names and reaches the API server.

Everything the product scenarios rely on, checked first with the tiny busybox image so that a broken node
fails here, with a clear message, rather than as a stuck ForgeReplayJob.
"""

from __future__ import annotations

import json

from tests.cluster.node import BUSYBOX_IMAGE, NODE_NAME

SCRIPT = """
set -e
echo "hello from $(hostname) as uid $(id -u)"
nslookup kubernetes.default.svc.cluster.local
# busybox speaks no TLS the API server accepts: plain HTTP to its port proves the Service routes to it.
wget -O - http://kubernetes.default.svc:443/ 2>&1 || true
echo done
"""


def test_a_pod_runs_logs_resolves_services_and_reaches_the_api_server(real_cluster, e2e_namespace):
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "smoke", "namespace": e2e_namespace},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "smoke", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", SCRIPT],
            "securityContext": {"runAsUser": 10001, "runAsNonRoot": True}}]},
    }
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    real_cluster.kubectl("wait", "-n", e2e_namespace, "pod/smoke", "--for=jsonpath={.status.phase}=Succeeded",
                         "--timeout=120s")
    status = json.loads(real_cluster.kubectl("get", "-n", e2e_namespace, "pod/smoke", "-o", "json").stdout)
    assert status["spec"]["nodeName"] == NODE_NAME
    assert status["status"]["podIP"].startswith("10.245.0.")
    logs = real_cluster.kubectl("logs", "-n", e2e_namespace, "smoke").stdout
    assert "hello from smoke as uid 10001" in logs
    assert "Address: 10.0.0.1" in logs, "CoreDNS resolved the kubernetes Service"
    assert "Connecting to kubernetes.default.svc:443 (10.0.0.1:443)" in logs
    assert "400 Bad Request" in logs, "the API server (TLS only) answered through the kubernetes Service"
    assert logs.rstrip().endswith("done")
