"""Fixtures of the end-to-end tests: the test control plane with one real node (tests/cluster/node.py).

Collected only with FORGE_REPLAY_E2E=1 (scripts/e2e sets it; tests/conftest.py). Nothing here skips: a
missing build or package is an error that says what to run.
"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cluster.manager import ControlPlane, Options
from tests.cluster.node import RealNode

_STATE: dict[str, object] = {"plane": None, "failed": False}


@pytest.fixture(scope="session")
def real_cluster() -> ControlPlane:
    """The whole control plane plus one real node (``real_cluster.node``), started once per session.

    Stopping it must leave nothing behind (processes, cgroups, mounts, namespaces): checked at teardown."""
    plane = ControlPlane(Options(real_node=True, gpu_nodes=1, cpu_nodes=0)).start()
    _STATE["plane"] = plane
    yield plane
    _STATE["plane"] = None
    node: RealNode = plane.node
    plane.stop(keep_logs=bool(_STATE["failed"]))
    assert not plane.left_behind, f"the real node left {plane.left_behind}"
    assert not node.cgroup_pids()


@pytest.fixture
def e2e_namespace(real_cluster: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test; deleted (without waiting) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    real_cluster.kubectl("create", "namespace", name)
    real_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    plane = _STATE["plane"]
    if report.failed and plane is not None:
        _STATE["failed"] = True
        plane.keep_workdir = True
        dead = ", ".join(c.name for c in plane.dead_components())
        header = f"cluster folder {plane.workdir}" + (f"; EXITED: {dead}" if dead else "")
        report.sections.append(("cluster logs", f"{header}\n{plane.log_tails(25)}"))
    return report
