"""The ForgeReplayJob API: models (the single source of truth), parsing, the CRD generated from them."""

from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
from forge_replay.api.models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Condition,
    DumpsSpec,
    FaultToleranceSpec,
    ForgeReplayJob,
    ForgeReplayJobSpec,
    ForgeReplayJobStatus,
    HealthCheckSpec,
    MemoryPeak,
    ModelSpec,
    ObjectMeta,
    Problem,
    ReplaySpec,
    ResultsSpec,
    RolloutProgress,
    RolloutSpec,
    SchedulingSpec,
    SpecInvalid,
    TrainerSpec,
)
from forge_replay.api.parse import DocumentError, NotAForgeReplayJob, check_kind, load_documents, parse_job

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "Condition", "DocumentError", "DumpsSpec",
    "FaultToleranceSpec", "ForgeReplayJob", "ForgeReplayJobSpec", "ForgeReplayJobStatus", "HealthCheckSpec",
    "MemoryPeak", "ModelSpec", "NotAForgeReplayJob", "ObjectMeta", "Problem", "ReplaySpec", "ResultsSpec",
    "RolloutProgress", "RolloutSpec", "SchedulingSpec", "SpecInvalid", "TrainerSpec", "check_kind",
    "eval_path", "is_template", "load_documents", "parse_job", "path_problem", "train_path",
]
