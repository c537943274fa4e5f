"""The ForgeReplayJob API: models (the single source of truth), parsing, the CRD generated from them.

Names are resolved lazily, as in ``forge_replay.dumps``: ``forge_replay.api.dump_path`` (the dump path rules,
which the replay rollout function needs inside a trainer image) imports without pydantic or yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge_replay.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "Problem", "SpecInvalid"),
                    "forge_replay.api.names"),
    **dict.fromkeys(("DumpsSpec", "FaultToleranceSpec", "HealthCheckSpec", "ModelSpec", "ReplaySpec", "ResultsSpec",
                     "RolloutSpec", "SchedulingSpec", "TrainerSpec"), "forge_replay.api.spec_parts"),
    **dict.fromkeys(("Condition", "ForgeReplayJobStatus", "MemoryPeak", "RolloutProgress"), "forge_replay.api.status"),
    **dict.fromkeys(("ForgeReplayJob", "ForgeReplayJobSpec", "ObjectMeta"), "forge_replay.api.job"),
    **dict.fromkeys(("eval_path", "is_template", "path_problem", "train_path"), "forge_replay.api.dump_path"),
    **dict.fromkeys(("DocumentError", "NotAForgeReplayJob", "check_kind", "load_documents", "parse_job"),
                    "forge_replay.api.parse"),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from forge_replay.api.dump_path import eval_path, is_template, path_problem, train_path
    from forge_replay.api.job import ForgeReplayJob, ForgeReplayJobSpec, ObjectMeta
    from forge_replay.api.names import API_VERSION, GROUP, KIND, PLURAL, VERSION, Problem, SpecInvalid
    from forge_replay.api.parse import DocumentError, NotAForgeReplayJob, check_kind, load_documents, parse_job
    from forge_replay.api.spec_parts import (
        DumpsSpec,
        FaultToleranceSpec,
        HealthCheckSpec,
        ModelSpec,
        ReplaySpec,
        ResultsSpec,
        RolloutSpec,
        SchedulingSpec,
        TrainerSpec,
    )
    from forge_replay.api.status import Condition, ForgeReplayJobStatus, MemoryPeak, RolloutProgress

__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
