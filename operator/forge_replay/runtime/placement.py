"""Ray placement of the trainer ranks (and, in forge mode, where engines may go)."""

from __future__ import annotations

from forge_replay.runtime.trainer.rank import TrainerSettings

PLACEMENT_TIMEOUT_S = 600.0


class PlacementError(RuntimeError):
    """The Ray cluster cannot hold the trainer; the message says what was asked and what exists."""


def trainer_bundles(settings: TrainerSettings) -> list[dict[str, float]]:
    """One bundle per rank: a GPU and a CPU on GPU nodes, one CPU with ``gpusPerNode: 0``."""
    bundle = {"GPU": 1.0, "CPU": 1.0} if settings.use_gpu else {"CPU": 1.0}
    return [dict(bundle) for _ in range(settings.world_size)]


def _shortage(settings: TrainerSettings, bundles: list[dict[str, float]], have: float, waited: str) -> PlacementError:
    need = "GPU" if settings.use_gpu else "CPU"
    return PlacementError(
        f"the trainer needs {len(bundles)} x {bundles[0]} (spec.trainer.nodes={settings.nodes}, "
        f"gpusPerNode={settings.gpus_per_node}) but the Ray cluster has {have:g} {need} in all{waited}. "
        f"Lower spec.trainer.nodes/gpusPerNode (gpusPerNode: 0 trains on CPUs) or give Ray more resources."
    )


def place_trainer(settings: TrainerSettings, timeout_s: float = PLACEMENT_TIMEOUT_S, *, fixed_cluster: bool = False):
    """Reserve the trainer's bundles (ranks of a node packed together) or fail with what is missing.

    ``fixed_cluster`` (a local Ray that will never grow) fails at once when the total is too small.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = trainer_bundles(settings)
    need = "GPU" if settings.use_gpu else "CPU"
    have = ray.cluster_resources().get(need, 0)
    if fixed_cluster and have < sum(b[need] for b in bundles):
        raise _shortage(settings, bundles, have, "")
    group = placement_group(bundles, strategy="PACK", name="forge-replay-trainer")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise _shortage(settings, bundles, ray.cluster_resources().get(need, 0), f"; waited {timeout_s:.0f}s") from None
    return group
