"""Benchmark of the builtin trainer on CPU (local Ray): time to first step, data-wait share, tokens/s.

Synthesizes slime-format dumps of the given shape, then replays them in debug mode twice: with the
rollout prefetch (the default) and without it, and prints one line of figures per run.

    python benches/bench_trainer.py                         # defaults: 6 rollouts x 16 samples x 512 tokens
    python benches/bench_trainer.py --response-len 2048 --hidden 256 --layers 4

Results go in docs/benchmarks.md ("Trainer"), with the machine and the date.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

from bench_args import positive_int


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=positive_int, default=6)
    parser.add_argument("--prompts", type=positive_int, default=4)
    parser.add_argument("--samples-per-prompt", type=positive_int, default=4)
    parser.add_argument("--prompt-len", type=positive_int, default=128)
    parser.add_argument("--response-len", type=positive_int, default=384)
    parser.add_argument("--hidden", type=positive_int, default=128)
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--vocab", type=positive_int, default=2048)
    parser.add_argument("--ranks", type=positive_int, default=1, help="CPU trainer ranks (spec.trainer.nodes)")
    parser.add_argument("--micro-batch-tokens", type=positive_int, default=4096)
    parser.add_argument("--no-compare", action="store_true", help="only the prefetch run")
    args = parser.parse_args()

    import ray
    import torch

    from forge_replay.api import parse_job
    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.dumps.synth import write_synth_dumps
    from forge_replay.runtime.driver import run_job

    work = tempfile.mkdtemp(prefix="bench-trainer-")
    t0 = time.perf_counter()
    write_synth_dumps(os.path.join(work, "dumps", "rollout_{rollout_id}.pt"), args.rollouts, args.prompts,
                      args.samples_per_prompt, args.prompt_len, args.response_len, vocab_size=args.vocab)
    synth_s = time.perf_counter() - t0
    tokens_per_rollout = args.prompts * args.samples_per_prompt * (args.prompt_len + args.response_len)
    doc = {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": "bench-trainer"},
        "spec": {
            "replay": {"mode": "debug", "dumps": {"claimName": "bench", "path": "rollout_{rollout_id}.pt"},
                       "numRollouts": args.rollouts, "verify": False},
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "hidden_size": args.hidden, "intermediate_size": 4 * args.hidden,
                                 "num_hidden_layers": args.layers, "num_attention_heads": max(1, args.hidden // 32),
                                 "num_key_value_heads": max(1, args.hidden // 64), "vocab_size": args.vocab,
                                 "max_position_embeddings": args.prompt_len + args.response_len}},
            "trainer": {"nodes": args.ranks, "gpusPerNode": 0, "microBatchTokens": args.micro_batch_tokens,
                        "dtype": "float32", "learningRate": 1e-4, "gradientCheckpointing": True},
        },
    }
    config = RuntimeConfig(job=parse_job(doc), dumps_root=os.path.join(work, "dumps"),
                           results_dir=os.path.join(work, "results"), model_root=None)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"ray {ray.__version__}, python {sys.version.split()[0]}")
    print(f"data: {args.rollouts} rollouts x {args.prompts * args.samples_per_prompt} samples x "
          f"{args.prompt_len}+{args.response_len} tokens = {tokens_per_rollout} tokens/rollout (synth {synth_s:.1f}s)")
    print(f"model: llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; {args.ranks} CPU rank(s), "
          f"micro-batches of <= {args.micro_batch_tokens} tokens")
    ray.init(num_cpus=max(os.cpu_count() or 1, args.ranks), include_dashboard=False, log_to_driver=False)
    try:
        for prefetch in (True,) if args.no_compare else (True, False):
            report = run_job(config, show_progress=False, prefetch=prefetch,
                             console=__import__("rich.console").console.Console(file=open(os.devnull, "w")))
            s = report.summary
            steady = report.rollouts[1:] or report.rollouts
            steady_wait = sum(r.data_wait_seconds for r in steady)
            steady_step = sum(r.step_seconds for r in steady)
            print(f"prefetch={'on ' if prefetch else 'off'}: time to first step {s['time_to_first_step_seconds']:.1f}s, "
                  f"step {steady_step / len(steady):.2f}s, data wait {1000 * steady_wait / len(steady):.1f} ms/step "
                  f"= {100 * steady_wait / (steady_wait + steady_step):.2f}% of step time (after step 0), "
                  f"{s['tokens_per_second']:.0f} tokens/s, peak RSS {s['memory_peak']['peak_rss_gib']:.2f} GiB")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
