"""`dumps verify` against the safe load, torch.load and a raw read of the same files, in seconds per GB (issue 27).

Writes synthesized slime-format dumps as `forge-replay dumps synth` does (256 samples per rollout: 32 prompts x 8,
raw rewards, rollout log probs, token ids from a 151,936-word vocabulary) at two lengths: 8k tokens (1,024 prompt +
7,168 response, about 25 MB a file) and 64k tokens (8,192 + 57,344, about 200 MB a file), then times, over the same
files with a warm page cache, in interleaved rounds (best round kept):

- raw read of the bytes;
- ``torch.load(weights_only=False)`` (unsafe: runs pickled code), the reference of the 1.2x target;
- the safe load as verify does it (``forge_replay.dumps.load``: the allowlist unpickler, then Samples);
- verify with one worker (``verify_dumps(..., jobs=1)``: the safe load and the trainer's conversion of every sample
  under a Qwen3-sized model's limits), and with ``--jobs`` worker processes (default: the usable CPUs).

Also the start-up of `forge-replay dumps verify` (a one-sample dump, a config dict for the model's limits) against
``python -c "import torch"``: the target is at most 1 s more.

Each figure is printed with its CPU time (this process and the worker processes it waited for) beside the wall time:
on a shared, loaded box CPU time is what other jobs disturb least.

    python benches/bench_verify.py                     # 4 files of 8k tokens, 2 of 64k
    python benches/bench_verify.py --files-8k 12 --files-64k 0 --json verify.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

from forge_replay.dumps import load
from forge_replay.dumps.convert import Conversion, ModelLimits
from forge_replay.dumps.synth import write_synth_dumps
from forge_replay.dumps.verify import usable_cpus, verify_dumps

from bench_args import non_negative_int, output_file, positive_int, writable_dir
from bench_output import emit, environment

VOCAB = 151_936
LIMITS = ModelLimits(vocab_size=VOCAB, max_positions=131_072)  # a Qwen3-sized model that takes 64k tokens
MODEL_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": VOCAB, "max_position_embeddings": 131_072}
SHAPES = {  # name -> (prompts, samples per prompt, prompt tokens, response tokens)
    "8k": (32, 8, 1024, 7168),
    "64k": (32, 8, 8192, 57344),
}


def cpu_now() -> float:
    """CPU seconds of this process and of the children it has waited for (verify's worker processes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn) -> tuple[float, float]:
    gc.collect()
    start, cpu_start = time.perf_counter(), cpu_now()
    result = fn()
    seconds, cpu = time.perf_counter() - start, cpu_now() - cpu_start
    del result
    gc.collect()
    return seconds, cpu


def best_of(repeats: int, runs: dict, measure) -> tuple[dict[str, float], dict[str, float]]:
    """The least wall and CPU seconds of each of ``runs`` over ``repeats`` rounds (``measure(run)``: both)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for _ in range(repeats):
        for label, run in runs.items():
            seconds, cpu_seconds = measure(run)
            wall[label] = min(seconds, wall.get(label, seconds))
            cpu[label] = min(cpu_seconds, cpu.get(label, cpu_seconds))
    return wall, cpu


def read_all(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            total += len(handle.read())
    return total


def each(fn, paths: list[str]):
    def run():
        for path in paths:
            fn(path)  # one file at a time: what one worker holds
    return run


def verify(root: str, count: int, jobs: int):
    def run():
        report = verify_dumps(root, "rollout_{rollout_id}.pt", count, conversion=Conversion(limits=LIMITS), jobs=jobs)
        assert report.ok, report.summary()
    return run


def bench_shape(name: str, count: int, workdir: str, repeats: int, jobs: int) -> dict:
    prompts, per_prompt, prompt_len, response_len = SHAPES[name]
    root = os.path.join(workdir, name)
    print(f"[{name}] writing {count} dump(s) of {prompts * per_prompt} samples x {prompt_len + response_len} tokens"
          " ...", flush=True)
    paths = write_synth_dumps(os.path.join(root, "rollout_{rollout_id}.pt"), count, prompts, per_prompt, prompt_len,
                              response_len, vocab_size=VOCAB)
    gigabytes = read_all(paths) / 1e9  # and warms the page cache
    methods = {
        "raw read of the bytes": lambda: read_all(paths),
        "torch.load(weights_only=False) (unsafe)": each(lambda p: torch.load(p, weights_only=False), paths),
        "safe load (forge_replay.dumps.load)": each(load, paths),
        "verify, 1 worker": verify(root, count, 1),
    }
    if jobs > 1:
        methods[f"verify, {jobs} workers"] = verify(root, count, jobs)
    wall, cpu = best_of(repeats, methods, timed)
    for label in methods:
        print(f"[{name}] {label:42} {wall[label] / gigabytes:8.3f} s/GB  (CPU {cpu[label] / gigabytes:.3f} s/GB)",
              flush=True)
    reference = "torch.load(weights_only=False) (unsafe)"
    ratio, cpu_ratio = wall["verify, 1 worker"] / wall[reference], cpu["verify, 1 worker"] / cpu[reference]
    print(f"[{name}] {count} file(s), {gigabytes * 1e3:.1f} MB; verify (1 worker) / torch.load = {ratio:.2f}x"
          f" (CPU time {cpu_ratio:.2f}x)", flush=True)
    for path in paths:
        os.unlink(path)
    return {
        "shape": name, "files": count, "megabytes": round(gigabytes * 1e3, 1), "repeats": repeats,
        "seconds_per_gb": {k: round(v / gigabytes, 3) for k, v in wall.items()},
        "cpu_seconds_per_gb": {k: round(v / gigabytes, 3) for k, v in cpu.items()},
        "verify_over_torch_load": round(ratio, 3), "verify_over_torch_load_cpu": round(cpu_ratio, 3),
    }


def child_seconds(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` (a fresh interpreter)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_startup(workdir: str, repeats: int) -> dict:
    """`forge-replay dumps verify` of a one-sample dump against ``python -c "import torch"``."""
    root = os.path.join(workdir, "startup")
    write_synth_dumps(os.path.join(root, "rollout_{rollout_id}.pt"), 1, 1, 1, 4, 4, vocab_size=VOCAB)
    runs = {
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "forge-replay dumps verify (1 file, --model-config)": [
            sys.executable, "-c", "from forge_replay.cli import main; main()", "dumps", "verify", "--root", root,
            "--path", "rollout_{rollout_id}.pt", "--num-rollouts", "1", "--no-reward-key", "--jobs", "1",
            "--model-config", json.dumps(MODEL_CONFIG)],
    }
    wall, cpu = best_of(repeats, runs, child_seconds)
    for label in runs:
        print(f"[start-up] {label:52} {wall[label]:6.2f} s  (CPU {cpu[label]:.2f} s)", flush=True)
    torch_label, verify_label = runs
    over, cpu_over = wall[verify_label] - wall[torch_label], cpu[verify_label] - cpu[torch_label]
    print(f"[start-up] dumps verify - import torch = {over:+.2f} s (CPU {cpu_over:+.2f} s)", flush=True)
    return {"seconds": {k: round(v, 3) for k, v in wall.items()},
            "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()}, "over_import_torch": round(over, 3),
            "over_import_torch_cpu": round(cpu_over, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files-8k", type=non_negative_int, default=4, help="8k-token dumps (about 25 MB each)")
    parser.add_argument("--files-64k", type=non_negative_int, default=2, help="64k-token dumps (about 200 MB each)")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--jobs", type=positive_int, default=usable_cpus(),
                        help="workers of the parallel verify (default: the usable CPUs; 1 skips it)")
    parser.add_argument("--workdir", type=writable_dir, default=None, help="Where to write the dumps (default: a temp"
                        " dir).")
    parser.add_argument("--json", type=output_file, default=None, help="Also write the results to this JSON file.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        startup = bench_startup(workdir, args.repeats)
        results = [bench_shape(name, count, workdir, args.repeats, args.jobs)
                   for name, count in (("8k", args.files_8k), ("64k", args.files_64k)) if count]
    emit({**environment(), "load_average": [round(x, 1) for x in os.getloadavg()], "torch": torch.__version__,
          "startup": startup, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
