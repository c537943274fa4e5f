"""Benchmark of the memory-frontier sweep (spec.sweep, issue 32) on CPU: frontier vs grid vs one job per point.

Two axes: replay.stretch.maxTokens (the recorded samples stretched to each length) x trainer.microBatchTokens (the
axis the frontier is searched along; >= 8 values exercise the bound of ceil(log2 n) + 3 points per line). A tiny
Llama with a large vocabulary, so that a micro-batch's logits (tokens x vocab x 4 bytes, and as much again for
their gradients) are what grows a trainer rank's peak RSS. Forge mode with the sglang HTTP test double as the
engines (``--engines 0``: debug mode, no engines). On one local Ray:

1. a ``grid`` sweep (every point measured, each with trainer actors of its own);
2. one job per point: each point of the grid as its own ``run_job`` (pre-flight, placement, engine start-up and
   trainer included), which also measures every point a second time: the run-to-run spread is the largest
   difference between the two measurements of a point;
3. a per-rank budget (headroom 0) at least 3x that spread away from every measured peak (exit 1 when there is
   none), chosen so that as many lines as possible have a frontier strictly inside the axis;
4. a ``frontier`` sweep under that budget: its frontier must equal the one read off the grid's peaks (and the
   one-job-per-point peaks), with fewer points run than the grid's and at most ceil(log2 n) + 3 points per line.

The defaults: 4 samples of 16 + 240 tokens stretched to 1024 and 2048 tokens (4,096 and 8,192 tokens a step). A
micro-batch packs whole samples, so a point's largest micro-batch is 1, 2, 4 or 8 k tokens and the peaks sit on
those few levels, about 0.25, 0.5 and 0.75 GiB apart with this vocabulary: gaps wide enough for a budget 3x the
spread from every peak (two runs of one point differed by up to 0.08 GiB on a busy 2-core box). With samples
stretched to 512 and 1024 instead (levels up to 4 k tokens, the widest gap 0.49 GiB) no budget was 3x away.

It prints the predicted and measured peak per point, points run against the grid's count, and the wall time of
the frontier sweep, the grid sweep and one job per point. Exit 1 when a check fails.

    python benches/bench_sweep.py                 # 2 x 8 points; about 10 minutes on 2 busy cores
    python benches/bench_sweep.py --jobs 4        # 4 of the 16 points as jobs of their own, extrapolated

Results go in docs/benchmarks.md ("Sweep (issue 32)"), with the machine and the date.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench_args import output_file, positive_int
from bench_output import emit, environment

DOUBLE = Path(__file__).resolve().parents[1] / "tests" / "doubles" / "sglang_double.py"
STRETCH = "replay.stretch.maxTokens"
MICRO = "trainer.microBatchTokens"
MARGIN_FACTOR = 3.0
"""The budget is at least this many run-to-run spreads away from every measured peak."""


def increasing_ints(text: str) -> list[int]:
    """A comma-separated list of strictly increasing integers >= 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected strictly increasing integers >= 1, comma-separated (got {text!r})")
    return values


increasing_ints.__name__ = "list"


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {text!r})")
    return value


def sweep_doc(args: argparse.Namespace, search: str, budget: float) -> dict:
    """The sweep job: both axes, a per-rank budget, headroom 0 (a point fits at peak <= budget)."""
    spec: dict = {
        "replay": {"mode": "forge" if args.engines else "debug", "dumps": {"claimName": "bench", "path": "fixed.pt"},
                   "numRollouts": args.rollouts, "stretch": {"maxTokens": args.stretch[0]}},
        "model": {"config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
                             "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                             "num_key_value_heads": 1, "vocab_size": args.vocab,
                             "max_position_embeddings": max(args.stretch)}},
        "trainer": {"gpusPerNode": 0, "microBatchTokens": args.micro_batch[0], "dtype": "float32",
                    "gradientCheckpointing": False},
        "sweep": {"axes": [{"field": STRETCH, "values": args.stretch}, {"field": MICRO, "values": args.micro_batch}],
                  "search": search, "budgetGiB": budget, "headroom": 0.0, "rolloutsPerPoint": args.rollouts,
                  "maxPoints": len(args.stretch) * len(args.micro_batch)},
    }
    if args.engines:
        spec["rollout"] = {"numGpus": args.engines, "numGpusPerEngine": 1}
    return {"apiVersion": "forgereplay.io/v1alpha1", "kind": "ForgeReplayJob",
            "metadata": {"name": f"bench-sweep-{search}"}, "spec": spec}


