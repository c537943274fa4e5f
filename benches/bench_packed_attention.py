"""Packed micro-batches: transformers' sdpa (a [T, T] block mask) against forge-replay's per-sample attention.

For each micro-batch size, runs one forward + backward of a small Llama over a packed sequence of equal
samples in a fresh process per implementation (so peak RSS is that run's own) and prints time and peak RSS.
On GPUs the mask is what matters: T x T bytes (4 GiB at 64k tokens) held through the step.

    python benches/bench_packed_attention.py                      # 4k, 8k, 16k tokens, 8 samples each
    python benches/bench_packed_attention.py --tokens 32768 --samples 16

Results go in docs/benchmarks.md ("Trainer"), with the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench_args import positive_int

CHILD = r"""
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
from forge_replay.runtime.trainer.batching import segment_bounds
from forge_replay.dumps.model_config import config_from_dict
from forge_replay.runtime.trainer.model import attention_for
tokens, samples, impl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
config = config_from_dict({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
                           "max_position_embeddings": tokens})
attention = attention_for(config) if impl == "packed" else "sdpa"
model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
per = tokens // samples
ids = torch.randint(0, 1024, (1, per * samples))
positions = torch.arange(per).repeat(samples).unsqueeze(0)
extra = {}
if impl == "packed":
    bounds = torch.tensor(segment_bounds(positions[0].tolist()), dtype=torch.int32)
    extra = dict(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=per, max_length_k=per)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
model(input_ids=ids, position_ids=positions, use_cache=False, **extra).logits.float().mean().backward()
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--samples", type=positive_int, default=8)
    args = parser.parse_args()
    if any(tokens < args.samples for tokens in args.tokens):
        parser.error(f"--tokens must be at least --samples ({args.samples}): each sample needs a token")
    print(f"{'tokens':>7} {'attention':>10} {'fwd+bwd s':>10} {'RSS growth MiB':>15}")
    for tokens in args.tokens:
        for impl in ("sdpa", "packed"):
            done = subprocess.run([sys.executable, "-c", CHILD, str(tokens), str(args.samples), impl],
                                  capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{tokens:>7} {impl:>10} {result['seconds']:>10.2f} {result['rss_growth_mib']:>15.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
