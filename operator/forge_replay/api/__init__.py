"""The ForgeReplayJob API: models (the single source of truth), parsing, the CRD generated from them.

Names are resolved lazily, as in ``forge_replay.dumps``: ``forge_replay.api.dump_path`` (the dump path rules,
which the replay rollout function needs inside a trainer image) imports without pydantic or yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge_replay.lazy import lazy_exports

_MODELS = (
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "Condition", "DumpsSpec", "FaultToleranceSpec",
    "ForgeReplayJob", "ForgeReplayJobSpec", "ForgeReplayJobStatus", "HealthCheckSpec", "MemoryPeak", "ModelSpec",
    "ObjectMeta", "Problem", "ReplaySpec", "ResultsSpec", "RolloutProgress", "RolloutSpec", "SchedulingSpec",
    "SpecInvalid", "TrainerSpec",
)
_EXPORTS = {
    **dict.fromkeys(_MODELS, "forge_replay.api.models"),
    **dict.fromkeys(("eval_path", "is_template", "path_problem", "train_path"), "forge_replay.api.dump_path"),
    **dict.fromkeys(("DocumentError", "NotAForgeReplayJob", "check_kind", "load_documents", "parse_job"),
                    "forge_replay.api.parse"),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
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

__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
