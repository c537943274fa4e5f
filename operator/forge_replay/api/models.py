"""ForgeReplayJob v1alpha1: the pydantic models are the single source of truth for the API.

The CRD schema (``forge_replay.api.crd``) is generated from these models, and the cross-field
rules below carry both their Python check and their CEL twin, so the API server and the operator
refuse the same specs with the same field path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from forge_replay.api.dump_path import is_template, path_problem
from forge_replay.api.engine_args import engine_args_problems
from forge_replay.frameworks.flags import (
    BACKEND_INJECTED, BACKENDS, REFUSED_FLAGS, arg_problems, flag_table, missing_required, required_flags, sets_flag,
)
from forge_replay.frameworks.rules import upstream_rule
from forge_replay.errors import Portable

GROUP = "forgereplay.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ForgeReplayJob"
PLURAL = "forgereplayjobs"
SINGULAR = "forgereplayjob"
SHORT_NAMES = ["frj"]
CATEGORIES = ["forge-replay"]

MAX_NAME_LENGTH = 47  # KubeRay's RayJob name limit
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MAX_PATH_LENGTH = 4096
MAX_ARGS = 512  # spec.trainer.args items: bounds the cost of the CRD's CEL rule over them
MAX_ARG_LENGTH = 1024

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (
    rf"^(?:(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?$"
)
"""An image reference as the container runtime parses one (github.com/distribution/reference: [domain[:port]/]path
[:tag][@digest], the path lowercase)."""

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""An environment variable name a shell and Ray's runtime env both take."""
MAX_ENV = 128  # spec.trainer.env entries: bounds the cost of the CRD's CEL rule over them
RESERVED_ENV = {
    "RAY_ADDRESS": "the script reaches the job's own Ray cluster through it (KubeRay, or forge-replay run, sets it)",
    "FORGE_REPLAY_PROBE_DIR": "the memory probe writes where forge-replay sets it (the results folder)",
}
"""spec.trainer.env keys the job's wiring owns."""

FT_COMPONENTS = ("train", "rollout")
INT32_MAX = 2**31 - 1  # Kubernetes int32 fields (e.g. RayJob.spec.ttlSecondsAfterFinished)
MAX_SAMPLES_PER_PROMPT = 4096  # GRPO groups are 8-512 in practice; --synth-missing writes 4 prompts x this

Int = Annotated[int, Strict()]
"""An integer as the API server reads one: no bool, no '4', no 4.0."""
FiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]
"""A number that JSON (and so the API server) can carry: no .inf, no .nan, no '1e-6' string."""

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUALIFIED_NAME = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
TOTAL_ANNOTATION_BYTES = 256 * 1024  # k8s.io/apimachinery ValidateAnnotationsSize


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label/annotation key (a qualified name), or None
    (k8s.io/apimachinery/pkg/util/validation: IsQualifiedName)."""
    import re

    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return f"key {_short(key)} has more than one '/'"
    if "/" in key and not (len(prefix) <= 253 and re.fullmatch(DNS1123_SUBDOMAIN, prefix)):
        return f"key {_short(key)}: the prefix before '/' must be a DNS-1123 subdomain of at most 253 characters"
    if not (len(name) <= 63 and re.fullmatch(_QUALIFIED_NAME, name)):
        return (f"key {_short(key)}: the name must be 1-63 characters of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value, or None (IsValidLabelValue)."""
    import re

    if value and not (len(value) <= 63 and re.fullmatch(_QUALIFIED_NAME, value)):
        return (f"value {_short(value)} must be empty or 1-63 characters of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit")
    return None


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _checked_image(value: str) -> str:
    """``value`` when it is empty or an image reference; SpecInvalid naming the field otherwise."""
    import re

    if value and not re.fullmatch(IMAGE_REFERENCE, value):
        raise SpecInvalid([Problem("", f"{_short(value)} is not an image reference "
                                   "([registry[:port]/]path[:tag][@digest], the path lowercase, no spaces)")])
    return value


def _check_labels(value: dict[str, str]) -> dict[str, str]:
    problems = [Problem(key, why) for key, item in value.items()
                for why in (label_key_problem(key), label_value_problem(item)) if why]
    if problems:
        raise SpecInvalid(problems)
    return value


def _check_annotations(value: dict[str, str]) -> dict[str, str]:
    problems = [Problem(key, why) for key in value if (why := label_key_problem(key))]
    size = sum(len(k) + len(v) for k, v in value.items())
    if size > TOTAL_ANNOTATION_BYTES:
        problems.append(Problem("", f"{size} bytes of annotations; the API server allows {TOTAL_ANNOTATION_BYTES}"))
    if problems:
        raise SpecInvalid(problems)
    return value


Labels = Annotated[dict[str, str], AfterValidator(_check_labels)]
"""Label keys and values as the API server checks them (also node selectors)."""
Annotations = Annotated[dict[str, str], AfterValidator(_check_annotations)]
"""Annotation keys and total size as the API server checks them."""


@dataclass(frozen=True)
class Problem:
    """One reason a spec is refused: a dotted field path (camelCase, as in YAML) and a message."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecInvalid(Portable, ValueError):
    """A ForgeReplayJob (or a part of one) breaks the API rules; ``problems`` says where and why."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class _Model(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignment validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
    )


def _desc(text: str) -> Any:
    return Field(description=text)


# ----------------------------------------------------------------------------------- spec parts


class DumpsSpec(_Model):
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


class VerifyResources(_Model):
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


class ReplaySpec(_Model):
    """What is replayed and how."""

    mode: Literal["forge", "debug"] = Field(
        description=(
            "forge: sglang engines are started and kept alive (router, health, weight sync) while rollouts "
            "are replayed; debug: train from the dumps with no sglang at all."
        )
    )
    dumps: DumpsSpec = _desc("Location of the rollout dumps (slime/miles save_debug_rollout_data format).")
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
    loader: Literal["forgeReplay", "upstream"] = Field(
        default="forgeReplay",
        description=(
            "slime / miles backends: forgeReplay (forge-replay's safe loader as the rollout function) or upstream "
            "(slime's forge_load, or --load-debug-rollout-data in debug mode; these unpickle the dumps with "
            "torch.load(weights_only=False), which runs any code a dump carries)."
        ),
    )


class ModelSpec(_Model):
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


class TrainerSpec(_Model):
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
        return _checked_image(value)

    @model_validator(mode="after")
    def _default_clip_eps_high(self) -> TrainerSpec:
        if self.clip_eps_high is None and self.backend == "builtin":  # slime / miles: not ours to set
            self.clip_eps_high = self.clip_eps
        return self


