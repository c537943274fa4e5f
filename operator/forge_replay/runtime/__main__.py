"""In-cluster entry point: ``python -m forge_replay.runtime --config FILE``.

FILE is the runtime config the operator mounts from a ConfigMap (``RuntimeConfig``: the validated
job plus the mount points). Joins the Ray cluster (``RAY_ADDRESS`` under a KubeRay RayJob) or starts
a local Ray. Exit status: 0 success, 1 the run failed, 2 the config, the results folder or the input is unusable
(a dumps root or model folder that does not exist, dumps that verify refused: found before Ray starts), 3 the run
finished but an expectation of spec.expect failed, 4 the run ran out of memory (0 when spec.expect.outcome expects
it). The result published for the operator carries the outcome (and the out-of-memory record).
"""

from __future__ import annotations

import argparse
import logging
import sys

from forge_replay.api.paths import CONFIG_PATH
from forge_replay.runtime.run_inputs import EXIT_EXPECTATIONS, EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE, exit_status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forge_replay.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG_PATH, help=f"runtime config YAML (default {CONFIG_PATH})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from forge_replay.api import SpecInvalid
    from forge_replay.api.runtime_config import RuntimeConfig

    try:
        config = RuntimeConfig.from_file(args.config)
    except SpecInvalid as exc:
        for problem in exc.problems:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return EXIT_UNUSABLE

    from forge_replay.runtime.progress_publish import record_result
    from forge_replay.runtime.results import ResultsError, prepare_results

    if config.results_dir:  # an unwritable results claim fails before Ray starts, not after the run trained
        try:
            prepare_results(config.results_dir)
        except ResultsError as exc:
            print(f"forge-replay: {exc}", file=sys.stderr)
            record_result(config, "Failed", str(exc), outcome="failed")
            return EXIT_UNUSABLE

    from forge_replay.verdict.run import unusable_baseline

    failed = unusable_baseline(config.job.spec, config.baseline_path)  # before Ray: nothing is trained for nothing
    if failed:
        print(f"forge-replay: {failed[0]['message']}", file=sys.stderr)
        record_result(config, "Failed", f"{failed[0]['name']}: {failed[0]['message']}", failed, outcome="failed")
        return EXIT_EXPECTATIONS

    from forge_replay.runtime.driver import ReplayRunError, preflight

    try:  # before Ray: a model folder that does not exist, or dumps verify refuses, is unusable input (2)
        prepared = preflight(config, progress=not args.no_progress)
    except ReplayRunError as exc:
        print(f"forge-replay: {exc}", file=sys.stderr)
        record_result(config, "Failed", str(exc), outcome="failed")
        return EXIT_UNUSABLE if getattr(exc, "unusable", False) else EXIT_FAILED

    import ray

    from forge_replay.runtime.driver import ALREADY_CONNECTED, connect_ray, local_cpus_needed
    from forge_replay.runtime.sweep import run_replay
    from forge_replay.runtime.trainer.rank import trainer_settings

    how = connect_ray(num_cpus=local_cpus_needed(trainer_settings(config.job.spec.trainer).world_size))
    logging.getLogger(__name__).info("Ray: %s", how)
    try:
        report = run_replay(config, fixed_cluster=False, show_progress=not args.no_progress, prepared=prepared)
    except ReplayRunError as exc:
        print(f"forge-replay: run failed: {exc}", file=sys.stderr)
        record_result(config, "Failed", str(exc), outcome="failed")  # the operator reads it after the RayJob is gone
        return EXIT_FAILED
    finally:
        if how != ALREADY_CONNECTED:
            ray.shutdown()
    code, why = exit_status(report)  # out of memory (4), or finished but spec.expect failed (3): the job fails
    if why:
        print(f"forge-replay: {why}", file=sys.stderr)
    record_result(config, "Succeeded" if code == EXIT_OK else "Failed", why or "", report.expectations,
                  outcome=report.outcome, out_of_memory=report.out_of_memory)
    return code


if __name__ == "__main__":
    sys.exit(main())
