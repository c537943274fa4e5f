"""Weight sync per training step in forge mode on CPU: the disk path against the distributed path (gloo).

Runs ``forge-replay run`` twice on the same job (forge mode, two engines: the sglang HTTP test double,
which really reads the checkpoint / really receives every broadcast tensor), once per
``spec.rollout.weightSync``, and prints the seconds each step's push took (``weight_sync_seconds`` in
report.json: the whole sync, version checks included), and the bytes per step.

    python benches/bench_weight_sync.py                          # ~66M parameters (265 MB in float32)
    python benches/bench_weight_sync.py --hidden 256 --layers 2  # quick

Results go in docs/benchmarks.md ("Weight sync"), with the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench_args import choices_list, positive_int

DOUBLE = Path(__file__).resolve().parents[1] / "tests" / "doubles" / "sglang_double.py"


def job(args: argparse.Namespace, weight_sync: str) -> dict:
    hidden = args.hidden
    return {
        "apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob", "metadata": {"name": f"bench-{weight_sync}"},
        "spec": {
            "replay": {"mode": "forge", "dumps": {"claimName": "bench", "path": "rollout_{rollout_id}.pt"},
                       "numRollouts": args.rollouts},
            "model": {"config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
                                 "intermediate_size": 4 * hidden, "num_hidden_layers": args.layers,
                                 "num_attention_heads": max(1, hidden // 64), "num_key_value_heads": max(1, hidden // 128),
                                 "vocab_size": args.vocab, "max_position_embeddings": 512}},
            "trainer": {"nodes": args.ranks, "gpusPerNode": 0, "microBatchTokens": 4096, "dtype": "float32",
                        "gradientCheckpointing": False, "nSamplesPerPrompt": 4},
            "rollout": {"numGpus": args.engines, "numGpusPerEngine": 1, "weightSync": weight_sync},
        },
    }


def run(args: argparse.Namespace, weight_sync: str, work: Path) -> dict:
    directory = work / weight_sync
    directory.mkdir(parents=True)
    job_file = directory / "job.yaml"
    job_file.write_text(yaml.safe_dump(job(args, weight_sync)))
    argv = [sys.executable, "-m", "forge_replay.cli", "run", str(job_file), "--synth-missing", "--no-progress",
            "--dumps-root", str(directory / "dumps"), "--results", str(directory / "results"),
            "--engine-command", f"{sys.executable} {DOUBLE}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"{weight_sync}: forge-replay run failed:\n{done.stderr[-3000:]}")
    return json.loads((directory / "results" / "report.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=positive_int, default=512)
    parser.add_argument("--layers", type=positive_int, default=8)
    parser.add_argument("--vocab", type=positive_int, default=32000)
    parser.add_argument("--rollouts", type=positive_int, default=4)
    parser.add_argument("--ranks", type=positive_int, default=1, help="CPU trainer ranks (spec.trainer.nodes)")
    parser.add_argument("--engines", type=positive_int, default=2)
    parser.add_argument("--paths", type=choices_list(("disk", "distributed", "auto")), default="disk,distributed",
                        help="spec.rollout.weightSync values to compare (tensor needs colocated GPUs)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"{args.engines} engine(s), {args.ranks} trainer rank(s), {args.rollouts} steps")
    for path in args.paths:
        report = run(args, path, work)
        params = report["num_params"]
        seconds = [r["weight_sync_seconds"] for r in report["rollouts"]][1:] or [report["rollouts"][0]["weight_sync_seconds"]]
        step = statistics.fmean(r["step_seconds"] for r in report["rollouts"][1:] or report["rollouts"])
        mean = statistics.fmean(seconds)
        megabytes = params * 4 / 1e6
        print(f"{path:12s} params {params / 1e6:.1f}M ({megabytes:.0f} MB float32): sync {mean:.2f} s/step "
              f"(min {min(seconds):.2f}, max {max(seconds):.2f}; steps after the first), "
              f"{megabytes * args.engines / mean:.0f} MB/s to {args.engines} engine(s); train step {step:.2f} s; "
              f"path used: {report['engines']['weight_sync']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
