"""`forge-replay run FILE`: validate a ForgeReplayJob and replay it on a local Ray.

The command's shell: its options, then the run's phases (runtime.run_inputs, runtime.local_run); a slime / miles job
runs as the team's script through backends.local. Kept free of torch/ray imports at module level so
`forge-replay --help` stays fast.
"""

from __future__ import annotations

import sys

import click

from forge_replay.runtime.local_run import (
    checked_builtin_inputs,
    exit_by_outcome,
    quiet_local_ray,
    replay_locally,
    results_held,
    run_stoppable,
    stopped_run,
)
from forge_replay.runtime.run_inputs import RunInputs, err, exit_unusable, resolve_inputs


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--dumps-root", type=click.Path(file_okay=False), default=None,
              help="Local folder standing in for the dumps PVC root (default .forge-replay/dumps/<claimName>).")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default=None,
              help="Where report.json, memory.png and progress.json go (default results/<job name>; with "
              "spec.expect.baseline.history a new results/<job name>/run-<UTC time>, whose siblings are its history).")
@click.option("--model-root", type=click.Path(file_okay=False), default=None,
              help="Local folder standing in for the model PVC root (spec.model.path is relative to it).")
@click.option("--synth-missing", is_flag=True,
              help="When none of the job's dump files exist, synthesize small slime-format dumps first.")
@click.option("--engine-command", default=None, metavar="CMD",
              help="forge mode: command replacing `python -m sglang.launch_server` (same arguments).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--baseline", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The baseline report.json of spec.expect.baseline, in place of its ConfigMap or PVC.")
@click.option("--trainer-root", type=click.Path(file_okay=False, exists=True), default=None,
              help="backend slime / miles: local folder standing in for spec.trainer.workingDir (the team's script).")
def run(file: str, dumps_root: str | None, results_dir: str | None, model_root: str | None,
        synth_missing: bool, engine_command: str | None, no_progress: bool, baseline: str | None = None,
        trainer_root: str | None = None) -> None:
    """Validate FILE (one ForgeReplayJob) and replay it on a local Ray on this machine.

    The PVC paths of the spec are mapped to local folders (--dumps-root, --model-root). Writes
    report.json (per rollout: loss, tokens, step and data-wait time, memory peaks per rank,
    fallback used), memory.png and progress.json to the results folder and prints a table.
    Exit status: 0 success; 1 the run failed (missing dump, bad sample, trainer error);
    2 FILE is unusable (unreadable, invalid spec, a dumps root or model folder that does not exist, dumps that verify
    refused, forge mode without sglang or --engine-command), or the results folder is (not writable, or in use by
    another run, which is named);
    3 the run finished but an expectation of spec.expect failed (a verdict table follows the run's; a run over
    maxPeakMemoryGiB is stopped after the step that went over);
    4 the run ran out of memory (report.json's outcome outOfMemory and out_of_memory say where, when and how much;
    0 when spec.expect.outcome is outOfMemory, and 3 when such a job fits);
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM): engines and trainer are stopped either way.
    """
    quiet_local_ray()
    run_stoppable(file, lambda: _run(resolve_inputs(
        file, dumps_root=dumps_root, results_dir=results_dir, model_root=model_root, synth_missing=synth_missing,
        engine_command=engine_command, no_progress=no_progress, baseline=baseline, trainer_root=trainer_root)))


def _run(inputs: RunInputs) -> None:
    """The run of a usable job: its results folder held, the replay, the verdict's exit status."""
    if inputs.byo:
        _run_byo(inputs)
        return
    plan = checked_builtin_inputs(inputs)
    with results_held(inputs):
        report = replay_locally(inputs, plan)
    exit_by_outcome(inputs, report)


def _run_byo(inputs: RunInputs) -> None:
    """A slime / miles job: the team's script as a Ray job on a local Ray (backends.local), with the same folder
    rules as the builtin trainer's: one run at a time, the previous files kept aside. Exits with its status."""
    from forge_replay.backends.local import input_problem, run_cli

    problem = input_problem(inputs.file, inputs.job, inputs.trainer_root, inputs.dumps_root, inputs.synth_missing,
                            err)
    if problem:  # before anything is written, as for the builtin trainer
        exit_unusable(problem)
    with results_held(inputs):
        try:
            code = run_cli(inputs.file, inputs.job, inputs.trainer_root, inputs.dumps_root, inputs.results_dir,
                           inputs.synth_missing, err, inputs.model_root)
        except KeyboardInterrupt:  # run_local stopped its Ray head (the job, its workers) on the way out
            raise stopped_run(inputs.file, f"the {inputs.job.spec.trainer.backend} job and its local Ray were "
                              f"stopped; its output so far is in {inputs.results_dir}/trainer.log") from None
        sys.exit(code)
