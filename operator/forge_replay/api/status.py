"""The status of a ForgeReplayJob, written by the operator: phase, conditions, rollouts done, the memory peak, the
verdict on spec.expect and where the reports are."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from forge_replay.api.base import ApiModel, described
from forge_replay.api.outcome import Outcome, OutOfMemory


class Condition(ApiModel):
    """A metav1.Condition."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    type: str = described(
        "Condition type: Ready, Reconciling, Stalled, SpecValid, DumpsVerified, ClusterReady; ExpectationsMet with "
        "spec.expect."
    )
    status: Literal["True", "False", "Unknown"] = described("True, False or Unknown.")
    reason: str = Field(default="", description="One-word CamelCase reason.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="The spec generation this was computed from.")


class RolloutProgress(ApiModel):
    """Rollouts trained so far."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    completed: int = Field(default=0, description="Rollouts trained.")
    total: int = Field(default=0, description="Rollouts to train.")


class DevicePeaks(ApiModel):
    """One node's GPUs, as a device-level sampler saw them (``source``), with slime / miles."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    source: Literal["nvml"] = Field(description="nvml: NVML's used memory per GPU (or nvidia-smi's, the same figure).")
    peak_used_gib: dict[str, float] = Field(
        alias="peakUsedGiB", description="Peak used memory (GiB) per GPU index on the node."
    )


class MemoryPeak(ApiModel):
    """The highest memory peak over all ranks and steps, named by what it measures (``source``)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    source: Literal["cuda", "rss"] | None = Field(
        default=None,
        description="What the figures measure: cuda (torch's peak CUDA memory allocated and reserved, on GPUs) or "
        "rss (the trainer process's peak resident set size, on CPU: peakRssGiB, no CUDA figures).",
    )
    peak_allocated_gib: float | None = Field(
        default=None, alias="peakAllocatedGiB", description="Peak CUDA memory allocated (GiB); GPU runs only."
    )
    peak_reserved_gib: float | None = Field(
        default=None, alias="peakReservedGiB", description="Peak CUDA memory reserved (GiB); GPU runs only."
    )
    peak_rss_gib: float | None = Field(
        default=None, alias="peakRssGiB", description="Peak resident set size of the trainer process (GiB); CPU runs."
    )
    rank: int | None = Field(default=None, description="The trainer rank that reached the peak.")
    device: str | None = Field(default=None, description="The device of that peak (cuda:N, or cpu).")
    host: str | None = Field(
        default=None, description="slime / miles: the node of the process that reached the peak (no rank is known)."
    )
    pid: int | None = Field(default=None, description="slime / miles: that process's id on its node.")
    processes: int | None = Field(
        default=None, description="slime / miles: how many trainer processes the memory probe recorded."
    )
    gpus: dict[str, DevicePeaks] | None = Field(
        default=None,
        description="slime / miles: per node, every GPU's peak used memory at device level (sglang's KV cache and "
        "CUDA graphs included, which no trainer's allocator sees).",
    )


class ExpectationResult(ApiModel):
    """One check of spec.expect: what was observed against its limit (for a baseline, the baseline's value)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str = Field(description="maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond, or baseline.<metric>.")
    passed: bool = Field(description="Whether the expectation is met.")
    observed: float | None = Field(
        default=None, description="The run's figure (for a baseline miss: its value at the first differing rollout)."
    )
    limit: float | None = Field(default=None, description="The limit, or the baseline's value.")
    rollout: int | None = Field(default=None, description="Baseline miss: the first rollout id that differs.")
    metric: str | None = Field(default=None, description="Baseline checks: the compared metric.")
    message: str = Field(default="", description="The check in words; why it failed.")


class ResultsLocation(ApiModel):
    """Where this run writes its reports: a folder of its own on the results claim."""

    claim_name: str = Field(description="The results PVC (spec.results.claimName).")
    path: str = Field(description="The run's folder, relative to the claim's root: <namespace>/<name>/<uid prefix>.")


class SweepFrontierEntry(ApiModel):
    """The frontier at one combination of the other axes: the largest value of the last axis that fits there (it and
    every smaller value)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    at: dict[str, float] = Field(default_factory=dict, description="The other axes' values, by field (empty with one "
                                 "axis).")
    field: str = Field(description="The last axis's field (e.g. replay.stretch.maxTokens).")
    value: float | None = Field(default=None, description="The largest value that fits with every smaller one; "
                                "absent when none does (or none is known yet).")
    complete: bool = Field(default=False, description="Whether this line's search has finished (else: so far).")


class SweepProgress(ApiModel):
    """A sweep's progress (spec.sweep), published by the runtime after every point."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    points_done: int = Field(default=0, description="Points measured (run, or kept from before a suspend).")
    grid_points: int | None = Field(default=None, description="Points of a full grid (the frontier search runs "
                                    "fewer).")
    finished: bool = Field(default=False, description="Whether the search has finished.")
    out_of_memory: int = Field(default=0, description="Points that ran out of memory (recorded; the sweep went on).")
    frontier: list[SweepFrontierEntry] = Field(default_factory=list, description="The frontier so far.")
    summary: str | None = Field(default=None, max_length=512, description="The frontier in one line, e.g. "
                                "replay.stretch.maxTokens <= 65536.")


PHASES = ("Pending", "Verifying", "Launching", "Running", "Succeeded", "Failed", "Suspended")


class ForgeReplayJobStatus(ApiModel):
    """Observed state, written by the operator."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Literal["Pending", "Verifying", "Launching", "Running", "Succeeded", "Failed", "Suspended"] | None = (
        Field(default=None, description="Pending, Verifying, Launching, Running, Succeeded, Failed or Suspended.")
    )
    observed_generation: int | None = Field(default=None, description="The spec generation last acted on.")
    launched_generation: int | None = Field(
        default=None,
        description="The spec generation the job's objects were created from; once set, the API server refuses "
        "a change to any spec field but suspend.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Reconciling, Stalled and more.")
    ray_job_name: str | None = Field(default=None, description="The KubeRay RayJob running the replay.")
    ray_cluster_name: str | None = Field(default=None, description="The RayCluster KubeRay created.")
    rollouts: RolloutProgress | None = Field(default=None, description="Rollouts completed out of the total.")
    memory: MemoryPeak | None = Field(
        default=None, description="Memory peak published by the runtime (source says what it measures)."
    )
    fallbacks: int | None = Field(default=None, description="Rollouts trained from rollout 0's file (fallback).")
    masked_out_samples: int | None = Field(
        default=None, description="Samples trained so far whose loss mask is all zeros (slime accepts them; they "
        "add no loss token)."
    )
    rollout_id_mismatches: int | None = Field(
        default=None, description="Rollouts whose dump holds a rollout_id other than the one its file stands for."
    )
    start_time: str | None = Field(default=None, description="When the RayJob started (RFC 3339).")
    admission_time: str | None = Field(
        default=None, description="When the job was let start (RFC 3339): with spec.scheduling.queueName, when Kueue "
        "admitted its RayJob (as the operator saw it un-suspended); without, when its RayJob was created."
    )
    first_step_time: str | None = Field(
        default=None, description="When the runtime first reported a rollout trained (RFC 3339)."
    )
    completion_time: str | None = Field(default=None, description="When the job finished (RFC 3339).")
    message: str | None = Field(default=None, description="What is happening now, or why it failed.")
    results: ResultsLocation | None = Field(
        default=None, description="Where this run's reports are on the results claim (absent without a claim)."
    )
    expectations: list[ExpectationResult] | None = Field(
        default=None, description="The verdict on spec.expect, one entry per check (once the run has ended)."
    )
    outcome: Outcome | None = Field(
        default=None, description="How the run ended, as a memory test reads it (once it has ended): fits, "
        "overBudget (peak above spec.expect.maxPeakMemoryGiB), outOfMemory, or failed."
    )
    out_of_memory: OutOfMemory | None = Field(
        default=None, description="With outcome outOfMemory: which signal, where, when and how much."
    )
    sweep: SweepProgress | None = Field(
        default=None, description="With spec.sweep: points done out of the grid's, out-of-memory points, the frontier "
        "so far (published after every point; kept across a suspend)."
    )
