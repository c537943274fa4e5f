"""How a run ended, as a memory test reads it: ``fits``, ``overBudget``, ``outOfMemory`` or ``failed``; and for an
out-of-memory, the record of where, when and how much (report.json ``out_of_memory``, ``status.outOfMemory``).

One vocabulary for the runtime (the builtin trainer's ranks, the engines), the slime / miles publish step and the
operator (a pod OOMKilled): each fills what its signal tells and leaves the rest None.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from forge_replay.api.base import ApiModel
from forge_replay.errors import Portable

Outcome = Literal["fits", "overBudget", "outOfMemory", "failed"]
OUTCOMES: tuple[str, ...] = ("fits", "overBudget", "outOfMemory", "failed")
"""fits: finished, under spec.expect.maxPeakMemoryGiB when given; overBudget: finished (or stopped by the budget
check), peak above it; outOfMemory: the run ran out of memory; failed: anything else."""

OomSignal = Literal[
    "cudaAllocator", "cpuAllocator", "rayMemoryMonitor", "kernelOomKiller", "containerOOMKilled", "sglangRefusal",
]
OOM_SIGNALS: tuple[str, ...] = (
    "cudaAllocator", "cpuAllocator", "rayMemoryMonitor", "kernelOomKiller", "containerOOMKilled", "sglangRefusal",
)  # fmt: skip
"""Which signal said so: torch's CUDA allocator (torch.OutOfMemoryError), torch's CPU allocator, Ray's memory
monitor (ray.exceptions.OutOfMemoryError), the kernel's OOM killer (the memory cgroup's oom_kill count rose as the
process died), the container's OOMKilled status, sglang's own refusal (its scheduler's exception)."""

OomPhase = Literal[
    "setup", "forward", "backward", "optimizerStep", "weightSync", "engineStart", "engineServing",
]
OOM_PHASES: tuple[str, ...] = (
    "setup", "forward", "backward", "optimizerStep", "weightSync", "engineStart", "engineServing",
)  # fmt: skip
"""When in a step: the trainer's setup (model, optimizer), forward, backward, optimizer step, the weight sync to the
engines; an engine's start (weights, KV-cache allocation) or serving."""


class _Part(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class OutOfMemoryWhere(_Part):
    """Which process ran out of memory, as far as the signal tells."""

    component: Literal["trainer", "engine", "head"] = Field(
        description="trainer (a rank), engine (an sglang server) or head (the Ray head pod: the driver, Ray's GCS)."
    )
    rank: int | None = Field(default=None, description="The trainer rank.")
    engine: int | None = Field(default=None, description="The engine's index.")
    pod: str | None = Field(default=None, description="Its pod, in a cluster.")
    node: str | None = Field(default=None, description="Its node (in a cluster) or host.")
    pid: int | None = Field(default=None, description="Its process id on that node.")
    device: str | None = Field(default=None, description="cuda:N, or cpu.")


class OutOfMemoryWhen(_Part):
    """When it ran out of memory."""

    rollout: int | None = Field(default=None, description="The rollout being trained (or served).")
    phase: OomPhase | None = Field(default=None, description="setup, forward, backward, optimizerStep, weightSync, "
                                   "engineStart or engineServing.")
    at: str | None = Field(default=None, description="When it was recognized (RFC 3339).")


class OutOfMemoryHowMuch(_Part):
    """How much memory, at the moment, as far as the signal tells (bytes)."""

    requested_bytes: int | None = Field(default=None, description="What the failed allocation asked for.")
    allocated_bytes: int | None = Field(default=None, description="CUDA memory allocated by torch at the moment.")
    reserved_bytes: int | None = Field(default=None, description="CUDA memory reserved by torch at the moment.")
    device_total_bytes: int | None = Field(default=None, description="The device's total (or its per-process cap).")
    device_free_bytes: int | None = Field(default=None, description="What the device had free at the moment.")
    held_by_others_bytes: int | None = Field(
        default=None, description="Device memory other processes held (colocated engines, for instance)."
    )
    limit_bytes: int | None = Field(default=None, description="The memory limit that was hit (cgroup or container).")
    max_usage_bytes: int | None = Field(default=None, description="The cgroup's peak usage.")
    last_step_peak_gib: dict[str, float] | None = Field(
        default=None, alias="lastStepPeakGiB", description="Per rank, the peak of the last complete step (GiB)."
    )


class OutOfMemory(_Part):
    """An out-of-memory: which signal, where, when, how much, and the snapshot written at that moment."""

    signal: OomSignal = Field(description="cudaAllocator, cpuAllocator, rayMemoryMonitor, kernelOomKiller, "
                              "containerOOMKilled or sglangRefusal.")
    where: OutOfMemoryWhere = Field(description="Which process.")
    when: OutOfMemoryWhen = Field(default_factory=OutOfMemoryWhen, description="Which rollout and phase.")
    how_much: OutOfMemoryHowMuch = Field(default_factory=OutOfMemoryHowMuch, description="The figures.")
    message: str = Field(default="", max_length=2000, description="The signal's own words, shortened.")
    snapshot: str | None = Field(
        default=None, description="The CUDA memory snapshot written at the moment (memory_viz opens it), relative "
        "to the results folder; with spec.trainer.memorySnapshot on GPU."
    )

    def line(self) -> str:
        """One line: where, when and how much."""
        where = self.where
        who = {"trainer": "trainer" if where.rank is None else f"rank {where.rank}",
               "engine": "engine" if where.engine is None else f"engine {where.engine}",
               "head": "the Ray head"}[where.component]
        if where.pod:
            who += f" (pod {where.pod}" + (f" on {where.node})" if where.node else ")")
        elif where.node:
            who += f" on {where.node}"
        when = []
        if self.when.rollout is not None:
            when.append(f"rollout {self.when.rollout}")
        if self.when.phase:
            when.append(self.when.phase)
        much = self.how_much
        figures = [f"{label} {_gib(value)}" for label, value in (
            ("requested", much.requested_bytes), ("allocated", much.allocated_bytes),
            ("reserved", much.reserved_bytes), ("device total", much.device_total_bytes),
            ("limit", much.limit_bytes)) if value is not None]
        text = f"out of memory ({self.signal}): {who}"
        if when:
            text += ", " + " ".join(when)
        if figures:
            text += "; " + ", ".join(figures)
        return text


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


class RanOutOfMemory(Portable, RuntimeError):
    """Raised where an out-of-memory is recognized (a rank's phase, the driver reading a rank's death, the engine
    fleet reading an engine's exit); crosses Ray intact and carries the record."""

    def __init__(self, record: OutOfMemory):
        super().__init__(record.line())
        self.record = record