class RolloutSpec(_Model):
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


class HealthCheckSpec(_Model):
    """Engine health probes (rollout-side fault tolerance)."""

    interval_seconds: Int = Field(default=30, ge=1, le=86400, description="Seconds between /health_generate probes.")
    timeout_seconds: Int = Field(default=30, ge=1, le=86400, description="Seconds before a probe counts as failed.")
    first_wait_seconds: Int = Field(default=0, ge=0, le=86400, description="Seconds to wait before the first probe.")


class FaultToleranceSpec(_Model):
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


class Toleration(_Model):
    """A Kubernetes toleration (core/v1)."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value (with operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; all effects when empty."
    )
    toleration_seconds: Int | None = Field(default=None, description="How long a NoExecute taint is tolerated.")


class SchedulingSpec(_Model):
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


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace (e.g. an image pull Secret)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="The object's name.")


class KeyRef(_Model):
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, description="The Secret's or ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, description="The key.")
    optional: bool | None = Field(default=None, description="Start the pod even when the key is missing.")


class FieldRef(_Model):
    """A field of the pod (e.g. metadata.name, status.podIP)."""

    field_path: str = Field(min_length=1, description="The pod field, e.g. metadata.name.")
    api_version: str | None = Field(default=None, description="Schema version of fieldPath (default v1).")


class ResourceFieldRef(_Model):
    """A container's resource request or limit."""

    resource: str = Field(min_length=1, description="e.g. limits.memory.")
    container_name: str | None = Field(default=None, description="The container (default: this one).")
    divisor: str | None = Field(default=None, description="Unit of the exposed value, e.g. 1Mi.")


class EnvVarSource(_Model):
    """A Kubernetes EnvVarSource: exactly one of its references."""

    secret_key_ref: KeyRef | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldRef | None = Field(default=None, description="A resource of a container.")


class EnvVar(_Model):
    """A Kubernetes EnvVar: ``value``, or ``valueFrom`` (secretKeyRef, configMapKeyRef, fieldRef, ...)."""

    name: str = Field(min_length=1, max_length=1024, description="Environment variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from instead.")


class PodSettings(_Model):
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


class ResultsSpec(_Model):
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


ROLLOUT_METRICS = (
    "loss", "grad_norm", "clip_fraction", "reward_mean", "tokens", "loss_tokens", "num_samples", "micro_batches",
    "masked_out_samples", "multimodal_ignored_samples",
)
"""The per-rollout numeric fields of report.json a baseline can compare (the deterministic ones: step times
and memory vary run to run)."""


class BaselineSpec(_Model):
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


class ExpectSpec(_Model):
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


# ------------------------------------------------------------------------------- cross-field rules


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several fields: its Python check and its CEL twin for the CRD.

    ``at`` is the schema node (dotted, relative to spec; "" is spec itself) that carries the CEL rule,
    ``field_path`` the CEL fieldPath relative to that node, ``check`` returns the problems of a spec.
    """

    at: str
    cel: str
    message: str
    field_path: str
    check: Callable[[ForgeReplayJobSpec], list[Problem]]


def _forge_needs_rollout(spec: ForgeReplayJobSpec) -> list[Problem]:
    if spec.replay.mode == "forge" and spec.rollout is None:
        return [Problem("spec.rollout", "required in forge mode (the sglang engines kept alive while replaying)")]
    return []


def _debug_forbids_rollout(spec: ForgeReplayJobSpec) -> list[Problem]:
    if spec.replay.mode == "debug" and spec.rollout is not None:
        return [Problem("spec.rollout", "must be absent in debug mode: debug replay never starts sglang engines")]
    return []


def _engines_divide(spec: ForgeReplayJobSpec) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.num_gpus % r.num_gpus_per_engine:
        return [
            Problem(
                "spec.rollout.numGpusPerEngine",
                f"must divide spec.rollout.numGpus ({r.num_gpus} is not divisible by {r.num_gpus_per_engine})",
            )
        ]
    return []


def _tensor_sync_needs_colocate(spec: ForgeReplayJobSpec) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.weight_sync == "tensor" and not r.colocate:
        return [Problem("spec.rollout.weightSync",
                        "tensor needs colocate: true (CUDA IPC handles reach only engines on the trainer's GPUs); "
                        "use distributed or disk for separate engine GPUs")]
    return []


def _distributed_sync_forbids_colocate(spec: ForgeReplayJobSpec) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.weight_sync == "distributed" and r.colocate:
        return [Problem("spec.rollout.weightSync",
                        "distributed cannot be used with colocate: true (NCCL refuses two ranks on one GPU); "
                        "use tensor, disk or auto")]
    return []


def _colocate_fits(spec: ForgeReplayJobSpec) -> list[Problem]:
    r, t = spec.rollout, spec.trainer
    if r is not None and r.colocate and r.num_gpus > t.nodes * t.gpus_per_node:
        return [
            Problem(
                "spec.rollout.numGpus",
                f"colocated engines share the trainer's GPUs: {r.num_gpus} is more than "
                f"spec.trainer.nodes x spec.trainer.gpusPerNode = {t.nodes * t.gpus_per_node}",
            )
        ]
    return []


def _components_need_enabled(spec: ForgeReplayJobSpec) -> list[Problem]:
    ft = spec.fault_tolerance
    if not ft.enabled and ft.components:
        return [
            Problem(
                "spec.faultTolerance.components",
                "given while spec.faultTolerance.enabled is false; set enabled: true or remove components",
            )
        ]
    return []


def _components_nonempty(spec: ForgeReplayJobSpec) -> list[Problem]:
    ft = spec.fault_tolerance
    if ft.enabled and ft.components is not None and not ft.components:
        return [Problem("spec.faultTolerance.components", "must select at least one of train, rollout when enabled")]
    return []


def _components_unique(spec: ForgeReplayJobSpec) -> list[Problem]:
    comps = spec.fault_tolerance.components or []
    repeated = sorted({c for c in comps if comps.count(c) > 1})
    if repeated:
        return [Problem("spec.faultTolerance.components", f"repeats {', '.join(repeated)}; list each component once")]
    return []


def _no_rollout_ft_in_debug(spec: ForgeReplayJobSpec) -> list[Problem]:
    ft = spec.fault_tolerance
    if spec.replay.mode == "debug" and "rollout" in ft.active_components:
        how = "is selected" if ft.components is not None else "is the default when components is unset"
        return [
            Problem(
                "spec.faultTolerance.components",
                f"rollout {how}, but debug mode has no engines to watch; use components: [train]",
            )
        ]
    return []


def _dumps_path_ok(spec: ForgeReplayJobSpec) -> list[Problem]:
    problem = path_problem(spec.replay.dumps.path)
    return [Problem("spec.replay.dumps.path", problem)] if problem else []


def _eval_before_train_needs_eval(spec: ForgeReplayJobSpec) -> list[Problem]:
    rp = spec.replay
    if rp.eval_before_train and rp.eval_interval == 0:
        return [Problem("spec.replay.evalBeforeTrain", "needs evalInterval > 0 (eval is off), as slime's "
                        "eval before training needs an eval interval")]
    return []


def _eval_needs_template(spec: ForgeReplayJobSpec) -> list[Problem]:
    rp = spec.replay
    if rp.eval_interval > 0 and not is_template(rp.dumps.path):
        return [
            Problem(
                "spec.replay.evalInterval",
                f"eval reads eval_N dumps and needs a {{rollout_id}} template in spec.replay.dumps.path "
                f"({rp.dumps.path!r} is literal); set evalInterval: 0 or use a template",
            )
        ]
    return []


def _model_one_source(spec: ForgeReplayJobSpec) -> list[Problem]:
    m = spec.model
    if (m.config is None) == (m.path is None):
        which = "both are set" if m.config is not None else "neither is set"
        return [Problem("spec.model", f"needs exactly one of config and path ({which})")]
    return []


def _model_path_needs_claim(spec: ForgeReplayJobSpec) -> list[Problem]:
    m = spec.model
    if m.path is not None and m.claim_name is None:
        return [Problem("spec.model.claimName", "required with spec.model.path (the PVC holding the checkpoint)")]
    return []


def _model_path_relative(spec: ForgeReplayJobSpec) -> list[Problem]:
    m = spec.model
    if m.path is not None and (m.path.startswith("/") or ".." in m.path.split("/")):
        return [Problem("spec.model.path", f"must be relative to the claim's root, without '..' ({m.path!r})")]
    return []


FOREIGN_TRAINER_UNRECORDED = {
    "maxFallbacks": "the fallbacks of its run go to its own metrics (forge_replay/fallbacks), not to forge-replay's "
                    "report",
    "minTokensPerSecond": "forge-replay does not time its training steps",
    "baseline": "forge-replay does not record its per-rollout loss and grad norm",
}
"""What spec.expect may not ask of a slime / miles run (its own train.py), and why: forge-replay records only the
memory probe's peak of such a run (backends/probe.py, backends/publish.py)."""


