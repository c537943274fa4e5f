"""Peak GPU memory of the builtin trainer on a long-context synthetic dump (skips without CUDA).

One short command on a single H200 (about 2-4 minutes, most of it model init and the first step):

    python benches/gpu_memory_peak.py                       # 4 samples x (1k + 32k) tokens, ~1.7B Qwen3-like
    python benches/gpu_memory_peak.py --response-len 65536 --snapshot

Writes report.json / memory.png (and with --snapshot a CUDA memory snapshot per rank) to --out,
prints the per-step, per-rank CUDA peak allocated/reserved and the overall peak. Debug mode: no
sglang, so this is the trainer's own peak; forge mode adds the engines on top.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from bench_args import non_negative_int, output_dir, positive_int

QWEN3_1_7B_LIKE = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 131072, "rope_theta": 1000000, "tie_word_embeddings": True,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-len", type=positive_int, default=1024)
    parser.add_argument("--response-len", type=positive_int, default=32768)
    parser.add_argument("--samples", type=positive_int, default=4, help="samples per rollout (prompts x 1)")
    parser.add_argument("--rollouts", type=positive_int, default=3)
    parser.add_argument("--layers", type=positive_int, default=QWEN3_1_7B_LIKE["num_hidden_layers"])
    parser.add_argument("--gpus", type=non_negative_int, default=0, help="trainer GPUs (default: all visible)")
    parser.add_argument("--micro-batch-tokens", type=non_negative_int, default=0,
                        help="default: one sample per micro-batch")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--snapshot", action="store_true", help="also write a CUDA memory snapshot per rank")
    parser.add_argument("--out", type=output_dir, default=os.environ.get("OUT", "results/gpu-memory-peak"))
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_memory_peak: skipped, CUDA is not available on this machine")
        return 0
    import ray

    from forge_replay.api import parse_job
    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.dumps.synth import write_synth_dumps
    from forge_replay.runtime.driver import run_job

    gpus = args.gpus or torch.cuda.device_count()
    seq = args.prompt_len + args.response_len
    dumps = os.path.join(args.out, "dumps")
    t0 = time.perf_counter()
    write_synth_dumps(os.path.join(dumps, "long.pt"), 1, args.samples, 1, args.prompt_len, args.response_len,
                      vocab_size=QWEN3_1_7B_LIKE["vocab_size"])
    print(f"machine: {platform.node()}, {torch.cuda.get_device_name(0)} x {gpus}, torch {torch.__version__}")
    print(f"dump: {args.samples} samples x {args.prompt_len}+{args.response_len} tokens "
          f"(written in {time.perf_counter() - t0:.1f}s), replayed {args.rollouts} times (literal path)")
    model = dict(QWEN3_1_7B_LIKE, num_hidden_layers=args.layers)
    doc = {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "gpu-memory-peak"},
        "spec": {
            "replay": {"mode": "debug", "dumps": {"claimName": "bench", "path": "long.pt"},
                       "numRollouts": args.rollouts, "verify": False},
            "model": {"config": model},
            "trainer": {"nodes": 1, "gpusPerNode": gpus, "microBatchTokens": args.micro_batch_tokens or seq,
                        "dtype": args.dtype, "gradientCheckpointing": not args.no_checkpointing,
                        "memorySnapshot": args.snapshot, "learningRate": 1e-6},
        },
    }
    config = RuntimeConfig(job=parse_job(doc), dumps_root=dumps, results_dir=os.path.join(args.out, "results"),
                           model_root=None)
    ray.init(include_dashboard=False, log_to_driver=True)
    try:
        report = run_job(config, show_progress=True)
    finally:
        ray.shutdown()
    for r in report.rollouts:
        ranks = ", ".join(f"rank {m['rank']}: {m['peak_allocated_gib']:.2f}/{m['peak_reserved_gib']:.2f}"
                          for m in r.memory)
        print(f"step {r.step}: {r.step_seconds:.1f}s, {r.tokens} tokens, peak allocated/reserved GiB {ranks}")
    peak = report.summary["memory_peak"]
    print(f"PEAK {peak['peak_allocated_gib']:.2f} GiB allocated, {peak['peak_reserved_gib']:.2f} GiB reserved "
          f"(rank {peak['rank']}, step {peak['step']}); model {report.num_params / 1e9:.2f}B params, "
          f"{args.dtype}, checkpointing {'off' if args.no_checkpointing else 'on'}; report {report.files.get('report')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
