"""The progress report (progress.json) the runtime publishes; the operator copies it into the job's status."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from forge_replay.api.base import ApiModel
from forge_replay.api.outcome import Outcome, OutOfMemory
from forge_replay.api.status import ExpectationResult, MemoryPeak, SweepProgress

PROGRESS_KEY = "progress.json"


def progress_configmap_name(job_name: str) -> str:
    """Name of the ConfigMap the runtime patches with progress."""
    return f"{job_name}-progress"


class RunResult(ApiModel):
    """How the run ended, as the runtime itself saw it (kept after the RayJob is gone)."""

    phase: Literal["Succeeded", "Failed"] = Field(description="Succeeded or Failed.")
    message: str = Field(default="", max_length=4000, description="Why it failed (the runtime's one line).")
    finished_at: str | None = Field(default=None, description="When the run ended (RFC 3339).")
    expectations: list[ExpectationResult] | None = Field(
        default=None, description="The verdict on spec.expect (one entry per check); absent without spec.expect."
    )
    outcome: Outcome | None = Field(default=None, description="fits, overBudget, outOfMemory or failed.")
    out_of_memory: OutOfMemory | None = Field(
        default=None, description="With outcome outOfMemory: which signal, where, when and how much."
    )


class ProgressReport(ApiModel):
    """Rollouts done, the memory peak so far, fallbacks used and data slime accepts but a user should see:
    all-zero loss masks and rollout_id mismatches (JSON under PROGRESS_KEY)."""

    completed: int = Field(default=0, ge=0, description="Rollouts trained.")
    total: int = Field(default=0, ge=0, description="Rollouts to train.")
    memory: MemoryPeak | None = Field(default=None, description="Highest memory peak so far.")
    fallbacks: int = Field(default=0, ge=0, description="Rollouts trained from rollout 0's file.")
    masked_out_samples: int = Field(
        default=0, ge=0, description="Samples trained so far whose loss mask is all zeros (they add no loss token)."
    )
    rollout_id_mismatches: int = Field(
        default=0, ge=0, description="Rollouts whose dump holds a rollout_id other than the one its file stands for."
    )
    sweep: SweepProgress | None = Field(default=None, description="With spec.sweep: points done, the frontier so far.")
    updated_at: str | None = Field(default=None, description="When this report was written (RFC 3339).")
    result: RunResult | None = Field(default=None, description="Set once, when the run has ended.")