def _expect_foreign_trainer(spec: ForgeReplayJobSpec) -> list[Problem]:
    e, backend = spec.expect, spec.trainer.backend
    if e is None or backend == "builtin":
        return []
    asked = {"maxFallbacks": e.max_fallbacks is not None, "minTokensPerSecond": e.min_tokens_per_second is not None,
             "baseline": e.baseline is not None}
    return [Problem(f"spec.expect.{name}", f"not recorded for backend {backend}: {why} (only maxPeakMemoryGiB, from "
                    "the memory probe, can be checked)")
            for name, why in FOREIGN_TRAINER_UNRECORDED.items() if asked[name]]


def _expect_not_empty(spec: ForgeReplayJobSpec) -> list[Problem]:
    e = spec.expect
    if e is not None and all(v is None for v in (e.max_peak_memory_gib, e.max_fallbacks, e.min_tokens_per_second,
                                                 e.baseline)):
        return [Problem("spec.expect", "holds no check: give maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond or "
                        "baseline, or remove spec.expect (an empty gate would pass having checked nothing)")]
    return []


def _baseline_one_source(spec: ForgeReplayJobSpec) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and (b.config_map_name is None) == (b.path is None):
        which = "both are set" if b.config_map_name is not None else "neither is set"
        return [Problem("spec.expect.baseline", f"needs exactly one of configMapName and claimName + path ({which})")]
    return []


def _baseline_claim_with_path(spec: ForgeReplayJobSpec) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and (b.claim_name is None) != (b.path is None):
        missing = "path" if b.path is None else "claimName"
        return [Problem(f"spec.expect.baseline.{missing}",
                        "claimName and path go together (the PVC and the report.json on it)")]
    return []


def _baseline_path_relative(spec: ForgeReplayJobSpec) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and b.path is not None and (b.path.startswith("/") or ".." in b.path.split("/")):
        return [Problem("spec.expect.baseline.path", f"must be relative to the claim's root, without '..' ({b.path!r})")]
    return []


def _baseline_metrics_unique(spec: ForgeReplayJobSpec) -> list[Problem]:
    metrics = spec.expect.baseline.metrics if spec.expect and spec.expect.baseline else []
    repeated = sorted({m for m in metrics if metrics.count(m) > 1})
    if repeated:
        return [Problem("spec.expect.baseline.metrics", f"repeats {', '.join(repeated)}; list each metric once")]
    return []


_QUEUED_SUSPEND = (
    "cannot be true with spec.scheduling.queueName: Kueue suspends and resumes a queued job (it un-suspends the "
    "RayJob it admits); deactivate the job's Kueue Workload (kubectl patch workload NAME --type=merge "
    "-p '{\"spec\":{\"active\":false}}') or delete the ForgeReplayJob"
)


def _queued_never_suspended(spec: ForgeReplayJobSpec) -> list[Problem]:
    if spec.suspend and spec.scheduling.queue_name:
        return [Problem("spec.suspend", _QUEUED_SUSPEND)]
    return []


# Placeholder syntax shared with dump_path.path_problem: only {rollout_id}, braces doubled otherwise.
_CEL_TEMPLATE_OK = r"^([^{}]|\\{\\{|\\}\\}|\\{rollout_id\\})*$"
_CEL_IS_TEMPLATE = r"(^|[^{])(\\{\\{)*\\{rollout_id\\}"

