"""The parts of a ForgeReplayJob's spec: what is replayed, the model, the trainer, the sglang engines, fault
tolerance, scheduling, what goes on every pod, results and expectations. ``forge_replay.api.job`` composes them
into ForgeReplayJobSpec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from forge_replay.api.base import ApiModel, FiniteFloat, Int, described
from forge_replay.api.engine_args import engine_args_problems
from forge_replay.api.expect_parts import BandSpec, HistorySpec, WindowSpec
from forge_replay.api.metrics import ROLLOUT_METRICS  # noqa: F401 - read from here too
from forge_replay.api.names import (
    DNS1123_SUBDOMAIN,
    IMAGE_REFERENCE,
    Annotations,
    Labels,
    Problem,
    SpecInvalid,
    checked_image,
)
from forge_replay.api.sweep import FrontierExpectation

MAX_PATH_LENGTH = 4096
MAX_ARGS = 512  # spec.trainer.args items: bounds the cost of the CRD's CEL rule over them
MAX_ARG_LENGTH = 1024
MAX_ENV = 128  # spec.trainer.env entries: bounds the cost of the CRD's CEL rule over them
FT_COMPONENTS = ("train", "rollout")
INT32_MAX = 2**31 - 1  # Kubernetes int32 fields (e.g. RayJob.spec.ttlSecondsAfterFinished)
MAX_SAMPLES_PER_PROMPT = 4096  # GRPO groups are 8-512 in practice; --synth-missing writes 4 prompts x this


class DumpsSpec(ApiModel):
    """Where the rollout dumps are."""

    claim_name: str = Field(
        description="PersistentVolumeClaim holding the dumps; always mounted read-only.",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
    )
    path: str = Field(
        description=(
            "Dump file relative to the PVC root: a literal path (reused for every rollout) or a template "
            "whose only placeholder is {rollout_id} (rollout N reads rollout_id=N, eval N reads eval_N)."
        ),
        min_length=1,
        max_length=MAX_PATH_LENGTH,
    )
    fallback_to_first: bool = Field(
        default=True,
        description=(
            "Training only: a missing rollout file falls back to rollout 0's file. Every fallback is "
            "logged, counted and reported."
        ),
    )


class VerifyResources(ApiModel):
    """CPU and memory of the verify Job, which runs `forge-replay dumps verify --jobs <cpus>`: one worker process per
    CPU, each holding one whole dump while it checks it."""

    cpus: Int = Field(
        default=2, ge=1, le=64,
        description="CPUs requested (whole CPUs): verify runs this many worker processes, one dump each at a time.",
    )
    memory_gib: Int = Field(
        default=8, ge=1, le=1024, alias="memoryGiB",
        description="Memory request and limit in GiB. A loaded dump takes several times its file size (Python lists "
        "of token ids): allow cpus x that of the largest dump (a 200 MB dump of 64k-token samples: about 2 GiB).",
    )


class StretchSpec(ApiModel):
    """The recorded samples stretched to a longer context: a team tests 64k with the dumps of its 32k run."""

    max_tokens: Int = Field(
        ge=1,
        le=INT32_MAX,
        description=(
            "Each rollout's longest sample is stretched to this many tokens (prompt + response) and every other "
            "sample keeps its share of that length (its total scaled by maxTokens / the longest's, rounded down): "
            "responses are tiled (repeated) to their scaled length, and loss masks, log probs and every other "
            "per-token field are tiled in step; prompts, rewards and groups are kept. It must be at least the longest "
            "recorded sample (stretching never shortens) and at most the model's max_position_embeddings, checked "
            "before any GPU is requested. builtin trainer only."
        ),
    )


class ReplaySpec(ApiModel):
    """What is replayed and how."""

    mode: Literal["forge", "debug"] = Field(
        description=(
            "forge: sglang engines are started and kept alive (router, health, weight sync) while rollouts "
            "are replayed; debug: train from the dumps with no sglang at all."
        )
    )
    dumps: DumpsSpec = described("Location of the rollout dumps (slime/miles save_debug_rollout_data format).")
    num_rollouts: Int = Field(ge=1, le=1_000_000, description="Number of rollouts (training steps) to replay.")
    start_rollout_id: Int = Field(default=0, ge=0, le=1_000_000, description="First rollout id replayed.")
    eval_interval: Int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description=(
            "Evaluate after rollout N when (N + 1) % evalInterval == 0, as slime does, reading the eval_N dump "
            "(no fallback): evalInterval 4 over rollouts 0-7 reads eval_3 and eval_7. 0 disables eval. slime / "
            "miles: forge mode only (they never evaluate in debug mode), and spec.trainer.args must configure an eval "
            "dataset (--eval-prompt-data or --eval-config), which they require and the replay never reads."
        ),
    )
    eval_before_train: bool = Field(
        default=False,
        description=(
            "Also evaluate before the first training step, as slime's and miles' train.py do (on by default "
            "there, --skip-eval-before-train turns it off); only with evalInterval > 0. builtin and slime: only "
            "when the run starts at rollout 0, reading eval_0 (a run started later does not); miles: before its "
            "first step whatever it is, reading eval_<startRolloutId>."
        ),
    )
    verify: bool = Field(
        default=True,
        description="Check that every needed dump exists and loads safely before any GPU is requested.",
    )
    verify_resources: VerifyResources = Field(
        default_factory=VerifyResources,
        description="CPU and memory of the verify Job (with replay.verify); it checks that many dumps in parallel.",
    )
    reward_key: str | None = Field(
        default=None, max_length=253, description="Key of the reward to train on when dump rewards are dicts."
    )
    eval_reward_key: str | None = Field(
        default=None,
        max_length=253,
        description="Key of the reward reported for eval when dump rewards are dicts (defaults to rewardKey).",
    )
    stretch: StretchSpec | None = Field(
        default=None,
        description=(
            "Replay the recorded samples stretched to a longer context (see maxTokens): the dumps' own shape "
            "(prompt / response split, rewards, groups) at the length under test. Recorded in report.json."
        ),
    )
    loader: Literal["forgeReplay", "upstream"] = Field(
        default="forgeReplay",
        description=(
            "slime / miles backends: forgeReplay (forge-replay's safe loader as the rollout function) or upstream "
            "(slime's forge_load, or --load-debug-rollout-data in debug mode; these unpickle the dumps with "
            "torch.load(weights_only=False), which runs any code a dump carries)."
        ),
    )


class ModelSpec(ApiModel):
    """The trained model: a config (random init, enough for memory tests) or a checkpoint on a PVC."""

    config: dict[str, Any] | None = Field(
        default=None,
        description="Hugging Face model config (as in config.json); the weights are randomly initialized.",
    )
    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="PersistentVolumeClaim holding the checkpoint; mounted read-only. Needed with path.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="Hugging Face checkpoint directory relative to the claim's root.",
    )


class TrainerSpec(ApiModel):
    """The trainer: the builtin FSDP trainer, or the team's own slime / miles script with replay flags injected."""

    backend: Literal["builtin", "slime", "miles"] = Field(
        default="builtin",
        description=(
            "builtin: forge-replay's FSDP trainer. slime | miles: the team's image runs its own script "
            "(cd workingDir && python3 script args...), forge-replay appends the replay, layout and rollout flags."
        ),
    )
    image: str = Field(
        default="",
        max_length=1024,
        description="slime / miles: the team's image; every Ray pod (the submitter too) runs it. Required there. "
        "An image reference: [registry[:port]/]path[:tag][@digest], the path lowercase.",
        json_schema_extra={"pattern": f"^$|{IMAGE_REFERENCE}"},
    )
    working_dir: str = Field(
        default="",
        max_length=MAX_PATH_LENGTH,
        description="slime / miles: absolute folder in the image the script runs in (e.g. /root/slime), without "
        "'..'. Required there.",
    )
    script: str = Field(
        default="train.py",
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="slime / miles: the training script, relative to workingDir, without '..'.",
    )
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description=(
            "slime / miles: the team's own argv (e.g. Megatron's model flags). It may not set a flag forge-replay "
            "injects, nor --num-epoch, --dump-details, --save-debug-rollout-data (miles: --fully-async, "
            "--ci-inject-rollout-data-path)."
        ),
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description=(
            "slime / miles: environment variables merged into the Ray job's runtime env (env_vars), over the "
            "defaults PYTHONPATH=/root/Megatron-LM/ and CUDA_DEVICE_MAX_CONNECTIONS=1. A PYTHONPATH here replaces "
            "the default one (give /root/Megatron-LM/ again if the script needs it), and forge-replay's package "
            "folder is always appended to it. Names are letters, digits and '_' (not starting with a digit); "
            "RAY_ADDRESS and FORGE_REPLAY_PROBE_DIR are the job's own."
        ),
    )
    nodes: Int = Field(default=1, ge=1, le=4096, description="Trainer nodes (Ray worker pods).")
    gpus_per_node: Int = Field(
        default=8, ge=0, le=64, description="GPUs per trainer node; 0 trains on CPUs (local runs, smoke tests)."
    )
    micro_batch_tokens: Int = Field(
        default=65536, ge=1, le=INT32_MAX, description="Micro-batches are packed with samples up to this many tokens."
    )
    gradient_checkpointing: bool = Field(default=True, description="Recompute activations in the backward pass.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        default="bfloat16",
        description="Compute dtype (FSDP2 mixed precision); master weights and AdamW state stay float32.",
    )
    learning_rate: FiniteFloat = Field(default=1.0e-6, gt=0, description="AdamW learning rate.")
    clip_eps: FiniteFloat = Field(default=0.2, gt=0, description="Lower PPO/GRPO ratio clip: ratio >= 1 - clipEps.")
    clip_eps_high: FiniteFloat | None = Field(
        default=None, gt=0, description="Upper ratio clip: ratio <= 1 + clipEpsHigh; defaults to clipEps."
    )
    n_samples_per_prompt: Int | None = Field(
        default=None,
        ge=1,
        le=MAX_SAMPLES_PER_PROMPT,
        description=(
            "GRPO group size (consecutive samples); when unset, samples are grouped by their group_index."
        ),
    )
    normalize_advantage_std: bool = Field(
        default=True, description="Divide group-centred rewards by the group's std (+1e-6)."
    )
    seed: Int = Field(default=1234, ge=0, le=INT32_MAX, description="Random seed (model init, data order).")
    memory_snapshot: bool = Field(
        default=False, description="On GPU, also write a torch CUDA memory snapshot per rank to the results."
    )

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        return checked_image(value)

    @model_validator(mode="after")
    def _default_clip_eps_high(self) -> TrainerSpec:
        if self.clip_eps_high is None and self.backend == "builtin":  # slime / miles: not ours to set
            self.clip_eps_high = self.clip_eps
        return self


