"""`python -m tests.cluster up` as a user runs it: export lines that work, Ctrl-C leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cluster import build
from tests.cluster.manager import REPO_ROOT

pytestmark = pytest.mark.cluster

PARTS = ["etcd", "kube-apiserver", "kubectl", "kwok", "kwok-stages"]


@pytest.fixture
def built_minimal_parts():
    try:
        for name in PARTS:
            build.binary_path(name)
    except build.GoToolchainMissing as error:
        pytest.skip(str(error))


def test_up_prints_working_exports_and_ctrl_c_stops_everything(built_minimal_parts, tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster", "up", "--no-controller-manager", "--no-scheduler", "--no-kuberay",
         "--gpu-nodes=1", "--cpu-nodes=0"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    exports: dict[str, str] = {}
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while "KUBECONFIG" not in exports or "PATH" not in exports:
            assert time.monotonic() < deadline, "no export lines within 120s:\n" + "".join(seen)
            line = process.stdout.readline()
            assert line, "`up` exited before printing the export lines:\n" + "".join(seen)
            seen.append(line)
            if line.startswith("export "):
                key, value = line[len("export "):].strip().split("=", 1)
                exports[key] = value
        children = psutil.Process(process.pid).children(recursive=True)
        assert {Path(c.exe()).name for c in children} >= {"etcd", "kube-apiserver", "kwok"}

        env = {**os.environ, "KUBECONFIG": exports["KUBECONFIG"],
               "PATH": exports["PATH"].replace("$PATH", os.environ["PATH"])}
        ready = subprocess.run(["kubectl", "get", "--raw", "/readyz"], env=env, capture_output=True, text=True)
        assert ready.stdout.strip() == "ok", ready.stderr
        assert Path(subprocess.run(["which", "kubectl"], env=env, capture_output=True, text=True).stdout.strip()
                    ).parent == build.bin_dir()
        nodes = subprocess.run(["kubectl", "get", "nodes", "-o", "name"], env=env, capture_output=True, text=True)
        assert nodes.stdout.split() == ["node/gpu-node-0"], nodes.stderr

        process.send_signal(signal.SIGINT)
        remaining, _ = process.communicate(timeout=60)
        assert process.returncode == 0, "".join(seen) + remaining
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"stray processes after Ctrl-C: {[p.pid for p in alive]}"
        assert not Path(exports["KUBECONFIG"]).exists()  # the throwaway folder is removed on a clean stop
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
