"""Dump loading: forge-replay's safe loader against torch.load, the packed format and a raw read.

Writes slime-format synthetic dumps (Python lists of token ids and log probs, as slime dumps
hold them) and times each way of reading them back, best of --repeats (page cache warm).
``miles-30mb`` is miles-shaped (AdapterRef / RewardSpec by class, int32 numpy MoE replay arrays,
sets in metadata, top-level metadata), ``vlm-30mb`` slime-VLM-shaped (PIL images, bf16
pixel_values); both are written with the upstream stand-ins of tests/doubles/upstream_types.py.

    python benches/bench_dump_load.py                 # 30 MB dump
    python benches/bench_dump_load.py --size 300mb    # the 300 MB dump (slow; needs ~6 GiB RAM)
    python benches/bench_dump_load.py --size all --skip-weights-only

Prints one line per method (best wall time and best CPU time of this process: on a shared box the CPU time is
what other jobs disturb least) and a JSON summary (--json FILE to keep it).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time

import torch

from forge_replay.dumps import load, load_raw, safe_load, save
from forge_replay.dumps.packed import open_packed, write_packed
from forge_replay.dumps.sample import Sample

from bench_args import output_file, positive_int, writable_dir
from bench_output import emit, environment

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.doubles import upstream_types  # noqa: E402  (the miles/slime stand-ins, for the shaped dumps)

# name -> (samples, prompt_len, response_len); vocab 151k (Qwen-sized), so ids pickle as 5-byte ints.
SIZES = {
    "30mb": (256, 1024, 11500),
    "300mb": (1024, 4096, 28500),
}
# name -> (samples, tokens per sample): miles (MoE replay arrays of 4 layers x top-2) and slime VLM (336 px images).
SHAPED = {
    "miles-30mb": (192, 3000),
    "vlm-30mb": (16, 1024),
}
VOCAB = 151_936


def make_samples(samples: int, prompt_len: int, response_len: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(samples):
        prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
        length = rng.randint(response_len // 2, response_len)  # ragged, as real rollouts
        out.append(
            Sample(
                group_index=i // 8,
                index=i,
                prompt="bench",
                tokens=prompt + [rng.randrange(VOCAB) for _ in range(length)],
                response_length=length,
                reward=float(rng.random() < 0.5),
                rollout_log_probs=[-rng.random() for _ in range(length)],
                status=Sample.Status.COMPLETED,
            )
        )
    return out


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds): on a shared box CPU time is what other jobs disturb least."""
    gc.collect()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = fn()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    del result
    return seconds, cpu


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def write_dumps(name: str, path: str, packed: str) -> int:
    """Write dump ``name`` to ``path`` (as slime or miles would) and its packed form; returns its sample count."""
    if name in SHAPED:
        samples, tokens = SHAPED[name]
        print(f"[{name}] writing {samples} {name.split('-')[0]}-shaped samples x {tokens} tokens ...", flush=True)
        with upstream_types.upstream_modules():
            if name.startswith("miles"):
                dicts = upstream_types.miles_sample_dicts(samples, tokens=tokens, layers=4, topk=2)
                upstream_types.miles_dump(path, 0, dicts, {"weight_version": 3, "adapters": {"lora-0", "lora-1"}})
            else:
                upstream_types.vlm_dump(path, 0, upstream_types.vlm_sample_dicts(samples, side=336, tokens=tokens))
        blob = load_raw(path)  # pack what the loader read, as `dumps pack` does
        write_packed(packed, 0, blob["samples"], blob.get("metadata"))
        return samples
    samples, prompt_len, response_len = SIZES[name]
    print(f"[{name}] writing {samples} samples x ({prompt_len} + <= {response_len}) tokens ...", flush=True)
    sample_objs = make_samples(samples, prompt_len, response_len)
    save(path, 0, sample_objs)
    write_packed(packed, 0, [s.to_dict() for s in sample_objs])
    return samples


def unsafe_load(name: str, path: str) -> object:
    """torch.load(weights_only=False) as the writer's own process reads it: miles' classes importable (the
    stand-ins), real PIL for images."""
    if name.startswith("miles"):
        with upstream_types.upstream_modules():
            return torch.load(path, weights_only=False)
    return torch.load(path, weights_only=False)


def bench_size(name: str, workdir: str, repeats: int, skip_weights_only: bool) -> dict:
    path = os.path.join(workdir, f"rollout_{name}.pt")
    packed = os.path.join(workdir, f"rollout_{name}.pack")
    samples = write_dumps(name, path, packed)
    gc.collect()
    size_mb = os.path.getsize(path) / 1e6
    methods = {
        "raw read of the bytes": lambda: read_bytes(path),
        "torch.load(weights_only=False) (unsafe)": lambda: unsafe_load(name, path),
        "forge-replay safe_load (dict)": lambda: safe_load(path),
        "forge-replay load (Samples)": lambda: load(path),
        "packed: open (mmap arrays)": lambda: open_packed(packed),
        "packed: load (Samples)": lambda: load(packed),
    }
    if not skip_weights_only and name not in SHAPED:  # weights_only=True refuses AdapterRef and PIL images
        methods["torch.load(weights_only=True)"] = lambda: torch.load(path, weights_only=True)
    read_bytes(path), read_bytes(packed)  # warm the page cache
    # Methods are interleaved within each round, so load on a shared machine hits them alike; best round wins.
    results: dict[str, float] = {}
    cpu_results: dict[str, float] = {}
    for round_index in range(repeats):
        for label, fn in methods.items():
            if "weights_only=True" in label and round_index > 0 and name != "30mb":
                continue  # minutes per run on big dumps: once is enough
            seconds, cpu = timed(fn)
            results[label] = min(seconds, results.get(label, seconds))
            cpu_results[label] = min(cpu, cpu_results.get(label, cpu))
    for label, seconds in results.items():
        print(f"[{name}] {label:42} {seconds:8.3f} s  (CPU {cpu_results[label]:.3f} s)", flush=True)
    reference = "torch.load(weights_only=False) (unsafe)"
    ratio = results["forge-replay safe_load (dict)"] / results[reference]
    cpu_ratio = cpu_results["forge-replay safe_load (dict)"] / cpu_results[reference]
    print(f"[{name}] file {size_mb:.1f} MB; safe_load / torch.load(weights_only=False) = {ratio:.2f}x"
          f" (CPU time {cpu_ratio:.2f}x)", flush=True)
    return {
        "size": name,
        "file_mb": round(size_mb, 1),
        "packed_mb": round(os.path.getsize(packed) / 1e6, 1),
        "samples": samples,
        "repeats": repeats,
        "seconds": {k: round(v, 4) for k, v in results.items()},
        "cpu_seconds": {k: round(v, 4) for k, v in cpu_results.items()},
        "safe_over_torch_load": round(ratio, 3),
        "safe_over_torch_load_cpu": round(cpu_ratio, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=[*SIZES, *SHAPED, "all"], default="30mb")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--skip-weights-only", action="store_true", help="weights_only=True is slow on big dumps")
    parser.add_argument("--workdir", type=writable_dir, default=None,
                        help="Where to write the dumps (default: a temp dir).")
    parser.add_argument("--json", type=output_file, default=None, help="Also write the results to this JSON file.")
    args = parser.parse_args()
    sizes = [*SIZES, *SHAPED] if args.size == "all" else [args.size]
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        results = [bench_size(name, workdir, args.repeats, args.skip_weights_only) for name in sizes]
    emit({**environment(), "torch": torch.__version__, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