class RolloutSpec(ApiModel):
    """The sglang engines kept alive in forge mode."""

    num_gpus: Int = Field(ge=1, le=65536, description="GPUs for all engines together.")
    num_gpus_per_engine: Int = Field(ge=1, le=64, description="GPUs per engine; must divide numGpus.")
    server_concurrency: Int = Field(
        default=512, ge=1, le=INT32_MAX, description="Concurrent requests per engine server."
    )
    colocate: bool = Field(default=False, description="Engines share the trainer's GPUs.")
    weight_sync: Literal["auto", "disk", "tensor", "distributed"] = Field(
        default="auto",
        description=(
            "How the trainer's weights reach the engines after every step: disk (/update_weights_from_disk, "
            "a checkpoint staged on each engine's node), tensor (/update_weights_from_tensor, CUDA IPC; needs "
            "colocate), distributed (/init_weights_update_group + /update_weights_from_distributed, a NCCL "
            "broadcast from trainer rank 0; gloo on CPU). auto: tensor when colocated, distributed on GPUs, "
            "disk on CPU."
        ),
    )
    engine_args: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'Extra sglang server arguments, passed as "--key value" (e.g. mem-fraction-static: "0.7"). A key is one '
            "of the pinned sglang's server argument names, exactly (no abbreviation, no '='), and never one "
            'forge-replay sets (host, port, model-path, tp-size, base-gpu-id); "true" or "" passes an on/off '
            'switch alone, "false" leaves it out.'
        ),
    )

    @field_validator("engine_args", mode="before")
    @classmethod
    def _scalars_as_strings(cls, value: Any) -> Any:
        # YAML users write `context-length: 65536`; sglang receives text either way.
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if isinstance(item, bool):
                    out[key] = "true" if item else "false"
                elif isinstance(item, (int, float)):
                    out[key] = str(item)
                else:
                    out[key] = item
            return out
        return value

    @field_validator("engine_args")
    @classmethod
    def _passable_engine_args(cls, value: dict[str, str]) -> dict[str, str]:
        problems = engine_args_problems(value)
        if problems:
            raise SpecInvalid([Problem(path, message) for path, message in problems])
        return value

    @property
    def num_engines(self) -> int:
        """Number of engine servers."""
        return self.num_gpus // self.num_gpus_per_engine


