"""The tensor weight sync (``/update_weights_from_tensor``) with real processes: the double opening payloads,
trainer ranks on a local Ray pushing every bucket to their engines (CPU: shared-memory files stand in for
CUDA IPC handles), and a colocated forge run on GPUs (skipped without CUDA)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from forge_replay.runtime.engines.http import engine_call
from forge_replay.runtime.ports import free_port
from forge_replay.runtime.weights.calls import WeightSyncError, begin_weight_update, post_weight_request
from forge_replay.runtime.weights.ipc import serialize_named_tensors, update_request_body
from forge_replay.runtime.weights.tensor import EngineFeed

DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "sglang_double.py"
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
    "max_position_embeddings": 256,
}


@pytest.fixture
def start_double(tmp_path):
    """Start sglang double processes (``--tp-size N``); each answers /health before it is returned, with a
    weight-update session open (sglang 0.5.23 refuses /update_weights_from_tensor outside one:
    python/sglang/srt/managers/scheduler_components/weight_updater.py)."""
    started: list[subprocess.Popen] = []

    def start(tp_size: int = 1, *extra: str) -> tuple[str, Path]:
        port, records = free_port(), tmp_path / "double"
        proc = subprocess.Popen(
            [sys.executable, str(DOUBLE), "--port", str(port), "--model-path", "m", "--tp-size", str(tp_size),
             "--skip-tokenizer-init", "--record-dir", str(records), *extra],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180  # with sglang installed the double imports sglang's own parser
        while True:
            try:
                engine_call(url, "/health", timeout_s=2)
                begin_weight_update(url)
                return url, records / f"calls-{port}.jsonl"
            except Exception:  # noqa: BLE001 - not listening yet
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the double did not start: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.1)

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def tensor_calls(log: Path) -> list[dict]:
    return [c["body"] for c in map(json.loads, log.read_text().splitlines()) if c["path"] == "/update_weights_from_tensor"]


def weights(scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [("model.embed_tokens.weight", scale * torch.randn(8, 4, generator=gen)),
            ("model.norm.weight", torch.ones(4, dtype=torch.bfloat16))]


# -------------------------------------------------------------------------------------- the double alone


def test_the_double_opens_every_tp_entry_and_records_what_arrived(start_double):
    url, log = start_double(tp_size=2)
    first, second = weights(), weights()
    body = update_request_body([serialize_named_tensors(first), serialize_named_tensors(second)],
                               flush_cache=True, weight_version="7")
    answer = post_weight_request(url, "/update_weights_from_tensor", body, "a test push")
    assert engine_call(url, "/model_info")["weight_version"] == "7"
    received = answer["received"]
    assert received["names"] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert received["shapes"] == [[8, 4], [4]] and received["dtypes"] == ["float32", "bfloat16"]
    assert received["devices"] == ["cpu", "cpu"] and received["entries"] == 2
    expected = sum(float(t.double().abs().sum()) for _, t in first)
    assert received["abs_sums"] == [pytest.approx(expected, rel=1e-12)] * 2
    assert tensor_calls(log)[0]["received"] == received  # in the call log too


def test_the_double_refuses_a_malicious_entry_a_wrong_count_and_a_released_memory(start_double, tmp_path):
    url, _ = start_double(1, "--enable-memory-saver")  # without it a release frees nothing
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    evil = base64.b64encode(pickle.dumps([("w", Evil())])).decode()
    with pytest.raises(WeightSyncError, match="TP rank 0's entry refused: refused global posix.system"):
        post_weight_request(url, "/update_weights_from_tensor",
                            update_request_body([evil], flush_cache=False, weight_version="1"), "evil")
    assert not marker.exists()
    payload = serialize_named_tensors(weights())
    with pytest.raises(WeightSyncError, match=r"one entry per TP rank \(1\), got 2"):
        post_weight_request(url, "/update_weights_from_tensor",
                            update_request_body([payload, payload], flush_cache=False, weight_version="1"), "two")
    engine_call(url, "/release_memory_occupation", method="POST", body={})
    with pytest.raises(WeightSyncError, match="memory released"):
        post_weight_request(url, "/update_weights_from_tensor",
                            update_request_body([payload], flush_cache=False, weight_version="1"), "released")
    assert engine_call(url, "/model_info")["weight_version"] == "default"


# ------------------------------------------------------------------------ trainer ranks on a local Ray (CPU)


@pytest.fixture
def cpu_trainer(local_ray):
    """Two CPU trainer ranks (gloo, FSDP2) holding a tiny Llama."""
    from forge_replay.runtime.placement import place_trainer
    from forge_replay.runtime.trainer.rank import TrainerGroup, TrainerSettings

    settings = TrainerSettings(world_size=2, gpus_per_node=0, nodes=2, micro_batch_tokens=1024,
                               gradient_checkpointing=False, dtype="float32", learning_rate=1e-3, clip_eps=0.2,
                               clip_eps_high=0.2, seed=1, memory_snapshot=False)
    placement = place_trainer(settings, fixed_cluster=True)
    group = TrainerGroup(settings, placement)
    try:
        group.setup(dict(TINY_LLAMA))
        yield group
    finally:
        group.shutdown()
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(placement)


@pytest.mark.ray
@pytest.mark.slow
def test_trainer_ranks_push_every_bucket_to_the_engines_they_feed(cpu_trainer, start_double):
    """Engine A (TP 2) is fed by ranks 1 then 0, engine B (TP 1) by rank 0: each bucket reaches both, posted by
    the engine's first rank, the version and the cache flush riding on the last bucket only."""
    import ray

    from forge_replay.runtime.weights.distributed import plan_buckets

    (url_a, log_a), (url_b, log_b) = start_double(tp_size=2), start_double(tp_size=1)
    metas = cpu_trainer.weight_metadata()
    buckets = plan_buckets(metas, bucket_bytes=40_000)
    assert len(buckets) >= 3  # several buckets, so the per-bucket barrier is exercised
    feeds = [EngineFeed(url_a, (1, 0)), EngineFeed(url_b, (0,))]

    sent = ray.get(cpu_trainer.update_weights_from_tensor_async(buckets, feeds, "1", 60.0))

    assert [s["posts"] for s in sent] == [len(buckets), len(buckets)]  # rank 0 posts to B, rank 1 to A
    expected_sum = cpu_trainer.parameter_checksum()
    assert [s["tensors"] for s in sent] == [len(metas), len(metas)]
    for log, entries in ((log_a, 2), (log_b, 1)):
        calls = tensor_calls(log)
        assert len(calls) == len(buckets)
        assert [c["weight_version"] for c in calls] == [None] * (len(buckets) - 1) + ["1"]
        assert [c["flush_cache"] for c in calls] == [False] * (len(buckets) - 1) + [True]
        assert all(c["load_format"] is None and c["received"]["entries"] == entries for c in calls)
        assert [n for c in calls for n in c["received"]["names"]] == [m.name for m in metas]
        assert [s for c in calls for s in c["received"]["shapes"]] == [list(m.shape) for m in metas]
        assert sum(c["received"]["abs_sum"] for c in calls) == pytest.approx(expected_sum, rel=1e-9)
        for call in calls:  # every TP rank's entry holds the same full tensors
            assert call["received"]["abs_sums"] == [pytest.approx(call["received"]["abs_sum"])] * entries
    assert engine_call(url_a, "/model_info")["weight_version"] == "1"


