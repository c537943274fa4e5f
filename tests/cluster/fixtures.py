"""pytest plugin: the shared test control plane (registered by tests/conftest.py).

Fixtures:
- ``control_plane`` (session): the full stack of tests/cluster/manager.py, started once per session. It
  exposes ``kubeconfig``, ``server``, ``bin_dir``, ``log_dir``, ``kubectl(*args)`` and ``api_client()``.
  Tests that use it skip (with the reason) when the binaries are not built and Go is absent.
- ``namespace`` (function): a fresh namespace name, deleted after the test.

When a test that used the control plane fails, its report gets the tail of every component's log, and the
control plane's folder (logs, kubeconfig, certificates) is kept and named at the end of the session.
"""

from __future__ import annotations

import re
import uuid

import pytest

from tests.cluster import build
from tests.cluster.manager import ControlPlane, Options

_STATE: dict[str, object] = {"plane": None, "failed": False, "kept": None}


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> ControlPlane:
    """The whole control plane (etcd, kube-apiserver, controller manager, scheduler, KWOK, KubeRay, CRDs).

    Skips when binaries are missing and Go is absent; a start failure is an error (pytest reports the
    same error for every test that asks for it)."""
    options = Options()
    try:
        for name in options.binaries():
            build.binary_path(name)  # build what is missing (cached), or explain why it cannot be built
    except build.GoToolchainMissing as error:
        pytest.skip(f"control-plane binaries are not built and cannot be: {error}")
    plane = ControlPlane(options).start()
    _STATE["plane"] = plane
    yield plane
    _STATE["plane"] = None
    plane.stop(keep_logs=bool(_STATE["failed"]))
    if _STATE["failed"]:
        _STATE["kept"] = plane.workdir


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A fresh namespace for one test, named after it; deleted (without waiting) afterwards."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    # The ServiceAccount admission plugin refuses pods until the controller creates `default`.
    control_plane.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s",
                          check=False)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    plane = _STATE["plane"]
    if report.failed and plane is not None and "control_plane" in getattr(item, "fixturenames", ()):
        _STATE["failed"] = True
        plane.keep_workdir = True
        dead = ", ".join(c.name for c in plane.dead_components())
        header = f"control plane folder {plane.workdir}" + (f"; EXITED: {dead}" if dead else "")
        report.sections.append(("control plane logs", f"{header}\n{plane.log_tails(25)}"))
    return report


def pytest_terminal_summary(terminalreporter) -> None:
    if _STATE["kept"] is not None:
        terminalreporter.write_line(f"control plane logs, kubeconfig and certificates kept in {_STATE['kept']}")
