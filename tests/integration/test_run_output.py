"""What `forge-replay run` prints, as a user sees it in a terminal 80 columns wide: what is starting until step 1,
a table that does not wrap, and none of Ray's or transformers' noise (issue 18)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tests.integration.test_forge_run import DOUBLE, job_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def test_a_forge_run_says_what_starts_and_prints_no_noise(tmp_path):
    job = job_file(tmp_path, rollouts=2, weight_sync="disk")  # disk: a checkpoint written every step
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "80", "LINES": "40"}  # rich draws as in a terminal
    env.pop("RAY_AUTH_MODE", None)
    done = subprocess.run(
        [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--dumps-root",
         str(tmp_path / "dumps"), "--results", str(tmp_path / "results"),
         "--engine-command", f"{sys.executable} {DOUBLE}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    out = ANSI.sub("\n", done.stdout + done.stderr)
    assert done.returncode == 0, out[-4000:]
    assert "Token authentication is enabled" not in out  # Ray's default for a local cluster, said on every run
    assert "Writing model shards" not in out  # transformers' bar, once per step (disk weight sync)
    assert "starting a local Ray" in out
    assert "starting: the trainer and 2 sglang engine(s)" in out, out[-4000:]
    table = out[out.index("forge-run: forge replay"):out.index("rollouts 2, fallbacks 0")]
    assert max(len(line) for line in table.splitlines()) <= 80, table
