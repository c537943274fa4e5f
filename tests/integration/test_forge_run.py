"""`forge-replay run` in forge mode end to end, as a user runs it: a subprocess with its own local Ray,
the sglang HTTP test double as ``--engine-command``, a tiny model on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.integration.processes import pid_alive, stop_and_wait

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
    "max_position_embeddings": 256,
}


def job_file(tmp_path: Path, mode: str = "forge", ft: dict | None = None, rollouts: int = 3, eval_interval: int = 0,
             weight_sync: str | None = None, nodes: int = 1) -> Path:
    spec: dict = {
        "replay": {"mode": mode, "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"},
                   "numRollouts": rollouts, "evalInterval": eval_interval},
        "model": {"config": TINY_LLAMA},
        "trainer": {"nodes": nodes, "gpusPerNode": 0, "microBatchTokens": 1024, "gradientCheckpointing": False, "dtype": "float32",
                    "nSamplesPerPrompt": 4},
    }
    if mode == "forge":
        spec["rollout"] = {"numGpus": 2, "numGpusPerEngine": 1, "engineArgs": {"mem-fraction-static": "0.5"}}
        if weight_sync:
            spec["rollout"]["weightSync"] = weight_sync
    if ft is not None:
        spec["faultTolerance"] = ft
    path = tmp_path / f"job-{weight_sync or 'auto'}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
                                    "metadata": {"name": f"{mode}-run"}, "spec": spec}))
    return path


def forge_replay_run(tmp_path: Path, job: Path, *, engine_command: bool = True, env: dict | None = None,
                     double_flags: str = ""):
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job), "--synth-missing", "--no-progress",
            "--dumps-root", str(tmp_path / "dumps"), "--results", str(tmp_path / "results")]
    if engine_command:
        argv += ["--engine-command", f"{sys.executable} {DOUBLE} --record-dir {tmp_path / 'double'} {double_flags}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, **(env or {})})


def records(tmp_path: Path) -> dict[int, dict]:
    """Per engine port: its starts, calls and whether it was stopped."""
    out = {}
    directory = tmp_path / "double"
    for start in sorted(directory.glob("starts-*.jsonl")) if directory.exists() else []:
        port = int(start.stem.split("-")[1])
        calls = directory / f"calls-{port}.jsonl"
        out[port] = {
            "starts": [json.loads(line) for line in start.read_text().splitlines()],
            "calls": [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else [],
            "stopped": (directory / f"stop-{port}.json").exists(),
        }
    return out


def pushed_versions(engine: dict) -> list[str]:
    return [c["body"]["weight_version"] for c in engine["calls"] if c["path"] == "/update_weights_from_disk"]


def refused(engine: dict) -> list[tuple[str, int]]:
    """Requests the double answered 404, 405 or 422 (a route or body sglang would not take)."""
    return [(c["path"], c["status"]) for c in engine["calls"] if c["status"] in (404, 405, 422)]


def session_order(engine: dict) -> list[str]:
    """The session and update requests in order, one letter each: B(egin), U(pdate), E(nd)."""
    letters = {"/begin_weight_update": "B", "/update_weights_from_distributed": "U", "/end_weight_update": "E"}
    return [letters[c["path"]] for c in engine["calls"] if c["path"] in letters]


def test_forge_run_keeps_engines_alive_pushes_every_step_and_stops_them(tmp_path):
    result = forge_replay_run(tmp_path, job_file(tmp_path, rollouts=3, eval_interval=3))
    assert result.returncode == 0, result.stderr[-3000:]
    engines = records(tmp_path)
    assert len(engines) == 2
    for engine in engines.values():
        paths = [c["path"] for c in engine["calls"]]
        assert paths[0] == "/health_generate"  # health-checked before the run uses it
        assert pushed_versions(engine) == ["1", "2", "3"]  # one push per training step, advancing
        assert paths.count("/model_info") == 3 and paths.count("/flush_cache") == 3  # every version read back
        assert paths.count("/health_generate") == 2  # start + the eval fleet's self-probe (no FT)
        assert not refused(engine)
        start = engine["starts"][0]
        real_parser = start["sglang_parser"].startswith("real")  # sglang's own parser knows every flag we pass
        assert start["unknown"] == ([] if real_parser else ["--mem-fraction-static", "0.5"])
        assert start["known"]["skip_tokenizer_init"] and start["known"]["dtype"] == "float32"  # the trainer's dtype
        assert {c["body"]["load_format"] for c in engine["calls"]
                if c["path"] == "/update_weights_from_disk"} == {"safetensors"}  # never the server's dummy
        last_call = engine["calls"][-1]["time"]
        assert engine["stopped"] and not pid_alive(engine["starts"][0]["pid"])
        stop = json.loads((tmp_path / "double" / f"stop-{engine['starts'][0]['known']['port']}.json").read_text())
        assert stop["time"] >= last_call  # up until the run ended, stopped afterwards
    # Weights travel through Ray's object store: each engine loads a copy staged on its own node, and the
    # run needs no volume shared between the trainer and the engines.
    staged = {i: {c["body"]["model_path"] for c in e["calls"] if c["path"] == "/update_weights_from_disk"}
              for i, e in enumerate(engines.values())}
    assert all(len(paths) == 3 for paths in staged.values())
    assert not set.intersection(*staged.values())
    assert all("forge-replay-engine-" in path for paths in staged.values() for path in paths)
    assert not (tmp_path / "results" / "weights").exists()
    report = json.loads((tmp_path / "results" / "report.json").read_text())
    assert report["engines"]["engines"] == 2 and report["engines"]["weight_versions"] == ["1", "2", "3"]
    assert report["engines"]["restarts"] == 0 and report["engines"]["eval_self_probes"] == 2
    assert "engines 2, restarts 0, weight versions 1..3 (disk)" in result.stdout + result.stderr


def received_by_version(engine: dict, path: str) -> dict[str, dict]:
    """Per weight version: tensors and sum of |values| the double really received on ``path``, summed over
    the requests (buckets) that made up that version."""
    out: dict[str, dict] = {}
    pending = {"tensors": 0, "abs_sum": 0.0}
    for call in engine["calls"]:
        if call["path"] != path:
            continue
        got = call["body"]["received"]
        pending = {"tensors": pending["tensors"] + got["tensors"], "abs_sum": pending["abs_sum"] + got["abs_sum"]}
        if call["body"].get("weight_version") is not None:
            out[call["body"]["weight_version"]] = pending
            pending = {"tensors": 0, "abs_sum": 0.0}
    return out


def test_distributed_weight_sync_broadcasts_the_same_weights_the_disk_path_loads(tmp_path):
    """weightSync distributed over gloo with two trainer ranks: each engine joins one group, gets every
    parameter by broadcast after every step, and what it receives equals the checkpoint of the disk path."""
    disk_dir, dist_dir = tmp_path / "disk", tmp_path / "distributed"
    disk_dir.mkdir(), dist_dir.mkdir()
    disk = forge_replay_run(disk_dir, job_file(disk_dir, rollouts=2, weight_sync="disk", nodes=2))
    assert disk.returncode == 0, disk.stderr[-3000:]
    dist = forge_replay_run(dist_dir, job_file(dist_dir, rollouts=2, weight_sync="distributed", nodes=2))
    assert dist.returncode == 0, dist.stderr[-3000:]
    disk_engines, dist_engines = list(records(disk_dir).values()), list(records(dist_dir).values())
    expected = received_by_version(disk_engines[0], "/update_weights_from_disk")
    assert list(expected) == ["1", "2"] and expected["1"]["abs_sum"] != expected["2"]["abs_sum"]
    groups = []
    for engine in dist_engines:
        paths = [c["path"] for c in engine["calls"]]
        assert "/update_weights_from_disk" not in paths
        inits = [c["body"] for c in engine["calls"] if c["path"] == "/init_weights_update_group"]
        assert len(inits) == 1 and inits[0]["backend"] == "gloo" and inits[0]["world_size"] == 3
        groups.append((inits[0]["group_name"], inits[0]["rank_offset"]))
        got = received_by_version(engine, "/update_weights_from_distributed")
        assert list(got) == ["1", "2"]  # one push per step, the version set once every bucket arrived
        for version, summary in got.items():
            assert summary["tensors"] == expected[version]["tensors"]
            assert summary["abs_sum"] == pytest.approx(expected[version]["abs_sum"], rel=1e-9)
        assert paths.count("/model_info") == 2 and paths.count("/flush_cache") == 2
        # sglang 0.5.23 takes distributed updates only inside a weight-update session, one per push
        # (python/sglang/srt/managers/scheduler_components/weight_updater.py): every bucket between its begin and end
        assert re.fullmatch("(BU+E){2}", "".join(session_order(engine))), session_order(engine)
        assert not refused(engine)
        assert engine["stopped"] and not pid_alive(engine["starts"][0]["pid"])
    assert sorted(rank for _, rank in groups) == [1, 2] and len({name for name, _ in groups}) == 1
    report = json.loads((dist_dir / "results" / "report.json").read_text())["engines"]
    assert report["weight_sync"] == "distributed" and report["weight_versions"] == ["1", "2"]


def test_distributed_run_against_sglang_0_5_19_goes_on_without_sessions(tmp_path):
    """0.5.19 has no /begin_weight_update (404, python/sglang/srt/entrypoints/http_server.py): each engine is
    asked once, then pushed to without a session; versions are still read back from /model_info."""
    result = forge_replay_run(tmp_path, job_file(tmp_path, rollouts=2, weight_sync="distributed"),
                              double_flags="--sglang-version 0.5.19")
    assert result.returncode == 0, result.stderr[-3000:]
    for engine in records(tmp_path).values():
        paths = [c["path"] for c in engine["calls"]]
        assert refused(engine) == [("/begin_weight_update", 404)]
        assert "/end_weight_update" not in paths and paths.count("/model_info") == 2
        versions = [c["body"]["weight_version"] for c in engine["calls"]
                    if c["path"] == "/update_weights_from_distributed"]
        assert [v for v in versions if v] == ["1", "2"]
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["unsupported_endpoints"] == ["/begin_weight_update"]  # the table says: not served


@pytest.mark.parametrize("weight_sync", ["disk", "distributed"])
def test_forge_run_with_rollout_ft_recovers_an_engine_killed_mid_run(tmp_path, weight_sync):
    ft = {"enabled": True, "components": ["rollout"], "healthCheck": {"intervalSeconds": 1, "timeoutSeconds": 2}}
    result = forge_replay_run(tmp_path, job_file(tmp_path, ft=ft, rollouts=3, weight_sync=weight_sync),
                              env={"FORGE_REPLAY_INJECT_FAULTS": "kill-engine:step=0,engine=1"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "report.json").read_text())["engines"]
    assert report["faults_injected"] == ["kill-engine:step=0,engine=1"]
    assert report["restarts_by_engine"] == [0, 1] and report["health_monitors"] == 1
    engines = records(tmp_path)
    restarted = [e for e in engines.values() if len(e["starts"]) == 2]
    assert len(restarted) == 1
    assert not pid_alive(restarted[0]["starts"][0]["pid"])  # the killed one stayed dead; a new one took over
    push = "/update_weights_from_disk" if weight_sync == "disk" else "/update_weights_from_distributed"
    for engine in engines.values():
        versions = [c["body"]["weight_version"] for c in engine["calls"] if c["path"] == push]
        assert [v for v in versions if v][-1] == "3"  # the recovered engine caught up with the latest weights
        assert engine["stopped"] and not any(pid_alive(s["pid"]) for s in engine["starts"])
    if weight_sync == "distributed":  # the restart formed a new weight group; the survivor left the old one
        survivor = next(e for e in engines.values() if len(e["starts"]) == 1)
        joined = [c["body"]["group_name"] for c in survivor["calls"] if c["path"] == "/init_weights_update_group"]
        left = [c["body"]["group_name"] for c in survivor["calls"] if c["path"] == "/destroy_weights_update_group"]
        assert len(joined) == 2 and joined[0] != joined[1] and left == joined[:1]


def test_an_eval_fleet_that_fails_its_self_probe_skips_the_eval_and_the_run_goes_on(tmp_path):
    """No FT: the eval fleet probes its engines before each eval. Engines answering /health_generate after the
    probe's timeout skip that eval (in the report, with the reason), before training (evalBeforeTrain) and
    after rollout 1, instead of failing the job, as miles skips an eval point."""
    job = job_file(tmp_path, rollouts=2, eval_interval=2, ft={"enabled": False, "healthCheck": {"timeoutSeconds": 1}})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["replay"]["evalBeforeTrain"] = True
    job.write_text(yaml.safe_dump(doc))
    result = forge_replay_run(tmp_path, job, double_flags="--health-generate-seconds 2")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "results" / "report.json").read_text())
    assert [(e["eval_id"], e["after_rollout_id"]) for e in report["evals"]] == [(0, None), (1, 1)]
    for evaluated in report["evals"]:
        why = f"eval {evaluated['eval_id']}: the eval fleet's self-probe found unhealthy engines"
        assert why in evaluated["skipped"]
        assert evaluated["num_samples"] == 0 and evaluated["reward_mean"] is None
    assert report["summary"]["evals_skipped"] == 2 and report["completed"] == 2 and report["error"] is None
    assert report["engines"]["weight_versions"] == ["1", "2"]  # training and the weight pushes went on
    assert "eval 0 (before training): SKIPPED" in result.stdout + result.stderr


def test_debug_run_with_train_ft_never_starts_an_engine_process(tmp_path):
    ft = {"enabled": True, "components": ["train"]}
    result = forge_replay_run(tmp_path, job_file(tmp_path, mode="debug", ft=ft, rollouts=2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "double").exists()  # not one engine process, even with --engine-command given
    assert json.loads((tmp_path / "results" / "report.json").read_text())["engines"] is None


def test_forge_run_without_sglang_or_engine_command_fails_fast(tmp_path):
    try:
        import sglang  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("sglang is installed here: forge mode can start engines without --engine-command")
    result = forge_replay_run(tmp_path, job_file(tmp_path), engine_command=False)
    assert result.returncode == 2
    assert "sglang is not installed" in result.stderr and "--engine-command" in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("signame, code, said", [("SIGTERM", 143, "terminated (SIGTERM)"),
                                                ("SIGINT", 130, "interrupted (Ctrl-C)")])
def test_a_stop_signal_mid_run_stops_the_engines_and_keeps_the_report(tmp_path, signame, code, said):
    """SIGTERM (what Kubernetes and `timeout` send) and Ctrl-C unwind the run: engines gone, steps kept."""
    import time

    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job_file(tmp_path, rollouts=200)), "--synth-missing",
            "--no-progress", "--dumps-root", str(tmp_path / "dumps"), "--results", str(tmp_path / "results"),
            "--engine-command", f"{sys.executable} {DOUBLE} --record-dir {tmp_path / 'double'}"]
    run = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any(pushed_versions(e) for e in records(tmp_path).values()):
        assert run.poll() is None, run.communicate()[1][-3000:]
        time.sleep(0.5)
    stderr = stop_and_wait(run, signame, 120)
    assert run.returncode == code, stderr[-3000:]
    assert f"{said}; engines and trainer stopped" in stderr
    engines = records(tmp_path)
    assert engines and all(e["stopped"] and not pid_alive(e["starts"][0]["pid"]) for e in engines.values())
    report = json.loads((tmp_path / "results" / "report.json").read_text())
    assert 1 <= len(report["rollouts"]) < 200


def cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(cuda_gpus() < 2, reason="needs 2 CUDA GPUs (one trainer rank, one engine)")
def test_distributed_weight_sync_over_nccl_on_gpus(tmp_path):
    """auto on GPUs: trainer rank 0 broadcasts over NCCL to an engine on its own GPU; what it received
    equals what the disk path loads (GPU kernels may differ run to run: a loose tolerance)."""
    runs = {}
    for weight_sync in ("disk", "auto"):
        directory = tmp_path / weight_sync
        directory.mkdir()
        path = job_file(directory, rollouts=2, weight_sync=weight_sync)
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["trainer"]["gpusPerNode"] = 1
        doc["spec"]["rollout"].update(numGpus=1, numGpusPerEngine=1)
        path.write_text(yaml.safe_dump(doc))
        result = forge_replay_run(directory, path)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[weight_sync] = list(records(directory).values())[0]
    expected = received_by_version(runs["disk"], "/update_weights_from_disk")
    got = received_by_version(runs["auto"], "/update_weights_from_distributed")
    init = next(c["body"] for c in runs["auto"]["calls"] if c["path"] == "/init_weights_update_group")
    assert init["backend"] == "nccl" and list(got) == list(expected) == ["1", "2"]
    for version, summary in got.items():
        assert summary["tensors"] == expected[version]["tensors"]
        assert summary["abs_sum"] == pytest.approx(expected[version]["abs_sum"], rel=1e-4)
