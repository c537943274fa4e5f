"""ForgeReplayJob v1alpha1: the pydantic models are the single source of truth for the API.

ForgeReplayJobSpec composes the spec parts (``spec_parts``) and, once every field is valid, runs the cross-field
rules (``rules``, ``byo_rules``), each of which carries its CEL twin, so that the API server and the operator refuse
the same specs with the same field path. The CRD schema (``forge_replay.api.crd``) is generated from these models.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from forge_replay.api.base import ApiModel, Int, described
from forge_replay.api.byo_rules import BYO_RULES
from forge_replay.api.expect_rules import EXPECT_RULES
from forge_replay.api.names import (
    API_VERSION,
    DNS1035_LABEL,
    DNS1123_LABEL,
    IMAGE_REFERENCE,
    KIND,
    MAX_NAME_LENGTH,
    Annotations,
    Labels,
    Problem,
    SpecInvalid,
    checked_image,
    short_repr,
)
from forge_replay.api.rules import CORE_RULES, CrossFieldRule
from forge_replay.api.spec_parts import (
    INT32_MAX,
    ExpectSpec,
    FaultToleranceSpec,
    ModelSpec,
    PodSettings,
    ReplaySpec,
    ResultsSpec,
    RolloutSpec,
    SchedulingSpec,
    TrainerSpec,
)
from forge_replay.api.status import ForgeReplayJobStatus
from forge_replay.api.sweep import SweepSpec
from forge_replay.api.sweep_rules import SWEEP_RULES

CROSS_FIELD_RULES: list[CrossFieldRule] = [*CORE_RULES, *BYO_RULES, *EXPECT_RULES, *SWEEP_RULES]
"""Every cross-field rule, in the order the CRD lists their CEL twins and the operator its problems."""

MUTABLE_AFTER_LAUNCH = frozenset({"suspend"})
"""The spec fields that may change once a job is launched: the operator refuses a change to any other (its
config ConfigMap keeps the launched spec) and the CRD's transition rules refuse it in the API server."""


class ForgeReplayJobSpec(ApiModel):
    """The desired replay job."""

    replay: ReplaySpec = described("What is replayed: mode, dumps, rollouts, eval and pre-flight verification.")
    model: ModelSpec = described("The trained model: exactly one of config (random init) and path (checkpoint).")
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
    sweep: SweepSpec | None = Field(
        default=None,
        description="The memory frontier: run the job at every point of some axes (spec fields such as "
        "trainer.microBatchTokens), one after another in one Ray cluster, and find the largest values that fit "
        "the memory budget (builtin trainer only).",
    )

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str) -> str:
        return checked_image(value)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ForgeReplayJobSpec:
        problems = [p for rule in CROSS_FIELD_RULES for p in rule.check(self)]
        if problems:
            raise SpecInvalid(problems)
        return self


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
                f"{short_repr(namespace)} must be a DNS-1123 label of at most 63 characters: lowercase letters, "
                "digits and '-', starting and ending with a letter or digit"
            )
        return namespace


class ForgeReplayJob(ApiModel):
    """A replay-mode RL training job."""

    api_version: Literal["forgereplay.io/v1alpha1"] = Field(
        default=API_VERSION, alias="apiVersion", description="forgereplay.io/v1alpha1"
    )
    kind: Literal["ForgeReplayJob"] = Field(default=KIND, description="ForgeReplayJob")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")
    spec: ForgeReplayJobSpec = described("The desired replay job.")
    status: ForgeReplayJobStatus | None = Field(default=None, description="Observed state, written by the operator.")

    @model_validator(mode="after")
    def _needs_a_name(self) -> ForgeReplayJob:
        if self.metadata.name is None and self.metadata.generate_name is None:
            raise SpecInvalid([Problem("metadata.name", "required (a DNS-1035 label of at most 47 characters)")])
        return self