def runtime_config(args: argparse.Namespace, job, work: Path, results: str):
    from forge_replay.api.runtime_config import RuntimeConfig

    return RuntimeConfig(job=job, dumps_root=str(work / "dumps"), results_dir=str(work / results), model_root=None,
                         engine_command=f"{sys.executable} {DOUBLE}" if args.engines else None)


def key(values: dict) -> tuple[int, int]:
    return int(values[STRETCH]), int(values[MICRO])


def run_sweep_timed(args, work: Path, search: str, budget: float, quiet) -> tuple[dict, float]:
    """One sweep job (run_sweep, pre-flight included): report.json's ``sweep`` and its wall time."""
    from forge_replay.api import parse_job
    from forge_replay.runtime.sweep import run_sweep

    config = runtime_config(args, parse_job(sweep_doc(args, search, budget)), work, search)
    began = time.perf_counter()
    report = run_sweep(config, show_progress=False, console=quiet)
    return report.sweep, time.perf_counter() - began


def run_one_job_per_point(args, work: Path, points: list[dict], quiet) -> tuple[dict, list[float]]:
    """Each point as a job of its own (run_job: pre-flight, placement, engines started and stopped, trainer): its
    PointResult, and each job's wall time."""
    from forge_replay.api import parse_job
    from forge_replay.api.sweep import point_job
    from forge_replay.runtime.driver import run_job
    from forge_replay.runtime.sweep import point_result

    job = parse_job(sweep_doc(args, "grid", 1.0))
    results, seconds = {}, []
    if args.jobs is not None and args.jobs < len(points):  # evenly spread, the first and the last included
        points = [points[round(i * (len(points) - 1) / max(args.jobs - 1, 1))] for i in range(args.jobs)]
    for n, values in enumerate(points, 1):
        point = point_job(job, values)
        point = point.model_copy(update={"spec": point.spec.model_copy(update={"expect": None, "sweep": None})})
        config = runtime_config(args, point, work, f"jobs/{n:02d}")
        began = time.perf_counter()
        report = run_job(config, show_progress=False, console=quiet)
        seconds.append(time.perf_counter() - began)
        results[key(values)] = point_result(report, values)
        print(f"  job {n}/{len(points)} {key(values)}: peak {results[key(values)].budget_peak_gib} GiB, "
              f"{seconds[-1]:.1f} s", flush=True)
    return results, seconds


def brute_frontier(peaks: dict[tuple[int, int], float | None], stretch: list[int], micro: list[int],
                   budget: float) -> dict[int, int | None]:
    """Per stretch value, the largest micro-batch size that fits with every smaller one (None: the smallest does
    not); a point without a peak (out of memory, failed) does not fit."""
    out = {}
    for s in stretch:
        value = None
        for m in micro:
            peak = peaks.get((s, m))
            if peak is None or peak > budget:
                break
            value = m
        out[s] = value
    return out


def choose_budget(measured: dict[tuple[int, int], list[float]], stretch: list[int], micro: list[int],
                  spread: float) -> tuple[float, float] | None:
    """A budget between two measured peaks, at least MARGIN_FACTOR x spread from every measurement: the one that
    leaves the most lines with a frontier strictly inside the axis, then the widest margin. (budget, margin)."""
    pooled = sorted({p for values in measured.values() for p in values})
    best = None
    for low, high in zip(pooled, pooled[1:]):
        budget = (low + high) / 2
        margin = min(abs(budget - p) for p in pooled)
        if margin < MARGIN_FACTOR * spread:
            continue
        frontier = brute_frontier({k: max(v) for k, v in measured.items()}, stretch, micro, budget)
        inside = sum(v is not None and v != micro[-1] for v in frontier.values())
        score = (inside, margin)
        if best is None or score > best[0]:
            best = (score, budget, margin)
    return None if best is None else (round(best[1], 4), round(best[2], 4))


