"""`python benches/gpu_check.py --cpu-smoke` runs every check's code path on CPU, so the GPU check cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "benches" / "gpu_check.py"


def run_check(*args: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, str(CHECK), "--cpu-smoke", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO))
    return done, json.loads((out / "gpu_check.json").read_text())


def test_cpu_smoke_runs_every_check_and_writes_the_json_and_plot(tmp_path):
    done, result = run_check(out=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["ok"] is True and result["mode"] == "cpu-smoke"
    assert set(result["checks"]) == {"memory", "attention", "ipc", "oom"}
    assert all(check["ok"] for check in result["checks"].values())
    assert result["checks"]["oom"]["skipped"] == "no GPU"  # a CUDA out-of-memory needs CUDA: skipped, said so
    assert "oom: skipped = no GPU" in done.stdout

    figures = result["figures"]
    printed = [line for line in done.stdout.splitlines() if line.endswith(("[OK]", "[FAIL]", "[info]"))]
    assert len(printed) == len(figures)  # one line per figure

    # memory: every step of every length compared with the script's own read, through the report's records
    steps = [f for f in figures if f["check"] == "memory" and f["name"].endswith("peak_rss_gib")]
    assert len(steps) == 2 * 3 and all(f["ok"] for f in steps)
    report = result["checks"]["memory"]["report"]
    assert [r["step"] for r in report["rollouts"]] == [1, 2, 3, 4, 5, 6]
    assert [r["tokens"] for r in report["rollouts"]] == [512] * 3 + [1024] * 3
    assert all(r["memory"][0]["peak_rss_gib"] > 0 and r["grad_norm"] > 0 for r in report["rollouts"])
    assert any(f["name"].endswith("tokens/s") and f["value"] > 0 for f in figures)
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # attention: the comparison passed and its leak control was caught
    attention = result["checks"]["attention"]
    assert attention["logits_rel_error"] <= attention["logits_bound"] < attention["leak_control_rel_error"]
    assert attention["sdpa_backends"]  # CPU runs some sdpa kernel; which one is recorded

    # ipc: shared memory on CPU, every tensor bit for bit
    ipc = result["checks"]["ipc"]
    assert ipc["route"] == "shared memory" and len(ipc["sent"]) == len(ipc["received"]) == 6
    assert [d["sha256"] for d in ipc["sent"]] == [d["sha256"] for d in ipc["received"]]
    assert result["blocked_imports"] == ["ray", "sglang"]


def test_a_check_that_breaks_fails_the_command_and_the_others_still_run(tmp_path):
    # 16 tokens per sample cannot hold the smoke's 32-token prompt: the memory check raises
    done, result = run_check("--checks", "memory", "ipc", "--lengths", "16", out=tmp_path)
    assert done.returncode == 1
    assert result["ok"] is False
    assert result["checks"]["memory"]["ok"] is False and "Traceback" in result["checks"]["memory"]["traceback"]
    assert result["checks"]["ipc"]["ok"] is True
    assert "memory: error = ValueError" in done.stdout and "[FAIL]" in done.stdout