class HealthCheckSpec(ApiModel):
    """Engine health probes (rollout-side fault tolerance)."""

    interval_seconds: Int = Field(default=30, ge=1, le=86400, description="Seconds between /health_generate probes.")
    timeout_seconds: Int = Field(default=30, ge=1, le=86400, description="Seconds before a probe counts as failed.")
    first_wait_seconds: Int = Field(default=0, ge=0, le=86400, description="Seconds to wait before the first probe.")


class FaultToleranceSpec(ApiModel):
    """Fault tolerance; rollout-side lifecycle work runs only when `rollout` is among the components."""

    enabled: bool = Field(default=False, description="Turn fault tolerance on.")
    components: list[Literal["train", "rollout"]] | None = Field(
        default=None,
        max_length=2,
        description="Subset of {train, rollout}; [rollout] when enabled and unset. Only allowed when enabled.",
    )
    health_check: HealthCheckSpec = Field(
        default_factory=HealthCheckSpec, description="Engine health probe timing."
    )

    @property
    def active_components(self) -> list[str]:
        """The components fault tolerance acts on (empty when disabled)."""
        if not self.enabled:
            return []
        return list(self.components) if self.components is not None else ["rollout"]


class Toleration(ApiModel):
    """A Kubernetes toleration (core/v1)."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value (with operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; all effects when empty."
    )
    toleration_seconds: Int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class SchedulingSpec(ApiModel):
    """Where the GPU pods land."""

    node_selector: Labels = Field(
        default_factory=dict, description="Node labels for the GPU pods (e.g. nvidia.com/gpu.product: NVIDIA-H200)."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations for the GPU pods.")
    priority_class_name: str = Field(
        default="", max_length=253, description="PriorityClass of the Ray pods (head and workers)."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity) for the GPU pods.",
    )
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Kubernetes TopologySpreadConstraints for the GPU pods (e.g. spread engines across racks).",
    )
    queue_name: str = Field(
        default="",
        max_length=63,
        description="Kueue LocalQueue: sets kueue.x-k8s.io/queue-name and creates the RayJob suspended.",
    )
    start_deadline_seconds: Int | None = Field(
        default=None, ge=1, le=INT32_MAX,
        description="Seconds the job may wait to run, from its admission by Kueue (with queueName) or from its "
        "creation (without), unschedulable pods included; past it the job fails with reason StartDeadlineExceeded "
        "and its Ray cluster is deleted. Unset: it may wait forever.",
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the job's namespace (e.g. an image pull Secret)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="The object's name.")


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, description="The Secret's or ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, description="The key.")
    optional: bool | None = Field(default=None, description="Start the pod even when the key is missing.")


class FieldRef(ApiModel):
    """A field of the pod (e.g. metadata.name, status.podIP)."""

    field_path: str = Field(min_length=1, description="The pod field, e.g. metadata.name.")
    api_version: str | None = Field(default=None, description="Schema version of fieldPath (default v1).")


class ResourceFieldRef(ApiModel):
    """A container's resource request or limit."""

    resource: str = Field(min_length=1, description="e.g. limits.memory.")
    container_name: str | None = Field(default=None, description="The container (default: this one).")
    divisor: str | None = Field(default=None, description="Unit of the exposed value, e.g. 1Mi.")