def print_points(args, grid: dict, jobs: dict, frontier: dict, budget: float) -> list[dict]:
    """The table of every grid point: measured peaks (grid, own job, frontier run) and the frontier's prediction."""
    by_grid = {key(p["values"]): p for p in grid["points"]}
    by_frontier = {key(p["values"]): p for p in frontier["points"]}
    rows = []
    print(f"\n{'stretch':>7} {'microBatch':>10} {'grid GiB':>9} {'own job':>8} {'frontier':>9} {'predicted':>9} "
          f"{'pred-meas':>9} {'fits':>5}")
    for s in args.stretch:
        for m in args.micro_batch:
            g, f = by_grid[(s, m)], by_frontier.get((s, m))
            own = jobs[(s, m)].budget_peak_gib if (s, m) in jobs else None
            measured = f["peak_gib"] if f else None
            predicted = f["predicted_gib"] if f else None
            row = {"stretch": s, "micro_batch_tokens": m, "grid_peak_gib": g["peak_gib"], "job_peak_gib": own,
                   "frontier_peak_gib": measured, "frontier_predicted_gib": predicted,
                   "fits": g["peak_gib"] is not None and g["peak_gib"] <= budget}
            rows.append(row)
            error = f"{predicted - measured:+9.3f}" if predicted is not None and measured is not None else f"{'-':>9}"
            print(f"{s:>7} {m:>10} {fmt(g['peak_gib']):>9} {fmt(own):>8} {fmt(measured):>9} {fmt(predicted):>9} "
                  f"{error} {'yes' if row['fits'] else 'no':>5}")
    return rows


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def check(frontier: dict, grid_frontier: dict, job_frontier: dict | None, args) -> list[str]:
    """What the frontier sweep must satisfy; the failures, named."""
    problems = []
    found = {int(f["at"][STRETCH]): f["value"] for f in frontier["frontier"]}
    incomplete = [f for f in frontier["frontier"] if not f["complete"]]
    if incomplete or not frontier["finished"]:
        problems.append(f"the frontier search did not finish: {incomplete}")
    if found != grid_frontier:
        problems.append(f"frontier {found} differs from the grid's {grid_frontier}")
    if job_frontier is not None and found != job_frontier:
        problems.append(f"frontier {found} differs from the one read off one job per point {job_frontier}")
    if frontier["points_run"] >= frontier["grid_points"]:
        problems.append(f"the frontier ran {frontier['points_run']} points, not fewer than the grid's "
                        f"{frontier['grid_points']}")
    n = len(args.micro_batch)
    bound = math.ceil(math.log2(n)) + 3
    for s in args.stretch:
        run = sum(int(p["values"][STRETCH]) == s for p in frontier["points"])
        if n >= 8 and run > bound:
            problems.append(f"line {STRETCH}={s}: {run} points run, over ceil(log2 {n}) + 3 = {bound}")
    return problems


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stretch", type=increasing_ints, default=[1024, 2048],
                        help="replay.stretch.maxTokens values (each >= --prompt-len + --response-len)")
    parser.add_argument("--micro-batch", type=increasing_ints, default=[256, 512, 1024, 1536, 2048, 2560, 4096, 8192],
                        help="trainer.microBatchTokens values, the searched axis (>= 8 to exercise the bound)")
    parser.add_argument("--vocab", type=positive_int, default=16384)
    parser.add_argument("--samples", type=positive_int, default=4, help="samples per rollout (prompts x 4)")
    parser.add_argument("--prompt-len", type=positive_int, default=16)
    parser.add_argument("--response-len", type=positive_int, default=240)
    parser.add_argument("--rollouts", type=positive_int, default=2, help="spec.sweep.rolloutsPerPoint (>= 2)")
    parser.add_argument("--engines", type=int, choices=(0, 1, 2), default=1,
                        help="sglang test-double engines (0: debug mode, no engines)")
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="run only this many points (evenly spread over the grid) as jobs of their own and "
                        "extrapolate their wall time to every point (default: every point)")
    parser.add_argument("--min-spread", type=positive_float, default=0.01,
                        help="the run-to-run spread (GiB) taken when the measured one is smaller")
    parser.add_argument("--json", type=output_file, default=None, help="also write the summary here")
    args = parser.parse_args()
    if args.rollouts < 2:
        parser.error("argument --rollouts: spec.sweep.rolloutsPerPoint is at least 2")
    if args.samples % 4:
        parser.error("argument --samples: must be a multiple of 4 (4 samples per prompt)")
    if args.stretch[0] < args.prompt_len + args.response_len:
        parser.error("argument --stretch: every value must be >= --prompt-len + --response-len (stretching never "
                     "shortens)")
    return args


