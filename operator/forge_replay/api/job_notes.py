"""What a valid ForgeReplayJob does that its author should know: `forge-replay validate` and `forge-replay run` say
these notes under the job's name."""

from __future__ import annotations

from forge_replay.api.job import ForgeReplayJobSpec

UPSTREAM_LOADER_NOTE = (
    "spec.replay.loader upstream: slime's own loaders unpickle the dumps with torch.load(weights_only=False), "
    "which runs any code a dump carries; use it only on dumps you wrote (forgeReplay loads them safely)"
)

CPU_STAND_IN_NOTE = (
    "spec.trainer.gpusPerNode 0 injects --actor-num-gpus-per-node 0: a trainer world size of 0, which a real {backend} "
    "script cannot train with (Megatron needs GPUs); only a CPU stand-in script (tests/byo/train.py) runs this way"
)


def job_notes(spec: ForgeReplayJobSpec) -> list[str]:
    """What a valid spec does that its author should know: the upstream loader unpickles; gpusPerNode 0 runs only a
    stand-in script under slime / miles."""
    notes = [UPSTREAM_LOADER_NOTE] if spec.replay.loader == "upstream" else []
    trainer = spec.trainer
    if trainer.backend != "builtin" and trainer.gpus_per_node == 0:
        notes.append(CPU_STAND_IN_NOTE.format(backend=trainer.backend))
    return notes
