"""Stand-in for a team's slime / miles ``train.py`` (neither can be installed here): what they do with the flags.

Follows, without their code:
- THUDM/slime@624b824a ``train.py``: ``for rollout_id in range(args.start_rollout_id, args.num_rollout)`` asks
  the rollout function for rollout_id's data and trains on it; eval when ``(rollout_id + 1) % eval_interval == 0``
  (``should_run_periodic_action``). slime's parser ignores flags it does not declare (``parse_known_args``).
- What both frameworks' code does beyond that, as forge-replay's rules data says (``upstream_rules.json``, each
  rule citing its upstream lines): no eval at all with ``--debug-train-only`` (debug-skips-eval), eval before
  training unless ``--skip-eval-before-train`` at rollout 0 (slime) or at ``--start-rollout-id`` (miles)
  (eval-before-train); ``--eval-interval`` without eval datasets fails (eval-needs-datasets); the flags their
  parsers require (the flag table's ``required`` rows) are required here; miles starts at rollout 0 unless ``--load``
  names a folder holding its checkpoint marker (start-needs-checkpoint).
- radixark/miles@31f1ca96 ``miles/utils/arguments.py`` (``add_user_provided_function_arguments``): the rollout
  function named by ``--rollout-function-path`` is loaded and its ``add_arguments(parser)`` called before a strict
  parse: an unknown flag is an error.

The parser holds a strict subset of the backend's options, read from forge-replay's flag table of that backend
(``forge_replay/frameworks/<backend>_flags.json``, itself read from upstream's arguments.py): the options forge-replay
injects and those the parser requires, plus ``--stand-in-backend`` and ``--stand-in-report`` of this stand-in. It
calls the rollout function with
a namespace of the parsed args, as slime's RolloutManager does, and reports what it got: one JSON line per call on
stdout, and the whole report in --stand-in-report FILE.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from forge_replay.frameworks.flags import BACKEND_INJECTED, INJECTED_UNLESS_GIVEN, flag_table, required_flags
from forge_replay.frameworks.rules import upstream_rule

TYPES = {"int": int, "str": str, "float": float}


def parser_for(backend: str) -> argparse.ArgumentParser:
    """The backend's injected options as its arguments.py declares them (type, action, nargs, choices)."""
    parser = argparse.ArgumentParser(prog=f"train.py ({backend} stand-in)", allow_abbrev=False)
    parser.add_argument("--stand-in-backend", choices=["slime", "miles"], required=True)
    parser.add_argument("--stand-in-report", default=None)
    parser.add_argument("--stand-in-train-mib", type=int, default=0,
                        help="train each rollout in a Ray task that holds a torch tensor of this many MiB, as slime's "
                        "actors train in Ray workers (where forge-replay's memory probe runs)")
    parser.add_argument("--stand-in-bytes-per-token", type=int, default=0,
                        help="... or one sized by the replayed data: this many bytes per token of the rollout's "
                        "samples, as a trainer's activations grow with the tokens it trains")
    table = flag_table(backend)
    eval_data = upstream_rule(backend, "eval-needs-datasets")["flags"]
    checkpoint = upstream_rule(backend, "start-needs-checkpoint")
    declared = [*BACKEND_INJECTED[backend], *INJECTED_UNLESS_GIVEN, *required_flags(backend), *eval_data,
                *([checkpoint["flag"]] if checkpoint else [])]
    for flag in dict.fromkeys(declared):
        row = table.options.get(flag)
        if row is None:  # miles: --load-forge-rollout-data comes from the rollout function's add_arguments
            continue
        kwargs: dict = {"dest": row["dest"]}
        if "action" in row:
            kwargs["action"] = row["action"]
        if "type" in row:
            kwargs["type"] = TYPES[row["type"]]
        if "nargs" in row:
            kwargs["nargs"] = row["nargs"]
        if "choices" in row:
            kwargs["choices"] = row["choices"]
        if row.get("required"):
            kwargs["required"] = True
        parser.add_argument(flag, **kwargs)
    return parser