@pytest.mark.ray
@pytest.mark.slow
def test_an_engine_that_refuses_fails_every_rank_with_its_address(cpu_trainer, start_double):
    import ray

    from forge_replay.runtime.weights.distributed import plan_buckets

    url_ok, _ = start_double(tp_size=1)
    url_bad, _ = start_double(1, "--missing-endpoint", "/update_weights_from_tensor")
    buckets = plan_buckets(cpu_trainer.weight_metadata(), bucket_bytes=40_000)
    refs = cpu_trainer.update_weights_from_tensor_async(
        buckets, [EngineFeed(url_ok, (0,)), EngineFeed(url_bad, (1,))], "1", 60.0)
    for ref in refs:  # both ranks stop after the first bucket, nobody waits in a collective
        with pytest.raises(ray.exceptions.RayTaskError, match=f"engine {url_bad} refused bucket 1/"):
            ray.get(ref, timeout=120)
    # the group is still usable: the next push (e.g. after the engine was replaced) goes through
    sent = ray.get(cpu_trainer.update_weights_from_tensor_async(buckets, [EngineFeed(url_ok, (0,))], "2", 60.0))
    assert sent[0]["posts"] == len(buckets)


# ---------------------------------------------------------------------------------- colocated run on GPUs


def gpu_job(tmp_path: Path, weight_sync: str, gpus: int) -> Path:
    spec = {
        "replay": {"mode": "forge", "dumps": {"claimName": "dumps", "path": "run/rollout_{rollout_id}.pt"},
                   "numRollouts": 2},
        "model": {"config": TINY_LLAMA},
        "trainer": {"gpusPerNode": gpus, "microBatchTokens": 1024, "gradientCheckpointing": False,
                    "dtype": "float32", "learningRate": 1e-3, "nSamplesPerPrompt": 4},
        "rollout": {"numGpus": gpus, "numGpusPerEngine": gpus, "colocate": True, "weightSync": weight_sync},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
                                    "metadata": {"name": f"colocated-{weight_sync}"}, "spec": spec}))
    return path


