"""Rules that hold only when a job runs in a cluster (several pods), not on one machine.

The operator and `forge-replay render` refuse a spec that breaks them (SpecValid=False, with the
field path); `forge-replay validate` prints them as notes, since the same YAML is also valid for
`forge-replay run` on one machine.
"""

from __future__ import annotations

from typing import Any

from forge_replay.api.models import ForgeReplayJob, ForgeReplayJobSpec, Problem, SpecInvalid
from forge_replay.api.parse import parse_job


def cluster_problems(spec: ForgeReplayJobSpec) -> list[Problem]:
    """Why ``spec`` cannot run in a cluster (empty when it can)."""
    rollout, trainer = spec.rollout, spec.trainer
    if spec.replay.mode != "forge" or rollout is None or spec.results.claim_name:
        return []
    if rollout.colocate and trainer.nodes == 1:
        return []  # the engines share trainer rank 0's pod: its local disk carries the weights
    where = "in their own pods" if not rollout.colocate else f"on all {trainer.nodes} trainer nodes"
    return [
        Problem(
            "spec.results.claimName",
            f"required for forge mode in a cluster: the engines run {where}, and after every step the "
            "trainer pushes its weights to them through this volume (/update_weights_from_disk); "
            "use a ReadWriteMany PVC",
        )
    ]


def parse_job_for_cluster(doc: Any) -> ForgeReplayJob:
    """``parse_job`` plus the cluster-only rules; raises SpecInvalid naming the field."""
    job = parse_job(doc)
    problems = cluster_problems(job.spec)
    if problems:
        raise SpecInvalid(problems)
    return job