CROSS_FIELD_RULES: list[CrossFieldRule] = [
    CrossFieldRule(
        "",
        "!has(self.suspend) || !self.suspend || !has(self.scheduling) || !has(self.scheduling.queueName)"
        " || self.scheduling.queueName == ''",
        f"spec.suspend: {_QUEUED_SUSPEND}",
        ".suspend",
        _queued_never_suspended,
    ),
    CrossFieldRule(
        "",
        "self.replay.mode != 'forge' || has(self.rollout)",
        "spec.rollout: required in forge mode (the sglang engines kept alive while replaying)",
        ".rollout",
        _forge_needs_rollout,
    ),
    CrossFieldRule(
        "",
        "self.replay.mode != 'debug' || !has(self.rollout)",
        "spec.rollout: must be absent in debug mode: debug replay never starts sglang engines",
        ".rollout",
        _debug_forbids_rollout,
    ),
    CrossFieldRule(
        "rollout",
        "self.numGpus % self.numGpusPerEngine == 0",
        "spec.rollout.numGpusPerEngine: must divide spec.rollout.numGpus",
        ".numGpusPerEngine",
        _engines_divide,
    ),
    CrossFieldRule(
        "",
        "!has(self.rollout) || !has(self.rollout.colocate) || !self.rollout.colocate || "
        "self.rollout.numGpus <= (has(self.trainer) && has(self.trainer.nodes) ? self.trainer.nodes : 1) * "
        "(has(self.trainer) && has(self.trainer.gpusPerNode) ? self.trainer.gpusPerNode : 8)",
        "spec.rollout.numGpus: colocated engines must fit on the trainer's GPUs (nodes x gpusPerNode)",
        ".rollout.numGpus",
        _colocate_fits,
    ),
    CrossFieldRule(
        "rollout",
        "!has(self.weightSync) || self.weightSync != 'tensor' || (has(self.colocate) && self.colocate)",
        "spec.rollout.weightSync: tensor needs colocate: true (CUDA IPC reaches only engines on the trainer's GPUs)",
        ".weightSync",
        _tensor_sync_needs_colocate,
    ),
    CrossFieldRule(
        "rollout",
        "!has(self.weightSync) || self.weightSync != 'distributed' || !has(self.colocate) || !self.colocate",
        "spec.rollout.weightSync: distributed cannot be used with colocate: true (NCCL refuses two ranks on one GPU)",
        ".weightSync",
        _distributed_sync_forbids_colocate,
    ),
    CrossFieldRule(
        "faultTolerance",
        "(has(self.enabled) && self.enabled) || !has(self.components) || size(self.components) == 0",
        "spec.faultTolerance.components: given while spec.faultTolerance.enabled is false",
        ".components",
        _components_need_enabled,
    ),
    CrossFieldRule(
        "faultTolerance",
        "!has(self.enabled) || !self.enabled || !has(self.components) || size(self.components) > 0",
        "spec.faultTolerance.components: must select at least one of train, rollout when enabled",
        ".components",
        _components_nonempty,
    ),
    CrossFieldRule(
        "faultTolerance",
        "!has(self.components) || self.components.all(c, self.components.filter(d, d == c).size() == 1)",
        "spec.faultTolerance.components: list each component once",
        ".components",
        _components_unique,
    ),
    CrossFieldRule(
        "",
        "self.replay.mode != 'debug' || !has(self.faultTolerance) || !has(self.faultTolerance.enabled) || "
        "!self.faultTolerance.enabled || "
        "(has(self.faultTolerance.components) && !('rollout' in self.faultTolerance.components))",
        "spec.faultTolerance.components: debug mode has no engines to watch; use components: [train]",
        ".faultTolerance.components",
        _no_rollout_ft_in_debug,
    ),
    CrossFieldRule(
        "replay.dumps",
        "!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)') && "
        f"self.path.matches('{_CEL_TEMPLATE_OK}') && !self.path.matches('\\\\x00|[^/]{{256,}}')",
        "spec.replay.dumps.path: must be relative, without '..' or NUL, with components of at most 255 bytes, and "
        "its only placeholder is {rollout_id}",
        ".path",
        _dumps_path_ok,
    ),
    CrossFieldRule(
        "replay",
        f"!has(self.evalInterval) || self.evalInterval == 0 || self.dumps.path.matches('{_CEL_IS_TEMPLATE}')",
        "spec.replay.evalInterval: eval reads eval_N dumps and needs a {rollout_id} template in dumps.path",
        ".evalInterval",
        _eval_needs_template,
    ),
    CrossFieldRule(
        "replay",
        "!has(self.evalBeforeTrain) || !self.evalBeforeTrain || (has(self.evalInterval) && self.evalInterval > 0)",
        "spec.replay.evalBeforeTrain: needs evalInterval > 0 (eval is off)",
        ".evalBeforeTrain",
        _eval_before_train_needs_eval,
    ),
    CrossFieldRule(
        "",
        "!has(self.expect) || !has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin' "
        "|| (!has(self.expect.maxFallbacks) && !has(self.expect.minTokensPerSecond) && !has(self.expect.baseline))",
        "spec.expect: backend slime or miles records only its memory peak: maxFallbacks, minTokensPerSecond and "
        "baseline cannot be checked (maxPeakMemoryGiB can)",
        ".expect",
        _expect_foreign_trainer,
    ),
    CrossFieldRule(
        "expect",
        "has(self.maxPeakMemoryGiB) || has(self.maxFallbacks) || has(self.minTokensPerSecond) || has(self.baseline)",
        "spec.expect: holds no check (give maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond or baseline)",
        "",
        _expect_not_empty,
    ),
    CrossFieldRule(
        "expect.baseline",
        "has(self.configMapName) != has(self.path)",
        "spec.expect.baseline: needs exactly one of configMapName and claimName + path",
        "",
        _baseline_one_source,
    ),
    CrossFieldRule(
        "expect.baseline",
        "has(self.path) == has(self.claimName)",
        "spec.expect.baseline.claimName: claimName and path go together (the PVC and the report.json on it)",
        ".claimName",
        _baseline_claim_with_path,
    ),
    CrossFieldRule(
        "expect.baseline",
        "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)'))",
        "spec.expect.baseline.path: must be relative to the claim's root, without '..'",
        ".path",
        _baseline_path_relative,
    ),
    CrossFieldRule(
        "expect.baseline",
        "!has(self.metrics) || self.metrics.all(m, self.metrics.filter(n, n == m).size() == 1)",
        "spec.expect.baseline.metrics: list each metric once",
        ".metrics",
        _baseline_metrics_unique,
    ),
    CrossFieldRule(
        "model",
        "has(self.config) != has(self.path)",
        "spec.model: needs exactly one of config and path",
        "",
        _model_one_source,
    ),
    CrossFieldRule(
        "model",
        "!has(self.path) || has(self.claimName)",
        "spec.model.claimName: required with spec.model.path",
        ".claimName",
        _model_path_needs_claim,
    ),
    CrossFieldRule(
        "model",
        "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)'))",
        "spec.model.path: must be relative to the claim's root, without '..'",
        ".path",
        _model_path_relative,
    ),
]