def run_colocated(tmp_path: Path, weight_sync: str, gpus: int) -> list[dict]:
    tmp_path.mkdir()
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(gpu_job(tmp_path, weight_sync, gpus)),
            "--synth-missing", "--no-progress", "--dumps-root", str(tmp_path / "dumps"),
            "--results", str(tmp_path / "results"),
            "--engine-command", f"{sys.executable} {DOUBLE} --record-dir {tmp_path / 'double'}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = sorted((tmp_path / "double").glob("calls-*.jsonl"))
    assert len(logs) == 1
    return [json.loads(line) for line in logs[0].read_text().splitlines()]


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_colocated_forge_run_hands_each_step_to_the_engine_as_cuda_tensors(tmp_path):
    """One engine over all (at most 2) GPUs, colocated: one tensor push per step with the versions advancing,
    CUDA tensors opened on the engine's side, and what it got equals what the disk path loads."""
    gpus = min(2, torch.cuda.device_count())
    disk = run_colocated(tmp_path / "disk", "disk", gpus)
    tensor = run_colocated(tmp_path / "tensor", "tensor", gpus)
    expected = {c["body"]["weight_version"]: c["body"]["received"] for c in disk
                if c["path"] == "/update_weights_from_disk"}
    assert list(expected) == ["1", "2"]
    pushes = [c["body"] for c in tensor if c["path"] == "/update_weights_from_tensor"]
    assert [p["weight_version"] for p in pushes] == ["1", "2"]  # one bucket per step: one push, version on it
    assert "/update_weights_from_disk" not in {c["path"] for c in tensor}
    for push in pushes:
        got = push["received"]
        assert got["entries"] == gpus and all(d.startswith("cuda:") for d in got["devices"])
        assert got["tensors"] == expected[push["weight_version"]]["tensors"]
        # two runs on GPUs: only non-deterministic kernels (atomics) may move the sums
        assert got["abs_sum"] == pytest.approx(expected[push["weight_version"]]["abs_sum"], rel=1e-4)
    assert pushes[0]["received"]["abs_sum"] != pushes[1]["received"]["abs_sum"]
