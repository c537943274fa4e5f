"""The trainer on CUDA (skipped without it): NCCL, FSDP2 on GPU, CUDA peaks per rank, memory snapshots."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.ray,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_debug_replay_on_gpus_reports_cuda_peaks_per_rank_and_snapshots(tmp_path):
    import ray

    from forge_replay.api import parse_job
    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples
    from forge_replay.runtime.driver import run_job

    gpus = min(2, torch.cuda.device_count())
    save(tmp_path / "dumps" / "fixed.pt", 0, synth_samples(0, 2, 4, prompt_len=64, response_len=512, vocab_size=1024))
    doc = {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "gpu"},
        "spec": {
            "replay": {"mode": "debug", "dumps": {"claimName": "d", "path": "fixed.pt"}, "numRollouts": 3},
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "vocab_size": 1024}},
            "trainer": {"gpusPerNode": gpus, "microBatchTokens": 1200, "dtype": "bfloat16", "learningRate": 1e-3,
                        "memorySnapshot": True},
        },
    }
    config = RuntimeConfig(job=parse_job(doc), dumps_root=str(tmp_path / "dumps"), results_dir=str(tmp_path / "out"),
                           model_root=None)
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    try:
        report = run_job(config, show_progress=False)
    finally:
        if started:
            ray.shutdown()
    assert report.device == "cuda" and report.world_size == gpus
    for record in report.rollouts:
        assert len(record.memory) == gpus
        for mem in record.memory:
            assert 0 < mem["peak_allocated_gib"] <= mem["peak_reserved_gib"]
    losses = [r.loss for r in report.rollouts]
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert len(report.files["memory_snapshots"]) == gpus
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["summary"]["memory_peak"]["peak_reserved_gib"] is not None
