"""The run's plan, decided from the spec alone: its replay mode and which rollout-side parts exist (miles' replay fix).

:func:`plan_replay` is the one place the runtime reads ``spec.replay.mode``; everything else reads the
:class:`ReplayPlan` it returns. Every construction decision on the rollout side goes through
:func:`plan_rollout_side`, so the rule lives in one place and is covered by a table test over mode x FT enabled x
components.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutSidePlan:
    """What the runtime constructs on the rollout side for one job."""

    start_engines: bool
    """sglang engines (and a router when there are several) are launched and kept alive. Debug mode starts
    none and reads the dumps straight into the trainer (the rollout manager's replay source, in forge mode
    too: the runtime calls no rollout function): nothing there may compute engine counts from an absent
    rollout section (the miles `int * None` crash)."""
    health_monitors: bool
    """One health monitor thread per engine group probing /health_generate."""
    fault_injection: bool
    """Test fault injection into engines is allowed."""
    recover_before_weight_sync: bool
    """Dead engines are restarted before each weight sync."""
    eval_fleet_self_probe: bool
    """The eval fleet probes its own engines before use (no monitor watches them)."""

    @property
    def rollout_ft(self) -> bool:
        """Rollout-side fault tolerance is active."""
        return self.health_monitors


@dataclass(frozen=True)
class ReplayPlan:
    """The runtime's plan of one run, read from its spec once (:func:`plan_replay`), built once per run and passed
    where needed."""

    mode: str
    """spec.replay.mode: forge (sglang engines receive the weights after every step) or debug (no engines)."""
    rollout_side: RolloutSidePlan

    @property
    def start_engines(self) -> bool:
        """forge mode: sglang engines are started (:attr:`RolloutSidePlan.start_engines`)."""
        return self.rollout_side.start_engines

    @property
    def debug(self) -> bool:
        """debug mode: the dumps go straight into the trainer; evals run only because evalInterval asks (slime's
        debug mode never evaluates)."""
        return self.mode == "debug"

    @property
    def deterministic(self) -> bool:
        """The trainer turns torch's deterministic settings on (debug replay)."""
        return self.debug


def plan_replay(spec) -> ReplayPlan:
    """The plan of a validated job's ``spec``: its replay mode and its rollout side."""
    ft = spec.fault_tolerance
    return ReplayPlan(spec.replay.mode, plan_rollout_side(spec.replay.mode, ft.enabled, ft.active_components))


def plan_rollout_side(mode: str, ft_enabled: bool, ft_components: Iterable[str]) -> RolloutSidePlan:
    """Decide the rollout side for ``mode`` (forge|debug) and the fault-tolerance settings."""
    if mode not in ("forge", "debug"):
        raise ValueError(f"unknown replay mode {mode!r} (expected forge or debug)")
    engines = mode == "forge"
    rollout_ft = engines and ft_enabled and "rollout" in set(ft_components)
    return RolloutSidePlan(
        start_engines=engines,
        health_monitors=rollout_ft,
        fault_injection=rollout_ft,
        recover_before_weight_sync=rollout_ft,
        eval_fleet_self_probe=engines and not rollout_ft,
    )


@dataclass(frozen=True)
class WeightSyncPlan:
    """How the trainer's weights reach the engines after every step (``spec.rollout.weightSync`` resolved)."""

    path: str
    """disk (/update_weights_from_disk), tensor (/update_weights_from_tensor) or distributed
    (/init_weights_update_group once, then /update_weights_from_distributed with a broadcast per step)."""
    backend: str | None
    """The torch.distributed backend of the distributed path: nccl on GPUs, gloo on CPU; None otherwise."""
    reason: str


def plan_weight_sync(choice: str, colocate: bool, use_gpus: bool) -> WeightSyncPlan:
    """Resolve ``spec.rollout.weightSync`` for a job whose engines are ``colocate``d or not, on GPUs or CPU.

    ``auto`` takes what slime and miles take: CUDA IPC tensors when the engines share the trainer's
    GPUs, a NCCL broadcast from trainer rank 0 when they have their own, and (CPU) a checkpoint on disk.
    """
    if choice == "auto":
        if colocate:
            return WeightSyncPlan("tensor", None, "auto: colocated engines read the trainer's GPU tensors (CUDA IPC)")
        if use_gpus:
            return WeightSyncPlan("distributed", "nccl", "auto: engines on their own GPUs get a NCCL broadcast")
        return WeightSyncPlan("disk", None, "auto: CPU engines load a checkpoint from disk")
    if choice == "tensor":
        if not colocate:
            raise ValueError("weightSync tensor needs colocate: true (the spec rules refuse this)")
        return WeightSyncPlan("tensor", None, "spec: tensor")
    if choice == "distributed":
        if colocate:
            raise ValueError("weightSync distributed cannot be used with colocate: true (the spec rules refuse this)")
        backend = "nccl" if use_gpus else "gloo"
        return WeightSyncPlan("distributed", backend, f"spec: distributed over {backend}")
    if choice == "disk":
        return WeightSyncPlan("disk", None, "spec: disk")
    raise ValueError(f"unknown weightSync {choice!r} (expected auto, disk, tensor or distributed)")
