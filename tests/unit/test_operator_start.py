"""`forge-replay operator` starts as the image's numeric user, which has no passwd entry.

Found by the first real pod of the operator image (tests/e2e, scenario 1): kopf, given no identity, names
itself after the login name (kopf 1.45.2 kopf/_core/reactor/running.py:191 calls
kopf/_core/engines/peering.py:289 detect_own_id -> getpass.getuser()), and getpass.getuser() raises
KeyError for uid 65532 when neither LOGNAME, USER, LNAME nor USERNAME is set, as in the chart's pod.
"""

from __future__ import annotations

import getpass

import yaml

from forge_replay.controller import start
from forge_replay.controller.settings import OperatorSettings


def test_the_operator_never_asks_for_its_login_name(tmp_path, monkeypatch):
    def no_passwd_entry() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POD_NAME", "forge-replay-operator-7d9f-abcde")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # restored after the test (run_operator sets it)
    import kopf
    from kopf._core.engines import peering

    seen: dict = {}

    def kopf_run(**kwargs):  # what kopf.run does first with the identity it is given (see the module docstring)
        seen["identity"] = kwargs.get("identity") if kwargs.get("identity") is not None else peering.detect_own_id(
            manual=False)

    monkeypatch.setattr(kopf, "run", kopf_run)
    start.run_operator(OperatorSettings(metrics_port=None, liveness_endpoint=None), kubeconfig=str(kubeconfig))
    assert seen["identity"].startswith("forge-replay-operator-7d9f-abcde_")