def main() -> int:
    args = parse_args()
    import logging

    import ray
    import torch
    from rich.console import Console

    from forge_replay.dumps import save
    from forge_replay.dumps.synth import synth_samples

    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    (work / "dumps").mkdir()
    save(work / "dumps" / "fixed.pt", 0, synth_samples(0, args.samples // 4, 4, prompt_len=args.prompt_len,
                                                        response_len=args.response_len, vocab_size=args.vocab))
    quiet = Console(file=open(os.devnull, "w"))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"ray {ray.__version__}, python {sys.version.split()[0]}; work folder {work}")
    mode = f"forge, {args.engines} test-double engine(s)" if args.engines else "debug, no engines"
    print(f"axes: {STRETCH} {args.stretch} x {MICRO} {args.micro_batch}; {args.samples} samples of "
          f"{args.prompt_len}+{args.response_len} tokens stretched; llama hidden 16, vocab {args.vocab}; "
          f"{args.rollouts} rollouts per point; {mode}", flush=True)
    began = time.perf_counter()
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - began
    try:
        return measure(args, work, quiet, ray_start)
    finally:
        ray.shutdown()


def measure(args, work: Path, quiet, ray_start: float) -> int:
    from forge_replay.api import parse_job
    from forge_replay.api.sweep import grid_points

    print("\n[1/3] grid sweep (every point)", flush=True)
    grid, grid_s = run_sweep_timed(args, work, "grid", 1000.0, quiet)
    points = grid_points(parse_job(sweep_doc(args, "grid", 1.0)).spec.sweep)
    grid_peaks = {key(p["values"]): p["peak_gib"] if p["outcome"] == "fits" else None for p in grid["points"]}
    print(f"  {grid['points_run']} points in {grid_s:.1f} s, engine starts {grid.get('engine_starts')}", flush=True)
    print("\n[2/3] one job per point", flush=True)
    jobs, job_seconds = run_one_job_per_point(args, work, points, quiet)
    job_peaks = {k: r.budget_peak_gib if r.outcome == "fits" else None for k, r in jobs.items()}
    if None in grid_peaks.values() or None in job_peaks.values():
        print(f"FAIL: a point ran out of memory or failed: grid {grid_peaks}, jobs {job_peaks}")
        return 1
    measured = {k: [grid_peaks[k], *([job_peaks[k]] if k in job_peaks else [])] for k in grid_peaks}
    spread, worst = run_to_run_spread(measured)
    print(f"\nrun-to-run spread (grid vs own job, largest over {len(job_peaks)} points measured twice): "
          f"{spread:.4f} GiB at {worst}; taken as {max(spread, args.min_spread):.4f} GiB")
    spread = max(spread, args.min_spread)
    chosen = choose_budget(measured, args.stretch, args.micro_batch, spread)
    if chosen is None:
        print(f"FAIL: no budget is {MARGIN_FACTOR:g}x the spread ({spread:.4f} GiB) away from every measured peak")
        return 1
    budget, margin = chosen
    print(f"budget {budget} GiB per rank (headroom 0): nearest measured peak {margin:.4f} GiB away = "
          f"{margin / spread:.1f}x the spread (>= {MARGIN_FACTOR:g}x required)", flush=True)
    print("\n[3/3] frontier sweep", flush=True)
    frontier, frontier_s = run_sweep_timed(args, work, "frontier", budget, quiet)
    return report(args, grid, jobs, frontier, {"grid": grid_s, "jobs": job_seconds, "frontier": frontier_s,
                                               "ray_start": ray_start}, budget, margin, spread)


def run_to_run_spread(measured: dict[tuple[int, int], list[float]]) -> tuple[float, tuple[int, int] | None]:
    """The largest difference between two measurements of one point, and that point."""
    differences = {k: max(v) - min(v) for k, v in measured.items() if len(v) > 1}
    if not differences:
        return 0.0, None
    worst = max(differences, key=differences.get)
    return differences[worst], worst