class EnvVarSource(ApiModel):
    """A Kubernetes EnvVarSource: exactly one of its references."""

    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldRef | None = Field(default=None, description="A resource of a container.")


class EnvVar(ApiModel):
    """A Kubernetes EnvVar: ``value``, or ``valueFrom`` (secretKeyRef, configMapKeyRef, fieldRef, ...)."""

    name: str = Field(min_length=1, max_length=1024, description="Environment variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from instead.")


class PodSettings(ApiModel):
    """What goes on every pod the job creates: the verify Job, the Ray head, every worker, the submitter."""

    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets to pull the runtime image with (also on the runtime ServiceAccount)."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables of every container.")
    annotations: Annotations = Field(default_factory=dict, description="Extra annotations of every pod.")
    labels: Labels = Field(
        default_factory=dict, description="Extra labels of every pod (forge-replay's own labels win)."
    )
    extra_resources: dict[str, str] = Field(
        default_factory=dict,
        description='Extra resource limits (and requests) of every GPU container, e.g. {"rdma/ib": "1"}.',
    )


class ResultsSpec(ApiModel):
    """Where reports go."""

    claim_name: str = Field(
        default="",
        max_length=253,
        description="Optional PVC (read-write) for reports: memory report JSON, plots, snapshots.",
    )

    @field_validator("claim_name")
    @classmethod
    def _dns_or_empty(cls, value: str) -> str:
        import re

        if value and not re.match(DNS1123_SUBDOMAIN, value):
            raise ValueError(f"{value!r} is not a valid PVC name (a DNS-1123 subdomain: lowercase, digits, '-', '.')")
        return value


