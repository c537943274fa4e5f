"""Conformance to sglang's own code: these tests use the installed sglang (tests/conformance/requirements.txt,
installed by scripts/test), never our reading of it. Without sglang they are skipped, saying so."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.doubles import real_sglang


def pytest_collection_modifyitems(items):
    if real_sglang.available():
        return
    skip = pytest.mark.skip(reason="sglang is not installed: pip install --no-deps -r tests/conformance/requirements.txt "
                                   "(scripts/test does)")
    for item in items:
        if "tests/conformance/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
    "max_position_embeddings": 256,
}

RECORDED_RUNS = {
    # weightSync disk, rollout FT on: the health monitor probes every second.
    "disk": {"weightSync": "disk", "faultTolerance": {"enabled": True, "components": ["rollout"],
                                                      "healthCheck": {"intervalSeconds": 1}}},
    # weightSync distributed: the weight group over gloo, sessions, buckets.
    "distributed": {"weightSync": "distributed"},
}
"""The forge runs on CPU whose requests to the engines the conformance tests read (``model.config`` jobs)."""

STEPS = 3


@dataclass
class RecordedRun:
    """One ``forge-replay run`` against the double (sglang's real parser and process group through
    tests/doubles/real_sglang.py), with what each engine was started with and sent."""

    result: subprocess.CompletedProcess
    engines: dict[int, dict] = field(default_factory=dict)
    """Per port: ``starts`` (start records) and ``calls`` (one per request: method, path, status, body)."""
    report: dict = field(default_factory=dict)


def start_forge_job(work: Path, name: str, extra: dict) -> subprocess.Popen:
    """Start one ``forge-replay run`` of the tiny forge job against the double; :func:`collect_run` reads it."""
    rollout = {"numGpus": 2, "numGpusPerEngine": 1, "weightSync": extra["weightSync"],
               "engineArgs": {"mem-fraction-static": "0.5", "context-length": "256"}}
    spec = {
        "replay": {"mode": "forge", "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"},
                   "numRollouts": STEPS},
        "model": {"config": TINY_CONFIG},
        "trainer": {"nodes": 1, "gpusPerNode": 0, "microBatchTokens": 1024, "gradientCheckpointing": False,
                    "dtype": "float32", "nSamplesPerPrompt": 4},
        "rollout": rollout,
    }
    if "faultTolerance" in extra:
        spec["faultTolerance"] = extra["faultTolerance"]
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
                                   "metadata": {"name": f"conformance-{name}"}, "spec": spec}))
    double = work / "double"
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--no-progress",
            "--dumps-root", str(work / "dumps"), "--results", str(work / "results"),
            "--engine-command", f"{sys.executable} {DOUBLE} --record-dir {double}"]
    # Output to files, not pipes: a run that is not being read must not block on a full pipe.
    with open(work / "stdout.log", "w") as stdout, open(work / "stderr.log", "w") as stderr:
        return subprocess.Popen(argv, stdout=stdout, stderr=stderr, cwd=work)


def collect_run(work: Path, process: subprocess.Popen, timeout: float = 600) -> RecordedRun:
    """Wait for a run of :func:`start_forge_job` and read what the engines were started with and sent."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    stdout, stderr = ((work / name).read_text(errors="replace") for name in ("stdout.log", "stderr.log"))
    run = RecordedRun(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    double = work / "double"
    for starts in sorted(double.glob("starts-*.jsonl")):
        port = int(starts.stem.split("-")[1])
        calls = double / f"calls-{port}.jsonl"
        run.engines[port] = {
            "starts": [json.loads(line) for line in starts.read_text().splitlines()],
            "calls": [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else [],
        }
    report = work / "results" / "report.json"
    run.report = json.loads(report.read_text()) if report.exists() else {}
    return run


def _as_json(run: RecordedRun) -> dict:
    result = run.result
    return {"args": result.args, "returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
            "engines": run.engines, "report": run.report}


def _from_json(data: dict) -> RecordedRun:
    result = subprocess.CompletedProcess(data["args"], data["returncode"], data["stdout"], data["stderr"])
    return RecordedRun(result, {int(port): engine for port, engine in data["engines"].items()}, data["report"])


@pytest.fixture(scope="session")
def recorded_runs(tmp_path_factory) -> dict[str, RecordedRun]:
    """The :data:`RECORDED_RUNS`, each run once per pytest run, side by side (each spends most of its minute waiting
    on Ray's and the engines' start-up). Under pytest-xdist the first worker that needs them runs them and the
    others read what it recorded, under a lock in the run's shared temporary folder."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # <basetemp>/popen-gwN: the parent is the whole run's
    base = shared / "recorded-runs"
    with open(shared / "recorded-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = base / "runs.json"
        if not recorded.exists():
            base.mkdir(exist_ok=True)
            started = {name: start_forge_job(base / name, name, extra) for name, extra in RECORDED_RUNS.items()}
            runs = {name: collect_run(base / name, process) for name, process in started.items()}
            recorded.write_text(json.dumps({name: _as_json(run) for name, run in runs.items()}))
        return {name: _from_json(data) for name, data in json.loads(recorded.read_text()).items()}
