"""The core cross-field rules of a ForgeReplayJob spec: each rule's Python check and its CEL twin for the CRD in one
record (``CrossFieldRule``), written above its check, so that the API server and the operator refuse the same specs
with the same field path. The rules of a slime / miles trainer are in ``byo_rules``; ForgeReplayJobSpec runs both."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from forge_replay.api.dump_path import is_template, path_problem
from forge_replay.api.names import Problem
from forge_replay.api.spec_parts import (
    ExpectSpec,
    FaultToleranceSpec,
    ModelSpec,
    ReplaySpec,
    ResultsSpec,
    RolloutSpec,
    SchedulingSpec,
    TrainerSpec,
)
from forge_replay.api.sweep import SweepSpec
from forge_replay.frameworks.flags import BACKENDS
from forge_replay.frameworks.rules import upstream_rule


class SpecParts(Protocol):
    """What a cross-field rule reads of a ForgeReplayJobSpec: its parts (a rule never needs the whole model)."""

    replay: ReplaySpec
    model: ModelSpec
    trainer: TrainerSpec
    rollout: RolloutSpec | None
    fault_tolerance: FaultToleranceSpec
    scheduling: SchedulingSpec
    suspend: bool
    expect: ExpectSpec | None
    sweep: SweepSpec | None
    results: ResultsSpec


Check = Callable[[SpecParts], list[Problem]]
"""A rule's Python check: the problems of a spec (none when the rule holds)."""


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several fields: its Python check and its CEL twin for the CRD.

    ``at`` is the schema node (dotted, relative to spec; "" is spec itself) that carries the CEL rule,
    ``field_path`` the CEL fieldPath relative to that node, ``check`` returns the problems of a spec. ``cel`` is None
    for a rule the API server cannot check (arithmetic over the values in spec.trainer.args, beyond a CEL rule's cost
    budget): the operator and `forge-replay validate` refuse it, before anything is created.
    """

    at: str
    cel: str | None
    message: str
    field_path: str
    check: Check


def recorder(rules: list[CrossFieldRule]) -> Callable[[str, str | None, str, str], Callable[[Check], Check]]:
    """The decorator ``@rule(at, cel, message, field_path)`` that records the check below it, with its CEL twin, in
    ``rules`` (in the order the checks are written: the order of the CRD's rules and of the problems)."""

    def rule(at: str, cel: str | None, message: str, field_path: str) -> Callable[[Check], Check]:
        def record(check: Check) -> Check:
            rules.append(CrossFieldRule(at, cel, message, field_path, check))
            return check

        return record

    return rule


CORE_RULES: list[CrossFieldRule] = []
"""The core rules, in order; ``byo_rules.BYO_RULES`` follow them."""
_rule = recorder(CORE_RULES)


_QUEUED_SUSPEND = (
    "cannot be true with spec.scheduling.queueName: Kueue suspends and resumes a queued job (it un-suspends the "
    "RayJob it admits); deactivate the job's Kueue Workload (kubectl patch workload NAME --type=merge "
    "-p '{\"spec\":{\"active\":false}}') or delete the ForgeReplayJob"
)

# Placeholder syntax shared with dump_path.path_problem: only {rollout_id}, braces doubled otherwise.
_CEL_TEMPLATE_OK = r"^([^{}]|\\{\\{|\\}\\}|\\{rollout_id\\})*$"
CEL_IS_TEMPLATE = r"(^|[^{])(\\{\\{)*\\{rollout_id\\}"


def outside_its_root(path: str) -> bool:
    """Whether ``path`` is absolute or has a '..' component (not a path inside the folder it is relative to)."""
    return path.startswith("/") or ".." in path.split("/")


def _repeated(items: list[str]) -> list[str]:
    """The items listed more than once, sorted."""
    return sorted({item for item in items if items.count(item) > 1})


@_rule(
    "",
    "!has(self.suspend) || !self.suspend || !has(self.scheduling) || !has(self.scheduling.queueName)"
    " || self.scheduling.queueName == ''",
    f"spec.suspend: {_QUEUED_SUSPEND}",
    ".suspend",
)
def _queued_never_suspended(spec: SpecParts) -> list[Problem]:
    if spec.suspend and spec.scheduling.queue_name:
        return [Problem("spec.suspend", _QUEUED_SUSPEND)]
    return []


@_rule(
    "",
    "self.replay.mode != 'forge' || has(self.rollout)",
    "spec.rollout: required in forge mode (the sglang engines kept alive while replaying)",
    ".rollout",
)
def _forge_needs_rollout(spec: SpecParts) -> list[Problem]:
    if spec.replay.mode == "forge" and spec.rollout is None:
        return [Problem("spec.rollout", "required in forge mode (the sglang engines kept alive while replaying)")]
    return []


@_rule(
    "",
    "self.replay.mode != 'debug' || !has(self.rollout)",
    "spec.rollout: must be absent in debug mode: debug replay never starts sglang engines",
    ".rollout",
)
def _debug_forbids_rollout(spec: SpecParts) -> list[Problem]:
    if spec.replay.mode == "debug" and spec.rollout is not None:
        return [Problem("spec.rollout", "must be absent in debug mode: debug replay never starts sglang engines")]
    return []


@_rule(
    "rollout",
    "self.numGpus % self.numGpusPerEngine == 0",
    "spec.rollout.numGpusPerEngine: must divide spec.rollout.numGpus",
    ".numGpusPerEngine",
)
def _engines_divide(spec: SpecParts) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.num_gpus % r.num_gpus_per_engine:
        return [
            Problem(
                "spec.rollout.numGpusPerEngine",
                f"must divide spec.rollout.numGpus ({r.num_gpus} is not divisible by {r.num_gpus_per_engine})",
            )
        ]
    return []


@_rule(
    "",
    "!has(self.rollout) || !has(self.rollout.colocate) || !self.rollout.colocate || "
    "self.rollout.numGpus <= (has(self.trainer) && has(self.trainer.nodes) ? self.trainer.nodes : 1) * "
    "(has(self.trainer) && has(self.trainer.gpusPerNode) ? self.trainer.gpusPerNode : 8)",
    "spec.rollout.numGpus: colocated engines must fit on the trainer's GPUs (nodes x gpusPerNode)",
    ".rollout.numGpus",
)
def _colocate_fits(spec: SpecParts) -> list[Problem]:
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


@_rule(
    "rollout",
    "!has(self.weightSync) || self.weightSync != 'tensor' || (has(self.colocate) && self.colocate)",
    "spec.rollout.weightSync: tensor needs colocate: true (CUDA IPC reaches only engines on the trainer's GPUs)",
    ".weightSync",
)
def _tensor_sync_needs_colocate(spec: SpecParts) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.weight_sync == "tensor" and not r.colocate:
        return [Problem("spec.rollout.weightSync",
                        "tensor needs colocate: true (CUDA IPC handles reach only engines on the trainer's GPUs); "
                        "use distributed or disk for separate engine GPUs")]
    return []


@_rule(
    "rollout",
    "!has(self.weightSync) || self.weightSync != 'distributed' || !has(self.colocate) || !self.colocate",
    "spec.rollout.weightSync: distributed cannot be used with colocate: true (NCCL refuses two ranks on one GPU)",
    ".weightSync",
)
def _distributed_sync_forbids_colocate(spec: SpecParts) -> list[Problem]:
    r = spec.rollout
    if r is not None and r.weight_sync == "distributed" and r.colocate:
        return [Problem("spec.rollout.weightSync",
                        "distributed cannot be used with colocate: true (NCCL refuses two ranks on one GPU); "
                        "use tensor, disk or auto")]
    return []


@_rule(
    "faultTolerance",
    "(has(self.enabled) && self.enabled) || !has(self.components) || size(self.components) == 0",
    "spec.faultTolerance.components: given while spec.faultTolerance.enabled is false",
    ".components",
)
def _components_need_enabled(spec: SpecParts) -> list[Problem]:
    ft = spec.fault_tolerance
    if not ft.enabled and ft.components:
        return [
            Problem(
                "spec.faultTolerance.components",
                "given while spec.faultTolerance.enabled is false; set enabled: true or remove components",
            )
        ]
    return []


@_rule(
    "faultTolerance",
    "!has(self.enabled) || !self.enabled || !has(self.components) || size(self.components) > 0",
    "spec.faultTolerance.components: must select at least one of train, rollout when enabled",
    ".components",
)
def _components_nonempty(spec: SpecParts) -> list[Problem]:
    ft = spec.fault_tolerance
    if ft.enabled and ft.components is not None and not ft.components:
        return [Problem("spec.faultTolerance.components", "must select at least one of train, rollout when enabled")]
    return []


@_rule(
    "faultTolerance",
    "!has(self.components) || self.components.all(c, self.components.filter(d, d == c).size() == 1)",
    "spec.faultTolerance.components: list each component once",
    ".components",
)
def _components_unique(spec: SpecParts) -> list[Problem]:
    comps = spec.fault_tolerance.components or []
    repeated = _repeated(comps)
    if repeated:
        return [Problem("spec.faultTolerance.components", f"repeats {', '.join(repeated)}; list each component once")]
    return []


_FT_WATCHES_ROLLOUT_ONLY = [b for b in BACKENDS if upstream_rule(b, "ft-watches-rollout-only") is not None]
"""Backends whose fault tolerance has no train component (slime): in debug mode byo_rules says the one setting that
works (enabled: false), and the rule below, whose advice they cannot take, stays silent."""


@_rule(
    "",
    "self.replay.mode != 'debug' || !has(self.faultTolerance) || !has(self.faultTolerance.enabled) || "
    "!self.faultTolerance.enabled || "
    "(has(self.faultTolerance.components) && !('rollout' in self.faultTolerance.components)) || "
    f"(has(self.trainer) && has(self.trainer.backend) && self.trainer.backend in {json.dumps(_FT_WATCHES_ROLLOUT_ONLY)})",
    "spec.faultTolerance.components: debug mode has no engines to watch; use components: [train]",
    ".faultTolerance.components",
)
def _no_rollout_ft_in_debug(spec: SpecParts) -> list[Problem]:
    ft = spec.fault_tolerance
    if spec.trainer.backend in _FT_WATCHES_ROLLOUT_ONLY:
        return []
    if spec.replay.mode == "debug" and "rollout" in ft.active_components:
        how = "is selected" if ft.components is not None else "is the default when components is unset"
        return [
            Problem(
                "spec.faultTolerance.components",
                f"rollout {how}, but debug mode has no engines to watch; use components: [train]",
            )
        ]
    return []


@_rule(
    "replay.dumps",
    "!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)') && "
    f"self.path.matches('{_CEL_TEMPLATE_OK}') && !self.path.matches('\\\\x00|[^/]{{256,}}')",
    "spec.replay.dumps.path: must be relative, without '..' or NUL, with components of at most 255 bytes, and "
    "its only placeholder is {rollout_id}",
    ".path",
)
def _dumps_path_ok(spec: SpecParts) -> list[Problem]:
    problem = path_problem(spec.replay.dumps.path)
    return [Problem("spec.replay.dumps.path", problem)] if problem else []


@_rule(
    "replay",
    f"!has(self.evalInterval) || self.evalInterval == 0 || self.dumps.path.matches('{CEL_IS_TEMPLATE}')",
    "spec.replay.evalInterval: eval reads eval_N dumps and needs a {rollout_id} template in dumps.path",
    ".evalInterval",
)
def _eval_needs_template(spec: SpecParts) -> list[Problem]:
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


@_rule(
    "replay",
    "!has(self.evalBeforeTrain) || !self.evalBeforeTrain || (has(self.evalInterval) && self.evalInterval > 0)",
    "spec.replay.evalBeforeTrain: needs evalInterval > 0 (eval is off)",
    ".evalBeforeTrain",
)
def _eval_before_train_needs_eval(spec: SpecParts) -> list[Problem]:
    rp = spec.replay
    if rp.eval_before_train and rp.eval_interval == 0:
        return [Problem("spec.replay.evalBeforeTrain", "needs evalInterval > 0 (eval is off), as slime's "
                        "eval before training needs an eval interval")]
    return []


FOREIGN_TRAINER_UNRECORDED = {
    "maxFallbacks": "the fallbacks of its run go to its own metrics (forge_replay/fallbacks), not to forge-replay's "
                    "report",
    "minTokensPerSecond": "forge-replay does not time its training steps",
    "baseline": "forge-replay does not record its per-rollout loss and grad norm",
    "windows": "forge-replay does not record its rollouts",
}
"""What spec.expect may not ask of a slime / miles run (its own train.py), and why: forge-replay records only the
memory probe's peak of such a run (backends/probe.py, backends/publish.py)."""


@_rule(
    "",
    "!has(self.expect) || !has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin' "
    "|| (!has(self.expect.maxFallbacks) && !has(self.expect.minTokensPerSecond) && !has(self.expect.baseline) "
    "&& (!has(self.expect.windows) || size(self.expect.windows) == 0))",
    "spec.expect: backend slime or miles records only its memory peak and outcome: maxFallbacks, "
    "minTokensPerSecond, baseline and windows cannot be checked (maxPeakMemoryGiB and outcome can)",
    ".expect",
)
def _expect_foreign_trainer(spec: SpecParts) -> list[Problem]:
    e, backend = spec.expect, spec.trainer.backend
    if e is None or backend == "builtin":
        return []
    asked = {"maxFallbacks": e.max_fallbacks is not None, "minTokensPerSecond": e.min_tokens_per_second is not None,
             "baseline": e.baseline is not None, "windows": bool(e.windows)}
    return [Problem(f"spec.expect.{name}", f"not recorded for backend {backend}: {why} (only maxPeakMemoryGiB and "
                    "outcome, from the memory probe, can be checked)")
            for name, why in FOREIGN_TRAINER_UNRECORDED.items() if asked[name]]


@_rule(
    "expect",
    "has(self.maxPeakMemoryGiB) || has(self.maxFallbacks) || has(self.minTokensPerSecond) || has(self.baseline) || "
    "has(self.outcome) || (has(self.windows) && size(self.windows) > 0) || has(self.frontier)",
    "spec.expect: holds no check (give maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond, baseline, outcome, "
    "windows or frontier)",
    "",
)
def _expect_not_empty(spec: SpecParts) -> list[Problem]:
    e = spec.expect
    if e is not None and all(v is None for v in (e.max_peak_memory_gib, e.max_fallbacks, e.min_tokens_per_second,
                                                 e.baseline, e.outcome, e.frontier)) and not e.windows:
        return [Problem("spec.expect", "holds no check: give maxPeakMemoryGiB, maxFallbacks, minTokensPerSecond, "
                        "baseline, outcome, windows or frontier, or remove spec.expect (an empty gate would pass "
                        "having checked nothing)")]
    return []


@_rule(
    "expect.baseline",
    "(has(self.configMapName) ? 1 : 0) + (has(self.path) ? 1 : 0) + (has(self.history) ? 1 : 0) == 1",
    "spec.expect.baseline: needs exactly one of configMapName, claimName + path and history",
    "",
)
def _baseline_one_source(spec: SpecParts) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is None:
        return []
    given = [name for name, value in (("configMapName", b.config_map_name), ("claimName + path", b.path),
                                      ("history", getattr(b, "history", None))) if value is not None]
    if len(given) != 1:
        which = f"{' and '.join(given)} are set" if given else "none is set"
        return [Problem("spec.expect.baseline", f"needs exactly one of configMapName, claimName + path and history "
                        f"({which})")]
    return []


@_rule(
    "expect.baseline",
    "has(self.path) == has(self.claimName)",
    "spec.expect.baseline.claimName: claimName and path go together (the PVC and the report.json on it)",
    ".claimName",
)
def _baseline_claim_with_path(spec: SpecParts) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and (b.claim_name is None) != (b.path is None):
        missing = "path" if b.path is None else "claimName"
        return [Problem(f"spec.expect.baseline.{missing}",
                        "claimName and path go together (the PVC and the report.json on it)")]
    return []


@_rule(
    "expect.baseline",
    "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)'))",
    "spec.expect.baseline.path: must be relative to the claim's root, without '..'",
    ".path",
)
def _baseline_path_relative(spec: SpecParts) -> list[Problem]:
    b = spec.expect.baseline if spec.expect else None
    if b is not None and b.path is not None and outside_its_root(b.path):
        return [Problem("spec.expect.baseline.path", f"must be relative to the claim's root, without '..' ({b.path!r})")]
    return []


@_rule(
    "expect.baseline",
    "!has(self.metrics) || self.metrics.all(m, self.metrics.filter(n, n == m).size() == 1)",
    "spec.expect.baseline.metrics: list each metric once",
    ".metrics",
)
def _baseline_metrics_unique(spec: SpecParts) -> list[Problem]:
    metrics = spec.expect.baseline.metrics if spec.expect and spec.expect.baseline else []
    repeated = _repeated(metrics)
    if repeated:
        return [Problem("spec.expect.baseline.metrics", f"repeats {', '.join(repeated)}; list each metric once")]
    return []


@_rule(
    "model",
    "has(self.config) != has(self.path)",
    "spec.model: needs exactly one of config and path",
    "",
)
def _model_one_source(spec: SpecParts) -> list[Problem]:
    m = spec.model
    if (m.config is None) == (m.path is None):
        which = "both are set" if m.config is not None else "neither is set"
        return [Problem("spec.model", f"needs exactly one of config and path ({which})")]
    return []


@_rule(
    "model",
    "!has(self.path) || has(self.claimName)",
    "spec.model.claimName: required with spec.model.path",
    ".claimName",
)
def _model_path_needs_claim(spec: SpecParts) -> list[Problem]:
    m = spec.model
    if m.path is not None and m.claim_name is None:
        return [Problem("spec.model.claimName", "required with spec.model.path (the PVC holding the checkpoint)")]
    return []


@_rule(
    "model",
    "!has(self.path) || (!self.path.startsWith('/') && !self.path.matches('(^|/)\\\\.\\\\.(/|$)'))",
    "spec.model.path: must be relative to the claim's root, without '..'",
    ".path",
)
def _model_path_relative(spec: SpecParts) -> list[Problem]:
    m = spec.model
    if m.path is not None and outside_its_root(m.path):
        return [Problem("spec.model.path", f"must be relative to the claim's root, without '..' ({m.path!r})")]
    return []