class BaselineSpec(ApiModel):
    """An earlier run's report.json whose per-rollout metrics this run must reproduce."""

    config_map_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="ConfigMap (in the job's namespace) holding the baseline under the data key report.json "
        "(`forge-replay report baseline REPORT.json --name NAME` prints one). Or claimName + path.",
    )
    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="PersistentVolumeClaim holding the baseline report (mounted read-only); needs path.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="The baseline report.json, relative to the claim's root.",
    )
    metrics: list[Literal[ROLLOUT_METRICS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["loss", "grad_norm"],
        min_length=1,
        max_length=len(ROLLOUT_METRICS),
        description="Per-rollout numeric fields of report.json compared rollout by rollout.",
    )
    rtol: FiniteFloat = Field(default=1.0e-5, ge=0, description="Relative tolerance: |run - baseline| <= "
                              "atol + rtol * |baseline|.")
    atol: FiniteFloat = Field(default=1.0e-8, ge=0, description="Absolute tolerance (see rtol).")
    allow_different: bool = Field(
        default=False,
        description="Compare with a baseline of another replay mode or model (report.json's identity): a warning "
        "instead of the failed check baseline.identity.",
    )
    bands: list[BandSpec] = Field(
        default_factory=list,
        max_length=32,
        description="Two-sided bands around the statistics of the baseline's runs (`forge-replay report baseline` "
        "of several reports), for figures that vary run to run: step times, memory peaks (check "
        "baseline.<metric>.band / .peakPerRank). metrics keeps its exact comparison.",
    )
    history: HistorySpec | None = Field(
        default=None,
        description="Instead of configMapName or claimName + path: the last N trusted runs of the job's identity on "
        "the results claim (spec.results.claimName), read when the run ends (check baseline.history).",
    )


class ExpectSpec(ApiModel):
    """Release-validation verdict: limits checked when the run ends (the memory budget after every step too).
    Each check is one entry of status.expectations; any failed one fails the job (ExpectationsMet=False)."""

    max_peak_memory_gib: FiniteFloat | None = Field(
        default=None,
        gt=0,
        alias="maxPeakMemoryGiB",
        description="The run's peak memory (GPU: peak CUDA reserved of any rank; CPU: peak RSS) must stay at or "
        "under this many GiB; checked after every step, a run over budget stops early.",
    )
    max_fallbacks: Int | None = Field(
        default=None, ge=0, le=1_000_000, description="At most this many rollouts trained on rollout 0's file."
    )
    min_tokens_per_second: FiniteFloat | None = Field(
        default=None, ge=0, description="Training throughput (tokens over step time) must reach this."
    )
    baseline: BaselineSpec | None = Field(
        default=None, description="Per-rollout metrics of an earlier run's report.json to reproduce."
    )
    outcome: Literal["fits", "outOfMemory"] | None = Field(
        default=None,
        description="The outcome the run must have: fits (the default meaning of a memory test), or outOfMemory: a "
        "known-too-big configuration must still run out of memory (the job then Succeeds when it does, and fails "
        "when it fits).",
    )
    windows: list[WindowSpec] = Field(
        default_factory=list,
        max_length=32,
        description="Checks over a window of the run's rollouts: the mean (or max, min) of a metric over the last "
        "k rollouts (or the whole run) at most / at least a value (check window.<statistic>.<metric>).",
    )
    enforce: bool = Field(
        default=True,
        description="false: shadow mode. The verdict is computed and recorded (report.json, status.expectations, "
        "ExpectationsMet=False with reason ExpectationsNotMetShadow) but a failed check, the outcome's too, "
        "does not fail the job: roll a new gate out without blocking releases, then enforce it.",
    )
    frontier: list[FrontierExpectation] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="With spec.sweep: frontiers the sweep must reach, e.g. {at: {trainer.microBatchTokens: 32768}, "
        "fits: {replay.stretch.maxTokens: 65536}}: at that value of every other axis, the largest value of the last "
        "axis that fits (it and every smaller one) is at least 65536.",
    )