def report(args, grid: dict, jobs: dict, frontier: dict, seconds: dict, budget: float, margin: float,
           spread: float) -> int:
    """The frontier's table, every point's peaks, the checks, the wall times; the summary as JSON. Exit status."""
    from forge_replay.verdict.sweep import sweep_table

    print(sweep_table(frontier))
    rows = print_points(args, grid, jobs, frontier, budget)
    grid_peaks = {(r["stretch"], r["micro_batch_tokens"]): r["grid_peak_gib"] for r in rows}
    grid_frontier = brute_frontier(grid_peaks, args.stretch, args.micro_batch, budget)
    every_job = len(jobs) == len(rows)
    job_frontier = brute_frontier({k: r.budget_peak_gib for k, r in jobs.items()}, args.stretch, args.micro_batch,
                                  budget) if every_job else None
    problems = check(frontier, grid_frontier, job_frontier, args)
    # After the fact, with the frontier run's own measurements too: every measurement of a point on the same side.
    all_measured = {(r["stretch"], r["micro_batch_tokens"]): [p for p in (r["grid_peak_gib"], r["job_peak_gib"],
                                                                          r["frontier_peak_gib"]) if p is not None]
                    for r in rows}
    crossed = [k for k, v in all_measured.items() if min(v) <= budget < max(v)]
    if crossed:
        problems.append(f"point(s) measured on both sides of the budget: {crossed}")
    after, after_at = run_to_run_spread(all_measured)
    lines = {s: sum(int(p["values"][STRETCH]) == s for p in frontier["points"]) for s in args.stretch}
    n, job_s = len(args.micro_batch), seconds["jobs"]
    per_point = sum(job_s) / len(job_s)
    jobs_total = per_point * len(rows)
    print(f"\nspread over all three measurements (grid, own job, frontier run): {after:.4f} GiB at {after_at}; "
          f"margin {margin:.4f} GiB = {margin / max(after, 1e-9):.1f}x it")
    print(f"frontier (brute force over the grid's peaks): {grid_frontier}; over one job per point: "
          f"{job_frontier if every_job else 'not every point was run as a job'}")
    print(f"points run: frontier {frontier['points_run']} of a full grid's {frontier['grid_points']}; per line "
          f"{lines} (bound ceil(log2 {n}) + 3 = {math.ceil(math.log2(n)) + 3})")
    print(f"wall time: frontier {seconds['frontier']:.1f} s, grid {seconds['grid']:.1f} s, one job per point "
          f"{jobs_total:.1f} s ({len(job_s)} jobs run, {per_point:.1f} s each"
          f"{'' if every_job else f'; extrapolated to the {len(rows)} points'}); starting the local Ray they all "
          f"used took {seconds['ray_start']:.1f} s more")
    summary = {
        **environment(), "axes": {STRETCH: args.stretch, MICRO: args.micro_batch}, "vocab": args.vocab,
        "samples": args.samples, "engines": args.engines, "rollouts_per_point": args.rollouts,
        "spread_gib": spread, "spread_after_gib": after, "budget_gib": budget, "margin_gib": margin,
        "frontier": {str(k): v for k, v in grid_frontier.items()},
        "frontier_points_run": frontier["points_run"], "grid_points": frontier["grid_points"],
        "points_per_line": {str(k): v for k, v in lines.items()},
        "wall_seconds": {"frontier": round(seconds["frontier"], 1), "grid": round(seconds["grid"], 1),
                         "one_job_per_point": round(jobs_total, 1), "one_job_per_point_extrapolated": not every_job,
                         "ray_start": round(seconds["ray_start"], 1)},
        "engine_starts": {"frontier": frontier.get("engine_starts"), "grid": grid.get("engine_starts"),
                          "one_job_per_point": len(rows) * args.engines},
        "points": rows, "problems": problems,
    }
    emit(summary, args.json)
    for problem in problems:
        print(f"FAIL: {problem}")
    print("bench_sweep: " + ("FAILED" if problems else "ok: the frontier equals the grid's, with fewer points"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