def load_function(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def parse(argv: list[str]) -> argparse.Namespace:
    backend = "miles" if "--stand-in-backend=miles" in argv or ["--stand-in-backend", "miles"] in [
        argv[i:i + 2] for i in range(len(argv))] else "slime"
    parser = parser_for(backend)
    if backend == "slime":
        args, _unknown = parser.parse_known_args(argv)  # slime drops flags it does not declare
        return args
    known, _ = parser.parse_known_args(argv)
    if known.rollout_function_path:
        fn = load_function(known.rollout_function_path)
        if callable(getattr(fn, "add_arguments", None)):
            fn.add_arguments(parser)
    args = parser.parse_args(argv)  # miles: strict
    checkpoint = upstream_rule(backend, "start-needs-checkpoint")
    if checkpoint and not (args.load and os.path.exists(os.path.join(args.load, checkpoint["file"]))):
        args.start_rollout_id = 0  # even when --start-rollout-id is given
    return args


def summary(output) -> dict:
    if hasattr(output, "samples"):
        samples = output.samples
        return {"samples": len(samples), "tokens": sum(len(s.tokens) for s in samples), "rollout_ids": sorted({s.rollout_id for s in samples}),
                "made_for": sorted({(s.metadata or {}).get("rollout_id") for s in samples}, key=str),
                "metrics": output.metrics or {}}
    return {"eval": sorted(output.data), "metrics": output.metrics or {}}


def train_in_worker(mib: int, rollout_id: int) -> int:
    """A Ray task standing in for a trainer rank's step: torch memory held for a moment in a Ray worker."""
    import ray

    @ray.remote(num_cpus=0)
    def step(size: int) -> int:
        import time

        import torch

        held = torch.ones(size * 2**20, dtype=torch.uint8)
        time.sleep(0.6)  # longer than the probe's interval in the tests
        return int(held.sum())

    if not ray.is_initialized():
        ray.init()  # the Ray job's own cluster
    return ray.get(step.remote(mib)) // 2**20


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.eval_interval is not None and not (args.eval_prompt_data or args.eval_config):
        raise AssertionError("Evaluation datasets must be configured when eval_interval is set.")  # as both do
    report = {"backend": args.stand_in_backend,
              "args": {k: v for k, v in vars(args).items() if not k.startswith("stand_in_")},
              "train": [], "eval": []}
    train_fn = load_function(args.rollout_function_path)
    eval_fn = load_function(args.eval_function_path) if getattr(args, "eval_function_path", None) else None
    backend = args.stand_in_backend
    if getattr(args, "debug_train_only", False) and upstream_rule(backend, "debug-skips-eval") is not None:
        eval_fn = None  # the rollout manager's eval returns at once in debug mode
    at_start = upstream_rule(backend, "eval-before-train")["at"] == "start-rollout-id"
    before_train = args.start_rollout_id if at_start else 0

    def evaluate(rollout_id: int) -> None:
        got = {"rollout_id": rollout_id, **summary(eval_fn(args, rollout_id, None, evaluation=True))}
        report["eval"].append(got)
        print("stand-in eval " + json.dumps(got, sort_keys=True), flush=True)

    for rollout_id in range(args.start_rollout_id, args.num_rollout):
        if eval_fn and args.eval_interval and rollout_id == before_train and not args.skip_eval_before_train:
            evaluate(rollout_id)
        got = {"rollout_id": rollout_id, **summary(train_fn(args, rollout_id, None))}
        size_mib = args.stand_in_train_mib or -(-got["tokens"] * args.stand_in_bytes_per_token // 2**20)
        if size_mib:
            got["trained_mib"] = train_in_worker(size_mib, rollout_id)
        report["train"].append(got)
        print("stand-in train " + json.dumps(got, sort_keys=True), flush=True)
        if eval_fn and args.eval_interval and (rollout_id + 1) % args.eval_interval == 0:
            evaluate(rollout_id)
    if args.stand_in_report:
        with open(args.stand_in_report, "w", encoding="utf-8") as out:
            json.dump(report, out, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