MUTABLE_AFTER_LAUNCH = frozenset({"suspend"})
"""The spec fields that may change once a job is launched: the operator refuses a change to any other (its
config ConfigMap keeps the launched spec) and the CRD's transition rules refuse it in the API server."""


# ----------------------------------------------------------- bring your own trainer (slime, miles)

_BYO_FIELDS = ("image", "working_dir", "script", "args", "env")
"""TrainerSpec fields that only slime / miles read."""
_BUILTIN_FIELDS = (
    "micro_batch_tokens", "gradient_checkpointing", "dtype", "learning_rate", "clip_eps", "clip_eps_high",
    "n_samples_per_prompt", "normalize_advantage_std", "seed", "memory_snapshot",
)  # fmt: skip
"""TrainerSpec fields that only the builtin trainer reads (slime / miles take theirs from args)."""


def _trainer_default(name: str) -> Any:
    return TrainerSpec.model_fields[name].get_default(call_default_factory=True)


def _alias(name: str) -> str:
    return to_camel(name)


def _byo_fields_need_backend(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.backend != "builtin":
        return []
    return [
        Problem(f"spec.trainer.{_alias(name)}", "only for backend slime or miles (the builtin trainer runs forge-replay's "
                "own image and code)")
        for name in _BYO_FIELDS
        if getattr(t, name) != _trainer_default(name)
    ]


def _builtin_fields_refused(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    return [
        Problem(f"spec.trainer.{_alias(name)}", f"means nothing to backend {t.backend}: set it in spec.trainer.args "
                "with the script's own flag, or remove it")
        for name in _BUILTIN_FIELDS
        if getattr(t, name) != _trainer_default(name)
    ]


def _byo_needs_image(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    problems = []
    if not t.image:
        problems.append(Problem("spec.trainer.image", f"required with backend {t.backend}: the team's image"))
    if not t.working_dir.startswith("/"):
        problems.append(Problem("spec.trainer.workingDir", f"required with backend {t.backend}: an absolute folder "
                                f"in the image holding the script ({t.working_dir!r})"))
    return problems


def _upstream_loader_needs_byo(spec: ForgeReplayJobSpec) -> list[Problem]:
    if spec.replay.loader == "upstream" and spec.trainer.backend == "builtin":
        return [Problem("spec.replay.loader", "upstream is slime's own loader: it needs backend slime or miles "
                        "(the builtin trainer always uses forge-replay's safe loader)")]
    return []


def _miles_has_no_forge_load(spec: ForgeReplayJobSpec) -> list[Problem]:
    if spec.replay.loader == "upstream" and spec.trainer.backend == "miles" and spec.replay.mode == "forge":
        return [Problem("spec.replay.loader", "miles has no forge_load: use loader forgeReplay in forge mode")]
    return []


def _byo_fallback_passable(spec: ForgeReplayJobSpec) -> list[Problem]:
    backend, replay = spec.trainer.backend, spec.replay
    if backend == "builtin" or replay.dumps.fallback_to_first:
        return []
    forge_loader = upstream_rule(backend, "upstream-forge-loader")
    if replay.loader == "upstream" and replay.mode == "forge" and forge_loader is not None:
        why = f"slime's forge_load always falls back to rollout 0's file ({forge_loader.where})"
    elif replay.loader == "forgeReplay" and backend == "slime":
        why = "slime drops flags it does not declare, so the loader cannot be told (use backend miles or builtin)"
    else:
        return []
    return [Problem("spec.replay.dumps.fallbackToFirst", f"false cannot be honoured: {why}")]


def _upstream_debug_loader_has_no_fallback(spec: ForgeReplayJobSpec) -> list[Problem]:
    backend, replay = spec.trainer.backend, spec.replay
    if backend == "builtin" or replay.loader != "upstream" or replay.mode != "debug":
        return []
    rule = upstream_rule(backend, "upstream-debug-loader")
    if rule is None or rule["falls_back"] or not replay.dumps.fallback_to_first or not is_template(replay.dumps.path):
        return []
    return [Problem("spec.replay.dumps.fallbackToFirst", f"true cannot be honoured: {backend}'s "
                    f"--load-debug-rollout-data has no fallback, a missing rollout file fails the run ({rule.where}); "
                    "set fallbackToFirst: false (verify then refuses a missing dump before launch), or use loader "
                    "forgeReplay")]


def _byo_required_flags(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    table = flag_table(t.backend)
    return [Problem("spec.trainer.args", f"{flag} is required by {t.backend}'s parser ({table.file}:"
                    f"{table.options[flag]['line']}, {table.repository}@{table.commit[:8]}), which exits 2 without it: "
                    "give it in args, as the run that wrote the dumps did")
            for flag in missing_required(t.backend, t.args)]


def _byo_eval_in_debug(spec: ForgeReplayJobSpec) -> list[Problem]:
    backend, replay = spec.trainer.backend, spec.replay
    rule = upstream_rule(backend, "debug-skips-eval") if backend != "builtin" else None
    if rule is None or replay.mode != "debug" or replay.eval_interval == 0:
        return []
    return [Problem("spec.replay.evalInterval", f"{backend} never evaluates in debug mode (--debug-train-only: "
                    f"{rule.where}), so no eval dump would be read: set evalInterval: 0, or replay in forge mode")]


def _byo_eval_needs_datasets(spec: ForgeReplayJobSpec) -> list[Problem]:
    t, replay = spec.trainer, spec.replay
    rule = upstream_rule(t.backend, "eval-needs-datasets") if t.backend != "builtin" else None
    if rule is None or replay.mode != "forge" or replay.eval_interval == 0:
        return []
    if any(sets_flag(t.args, flag) for flag in rule["flags"]):
        return []
    return [Problem("spec.replay.evalInterval", f"{t.backend} refuses --eval-interval unless eval datasets are "
                    f"configured ({rule.where}): give {' or '.join(rule['flags'])} in spec.trainer.args (an eval "
                    "dataset the replay never reads: eval replays the eval_N dumps), or set evalInterval: 0")]


def _slime_ft_has_no_components(spec: ForgeReplayJobSpec) -> list[Problem]:
    ft = spec.fault_tolerance
    if spec.trainer.backend == "slime" and ft.enabled and ft.active_components == ["train"]:
        return [Problem("spec.faultTolerance.components", "slime's --use-fault-tolerance has no components (it "
                        "watches the rollout engines): [train] alone cannot be run; use [rollout] or backend miles")]
    return []


def _byo_gpus_divide(spec: ForgeReplayJobSpec) -> list[Problem]:
    t, r = spec.trainer, spec.rollout
    if t.backend == "builtin" or t.gpus_per_node == 0 or r is None or r.colocate:
        return []
    per_node, problems = t.gpus_per_node, []
    if r.num_gpus % per_node:
        problems.append(Problem("spec.rollout.numGpus", f"must be a multiple of spec.trainer.gpusPerNode ({per_node}): "
                                f"{t.backend} places engines on whole nodes of the one worker group"))
    if r.num_gpus_per_engine % per_node and per_node % r.num_gpus_per_engine:
        problems.append(Problem("spec.rollout.numGpusPerEngine", f"must divide spec.trainer.gpusPerNode ({per_node}) "
                                f"or be a multiple of it: an engine may not straddle a node boundary"))
    return problems


def _byo_args_allowed(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    return [Problem(f"spec.trainer.args[{i}]", message) for i, message in arg_problems(t.backend, t.args)]


def _byo_env_names(spec: ForgeReplayJobSpec) -> list[Problem]:
    import re

    problems = []
    for key in spec.trainer.env:
        path = f"spec.trainer.env.{key}" if key else "spec.trainer.env"
        if not re.fullmatch(ENV_NAME, key):
            problems.append(Problem(path, f"{_short(key)} is not an environment variable name (letters, digits and "
                                    "'_', not starting with a digit)"))
        elif key in RESERVED_ENV:
            problems.append(Problem(path, f"cannot be set: {RESERVED_ENV[key]}"))
    return problems


def _byo_script_relative(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if t.script.startswith("/") or ".." in t.script.split("/"):
        return [Problem("spec.trainer.script", f"must be relative to workingDir, without '..' ({t.script!r})")]
    return []


def _byo_working_dir_plain(spec: ForgeReplayJobSpec) -> list[Problem]:
    t = spec.trainer
    if ".." in t.working_dir.split("/"):
        return [Problem("spec.trainer.workingDir", f"must not contain '..' ({t.working_dir!r})")]
    return []


def _cel_literal(value: Any) -> str:
    return json.dumps(value)


def _cel_sets_flag(flags: tuple[str, ...]) -> str:
    """CEL: the args item ``a`` sets one of ``flags`` (``--f`` or ``--f=v``)."""
    return (f"a in {_cel_literal(sorted(set(flags)))} || "
            + " || ".join(f"a.startsWith({_cel_literal(flag + '=')})" for flag in sorted(set(flags))))


_CEL_BUILTIN = "!has(self.backend) || self.backend == 'builtin'"
_CEL_BYO = "has(self.backend) && self.backend != 'builtin'"



def _cel_backend_in(backends: list[str]) -> str:
    """CEL at spec: the trainer's backend is one of ``backends`` (false when the list is empty)."""
    if not backends:
        return "false"
    return f"(has(self.trainer) && has(self.trainer.backend) && self.trainer.backend in {_cel_literal(backends)})"


def _cel_args_set(flag: str, args: str = "self.args") -> str:
    """CEL: an item of ``args`` sets ``flag``."""
    return f"{args}.exists(a, a == {_cel_literal(flag)} || a.startsWith({_cel_literal(flag + '=')}))"


def _backends_with(rule_id: str, **facts: Any) -> list[str]:
    """The backends whose upstream rule ``rule_id`` exists (and has the given ``facts``)."""
    return [b for b in BACKENDS if (r := upstream_rule(b, rule_id)) is not None
            and all(r[k] == v for k, v in facts.items())]


def _rule_facts(backend: str, rule_id: str, key: str) -> Any:
    rule = upstream_rule(backend, rule_id)
    assert rule is not None, (backend, rule_id)
    return rule[key]


def _cel_required_flags() -> str:
    per_backend = [
        f"(self.backend != {_cel_literal(b)} || (has(self.args) && "
        + " && ".join(_cel_args_set(flag) for flag in required_flags(b)) + "))"
        for b in BACKENDS if required_flags(b)
    ]
    return f"({_CEL_BUILTIN}) || (" + " && ".join(per_backend or ["true"]) + ")"


def _cel_eval_datasets() -> str:
    per_backend = [
        f"self.trainer.backend != {_cel_literal(b)} || (has(self.trainer.args) && ("
        + " || ".join(_cel_args_set(flag, "self.trainer.args")
                      for flag in _rule_facts(b, "eval-needs-datasets", "flags"))
        + "))"
        for b in _backends_with("eval-needs-datasets")
    ]
    return (f"!{_cel_backend_in(_backends_with('eval-needs-datasets'))} || self.replay.mode != 'forge' || "
            "!has(self.replay.evalInterval) || self.replay.evalInterval == 0 || ("
            + " && ".join(f"({c})" for c in per_backend) + ")")


_SLIME_OWNED = (*BACKEND_INJECTED["slime"], *REFUSED_FLAGS["slime"])
_MILES_ONLY = tuple(f for f in (*BACKEND_INJECTED["miles"], *REFUSED_FLAGS["miles"]) if f not in _SLIME_OWNED)

CROSS_FIELD_RULES += [
    CrossFieldRule(
        "trainer",
        f"({_CEL_BUILTIN}) || !has(self.args) || self.args.all(a, !({_cel_sets_flag(_SLIME_OWNED)}) && "
        f"(self.backend != 'miles' || !({_cel_sets_flag(_MILES_ONLY)})))",
        "spec.trainer.args: an item sets a flag forge-replay injects, or --num-epoch, --dump-details, "
        "--save-debug-rollout-data (miles: --fully-async, --ci-inject-rollout-data-path)",
        ".args",
        _byo_args_allowed,
    ),
    CrossFieldRule(
        "trainer",
        f"({_CEL_BYO}) || ("
        + " && ".join(
            f"(!has(self.{_alias(n)}) || self.{_alias(n)} == {_cel_literal(_trainer_default(n))})"
            if n in ("image", "script") else
            f"(!has(self.{_alias(n)}) || size(self.{_alias(n)}) == 0)"
            for n in _BYO_FIELDS if n != "working_dir"
        )
        + " && (!has(self.workingDir) || self.workingDir == ''))",
        "spec.trainer: image, workingDir, script, args and env are only for backend slime or miles",
        ".backend",
        _byo_fields_need_backend,
    ),
    CrossFieldRule(
        "trainer",
        f"({_CEL_BUILTIN}) || ("
        + " && ".join(
            f"!has(self.{_alias(n)})" if _trainer_default(n) is None
            else f"(!has(self.{_alias(n)}) || self.{_alias(n)} == {_cel_literal(_trainer_default(n))})"
            for n in _BUILTIN_FIELDS
        )
        + ")",
        "spec.trainer: microBatchTokens, gradientCheckpointing, dtype, learningRate, clipEps, clipEpsHigh, "
        "nSamplesPerPrompt, normalizeAdvantageStd, seed and memorySnapshot mean nothing to backend slime or miles "
        "(set them in args)",
        ".backend",
        _builtin_fields_refused,
    ),
    CrossFieldRule(
        "trainer.env",
        f"self.all(k, k.matches({_cel_literal(ENV_NAME)}) && !(k in {_cel_literal(sorted(RESERVED_ENV))}))",
        "spec.trainer.env: names are letters, digits and '_' (not starting with a digit), and RAY_ADDRESS and "
        "FORGE_REPLAY_PROBE_DIR are the job's own",
        "",
        _byo_env_names,
    ),
    CrossFieldRule(
        "trainer",
        "!has(self.script) || (!self.script.startsWith('/') && !self.script.matches('(^|/)\\\\.\\\\.(/|$)'))",
        "spec.trainer.script: must be relative to workingDir, without '..'",
        ".script",
        _byo_script_relative,
    ),
    CrossFieldRule(
        "trainer",
        "!has(self.workingDir) || !self.workingDir.matches('(^|/)\\\\.\\\\.(/|$)')",
        "spec.trainer.workingDir: must not contain '..'",
        ".workingDir",
        _byo_working_dir_plain,
    ),
    CrossFieldRule(
        "trainer",
        f"({_CEL_BUILTIN}) || (has(self.image) && self.image != '' && has(self.workingDir) && "
        "self.workingDir.startsWith('/'))",
        "spec.trainer.image: image and an absolute workingDir are required with backend slime or miles",
        ".image",
        _byo_needs_image,
    ),
    CrossFieldRule(
        "",
        "!has(self.replay.loader) || self.replay.loader != 'upstream' || "
        "(has(self.trainer) && has(self.trainer.backend) && self.trainer.backend != 'builtin')",
        "spec.replay.loader: upstream is slime's own loader: it needs backend slime or miles",
        ".replay.loader",
        _upstream_loader_needs_byo,
    ),
    CrossFieldRule(
        "",
        "!has(self.replay.loader) || self.replay.loader != 'upstream' || self.replay.mode != 'forge' || "
        "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend != 'miles'",
        "spec.replay.loader: miles has no forge_load: use loader forgeReplay in forge mode",
        ".replay.loader",
        _miles_has_no_forge_load,
    ),
    CrossFieldRule(
        "",
        "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin' || "
        "!has(self.replay.dumps.fallbackToFirst) || self.replay.dumps.fallbackToFirst || "
        "(has(self.replay.loader) && self.replay.loader == 'upstream' && self.replay.mode == 'debug') || "
        "(self.trainer.backend == 'miles' && (!has(self.replay.loader) || self.replay.loader == 'forgeReplay'))",
        "spec.replay.dumps.fallbackToFirst: false can be honoured only by backend miles with loader forgeReplay, "
        "or by loader upstream in debug mode (slime's forge_load always falls back; slime drops flags it does not "
        "declare)",
        ".replay.dumps.fallbackToFirst",
        _byo_fallback_passable,
    ),
    CrossFieldRule(
        "",
        f"!{_cel_backend_in(_backends_with('upstream-debug-loader', falls_back=False))} || "
        "!has(self.replay.loader) || self.replay.loader != 'upstream' || self.replay.mode != 'debug' || "
        "(has(self.replay.dumps.fallbackToFirst) && !self.replay.dumps.fallbackToFirst) || "
        f"!self.replay.dumps.path.matches('{_CEL_IS_TEMPLATE}')",
        "spec.replay.dumps.fallbackToFirst: true cannot be honoured: --load-debug-rollout-data (loader upstream in "
        "debug mode) has no fallback; set fallbackToFirst: false or use loader forgeReplay",
        ".replay.dumps.fallbackToFirst",
        _upstream_debug_loader_has_no_fallback,
    ),
    CrossFieldRule(
        "trainer",
        _cel_required_flags(),
        "spec.trainer.args: a flag the backend's parser requires is missing ("
        + "; ".join(f"{b} requires {', '.join(required_flags(b))}" for b in BACKENDS if required_flags(b))
        + "): the parser exits 2 without it",
        ".args",
        _byo_required_flags,
    ),
    CrossFieldRule(
        "",
        f"!{_cel_backend_in(_backends_with('debug-skips-eval'))} || self.replay.mode != 'debug' || "
        "!has(self.replay.evalInterval) || self.replay.evalInterval == 0",
        "spec.replay.evalInterval: slime and miles never evaluate in debug mode (--debug-train-only): set "
        "evalInterval: 0, or replay in forge mode",
        ".replay.evalInterval",
        _byo_eval_in_debug,
    ),
    CrossFieldRule(
        "",
        _cel_eval_datasets(),
        "spec.replay.evalInterval: slime and miles refuse --eval-interval unless spec.trainer.args configure eval "
        "datasets (--eval-prompt-data or --eval-config), which the replay never reads",
        ".replay.evalInterval",
        _byo_eval_needs_datasets,
    ),
    CrossFieldRule(
        "",
        "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend != 'slime' || "
        "!has(self.faultTolerance) || !has(self.faultTolerance.enabled) || !self.faultTolerance.enabled || "
        "!has(self.faultTolerance.components) || 'rollout' in self.faultTolerance.components",
        "spec.faultTolerance.components: slime's fault tolerance has no components: [train] alone cannot be run",
        ".faultTolerance.components",
        _slime_ft_has_no_components,
    ),
    CrossFieldRule(
        "",
        "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin' || "
        "!has(self.rollout) || (has(self.rollout.colocate) && self.rollout.colocate) || "
        "!has(self.trainer.gpusPerNode) || self.trainer.gpusPerNode == 0 || "
        "(self.rollout.numGpus % self.trainer.gpusPerNode == 0 && "
        "(self.rollout.numGpusPerEngine % self.trainer.gpusPerNode == 0 || "
        "self.trainer.gpusPerNode % self.rollout.numGpusPerEngine == 0))",
        "spec.rollout.numGpus: with backend slime or miles, engines fill whole nodes of gpusPerNode GPUs "
        "(numGpus a multiple of it; numGpusPerEngine a divisor or a multiple of it)",
        ".rollout.numGpus",
        _byo_gpus_divide,
    ),
]


class ForgeReplayJobSpec(_Model):
    """The desired replay job."""

    replay: ReplaySpec = _desc("What is replayed: mode, dumps, rollouts, eval and pre-flight verification.")
    model: ModelSpec = _desc("The trained model: exactly one of config (random init) and path (checkpoint).")
    trainer: TrainerSpec = Field(
        default_factory=TrainerSpec, description="The builtin FSDP trainer, or the team's slime / miles script."
    )
    rollout: RolloutSpec | None = Field(
        default=None, description="sglang engines; required in forge mode, forbidden in debug mode."
    )
    fault_tolerance: FaultToleranceSpec = Field(
        default_factory=FaultToleranceSpec, description="Fault tolerance and its components (train, rollout)."
    )
    image: str = Field(
        default="",
        max_length=1024,
        description="Runtime image; the operator's default when empty. An image reference: "
        "[registry[:port]/]path[:tag][@digest], the path lowercase.",
        json_schema_extra={"pattern": f"^$|{IMAGE_REFERENCE}"},
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Placement of the GPU pods.")
    pod: PodSettings = Field(
        default_factory=PodSettings, description="Pull secrets, env, annotations, labels and extra resources of every pod."
    )
    suspend: bool = Field(default=False, description="Suspend the job (the RayJob is suspended, its pods deleted).")
    ttl_seconds_after_finished: Int = Field(
        default=300,
        ge=0,
        le=INT32_MAX,
        description="Seconds a finished job's Ray cluster (its GPUs) is kept before KubeRay deletes it; results "
        "and logs outlive it on the results claim and in the status.",
    )
    active_deadline_seconds: Int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="Seconds the RayJob may run, launch included, before KubeRay fails it (reason "
        "DeadlineExceeded) and releases its GPUs; unset: no limit.",
    )
    results: ResultsSpec = Field(default_factory=ResultsSpec, description="Where reports are written.")
    expect: ExpectSpec | None = Field(
        default=None,
        description="Release-validation verdict: memory budget, fallbacks, throughput and a baseline report to "
        "reproduce (status.expectations, condition ExpectationsMet).",
    )

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        return _checked_image(value)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ForgeReplayJobSpec:
        problems = [p for rule in CROSS_FIELD_RULES for p in rule.check(self)]
        if problems:
            raise SpecInvalid(problems)
        return self


# ----------------------------------------------------------------------------------------- status


class Condition(_Model):
    """A metav1.Condition."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    type: str = _desc(
        "Condition type: Ready, Reconciling, Stalled, SpecValid, DumpsVerified, ClusterReady; ExpectationsMet with "
        "spec.expect."
    )
    status: Literal["True", "False", "Unknown"] = _desc("True, False or Unknown.")
    reason: str = Field(default="", description="One-word CamelCase reason.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="The spec generation this was computed from.")


class RolloutProgress(_Model):
    """Rollouts trained so far."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    completed: int = Field(default=0, description="Rollouts trained.")
    total: int = Field(default=0, description="Rollouts to train.")


class DevicePeaks(_Model):
    """One node's GPUs, as a device-level sampler saw them (``source``), with slime / miles."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    source: Literal["nvml"] = Field(description="nvml: NVML's used memory per GPU (or nvidia-smi's, the same figure).")
    peak_used_gib: dict[str, float] = Field(
        alias="peakUsedGiB", description="Peak used memory (GiB) per GPU index on the node."
    )


class MemoryPeak(_Model):
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


class ExpectationResult(_Model):
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


class ResultsLocation(_Model):
    """Where this run writes its reports: a folder of its own on the results claim."""

    claim_name: str = Field(description="The results PVC (spec.results.claimName).")
    path: str = Field(description="The run's folder, relative to the claim's root: <namespace>/<name>/<uid prefix>.")


PHASES = ("Pending", "Verifying", "Launching", "Running", "Succeeded", "Failed", "Suspended")


class ForgeReplayJobStatus(_Model):
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
    completion_time: str | None = Field(default=None, description="When the job finished (RFC 3339).")
    message: str | None = Field(default=None, description="What is happening now, or why it failed.")
    results: ResultsLocation | None = Field(
        default=None, description="Where this run's reports are on the results claim (absent without a claim)."
    )
    expectations: list[ExpectationResult] | None = Field(
        default=None, description="The verdict on spec.expect, one entry per check (once the run has ended)."
    )


# ------------------------------------------------------------------------------------------ root


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta forge-replay reads; everything else is kept as is."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str | None = None
    generate_name: str | None = Field(default=None, alias="generateName")
    namespace: str | None = None
    labels: Labels = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None

    @field_validator("name")
    @classmethod
    def _name_rules(cls, name: str | None) -> str | None:
        import re

        if name is None:
            return name
        if len(name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"{name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH} (KubeRay's RayJob name limit)"
            )
        if not re.match(DNS1035_LABEL, name):
            raise ValueError(
                f"{name!r} must be a DNS-1035 label: lowercase letters, digits and '-', "
                "starting with a letter and ending with a letter or digit"
            )
        return name

    @field_validator("namespace")
    @classmethod
    def _namespace_rules(cls, namespace: str | None) -> str | None:
        import re

        if namespace is not None and not (len(namespace) <= 63 and re.fullmatch(DNS1123_LABEL, namespace)):
            raise ValueError(
                f"{_short(namespace)} must be a DNS-1123 label of at most 63 characters: lowercase letters, "
                "digits and '-', starting and ending with a letter or digit"
            )
        return namespace


class ForgeReplayJob(_Model):
    """A replay-mode RL training job."""

    api_version: Literal["forgereplay.io/v1alpha1"] = Field(
        default=API_VERSION, alias="apiVersion", description="forgereplay.io/v1alpha1"
    )
    kind: Literal["ForgeReplayJob"] = Field(default=KIND, description="ForgeReplayJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: ForgeReplayJobSpec = _desc("The desired replay job.")
    status: ForgeReplayJobStatus | None = Field(default=None, description="Observed state, written by the operator.")

    @model_validator(mode="after")
    def _needs_a_name(self) -> ForgeReplayJob:
        if self.metadata.name is None and self.metadata.generate_name is None:
            raise SpecInvalid([Problem("metadata.name", "required (a DNS-1035 label of at most 47 characters)")])
        return self
