"""The cross-field rules of a bring-your-own trainer (backend slime or miles): what the team's script, its upstream
parser and forge-replay's injected flags allow. Each check and its CEL twin are one record, as in ``rules``."""

from __future__ import annotations

import json
from typing import Any

from pydantic.alias_generators import to_camel

from forge_replay.api.dump_path import is_template
from forge_replay.api.names import ENV_NAME, Problem, short_repr
from forge_replay.api.rules import CEL_IS_TEMPLATE, CrossFieldRule, SpecParts, outside_its_root, recorder
from forge_replay.api.spec_parts import TrainerSpec
from forge_replay.frameworks.batch import batch_layout
from forge_replay.frameworks.flags import (
    BACKEND_INJECTED, BACKENDS, REFUSED_FLAGS, arg_problems, flag_of, flag_table, missing_required, required_flags,
    sets_flag,
)
from forge_replay.frameworks.rules import upstream_rule

RESERVED_ENV = {
    "RAY_ADDRESS": "the script reaches the job's own Ray cluster through it (KubeRay, or forge-replay run, sets it)",
    "FORGE_REPLAY_PROBE_DIR": "the memory probe writes where forge-replay sets it (the results folder)",
}
"""spec.trainer.env keys the job's wiring owns."""

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


_DYNAMIC_GBS = "--use-dynamic-global-batch-size"
"""miles: a global batch size the trainer computes from its own data-parallel size (not decided from the spec)."""

_SLIME_OWNED = (*BACKEND_INJECTED["slime"], *REFUSED_FLAGS["slime"])
_MILES_ONLY = tuple(f for f in (*BACKEND_INJECTED["miles"], *REFUSED_FLAGS["miles"]) if f not in _SLIME_OWNED)

BYO_RULES: list[CrossFieldRule] = []
"""The bring-your-own trainer rules, in order (after ``rules.CORE_RULES``)."""
_rule = recorder(BYO_RULES)


@_rule(
    "trainer",
    f"({_CEL_BUILTIN}) || !has(self.args) || self.args.all(a, !({_cel_sets_flag(_SLIME_OWNED)}) && "
    f"(self.backend != 'miles' || !({_cel_sets_flag(_MILES_ONLY)})))",
    "spec.trainer.args: an item sets a flag forge-replay injects, or --num-epoch, --dump-details, "
    "--save-debug-rollout-data (miles: --fully-async, --ci-inject-rollout-data-path)",
    ".args",
)
def _byo_args_allowed(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    return [Problem(f"spec.trainer.args[{i}]", message) for i, message in arg_problems(t.backend, t.args)]


@_rule(
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
)
def _byo_fields_need_backend(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if t.backend != "builtin":
        return []
    return [
        Problem(f"spec.trainer.{_alias(name)}", "only for backend slime or miles (the builtin trainer runs forge-replay's "
                "own image and code)")
        for name in _BYO_FIELDS
        if getattr(t, name) != _trainer_default(name)
    ]


@_rule(
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
)
def _builtin_fields_refused(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    return [
        Problem(f"spec.trainer.{_alias(name)}", f"means nothing to backend {t.backend}: set it in spec.trainer.args "
                "with the script's own flag, or remove it")
        for name in _BUILTIN_FIELDS
        if getattr(t, name) != _trainer_default(name)
    ]


@_rule(
    "trainer.env",
    f"self.all(k, k.matches({_cel_literal(ENV_NAME)}) && !(k in {_cel_literal(sorted(RESERVED_ENV))}))",
    "spec.trainer.env: names are letters, digits and '_' (not starting with a digit), and RAY_ADDRESS and "
    "FORGE_REPLAY_PROBE_DIR are the job's own",
    "",
)
def _byo_env_names(spec: SpecParts) -> list[Problem]:
    import re

    problems = []
    for key in spec.trainer.env:
        path = f"spec.trainer.env.{key}" if key else "spec.trainer.env"
        if not re.fullmatch(ENV_NAME, key):
            problems.append(Problem(path, f"{short_repr(key)} is not an environment variable name (letters, digits and "
                                    "'_', not starting with a digit)"))
        elif key in RESERVED_ENV:
            problems.append(Problem(path, f"cannot be set: {RESERVED_ENV[key]}"))
    return problems


@_rule(
    "trainer",
    "!has(self.script) || (!self.script.startsWith('/') && !self.script.matches('(^|/)\\\\.\\\\.(/|$)'))",
    "spec.trainer.script: must be relative to workingDir, without '..'",
    ".script",
)
def _byo_script_relative(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if outside_its_root(t.script):
        return [Problem("spec.trainer.script", f"must be relative to workingDir, without '..' ({t.script!r})")]
    return []


@_rule(
    "trainer",
    "!has(self.workingDir) || !self.workingDir.matches('(^|/)\\\\.\\\\.(/|$)')",
    "spec.trainer.workingDir: must not contain '..'",
    ".workingDir",
)
def _byo_working_dir_plain(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if ".." in t.working_dir.split("/"):
        return [Problem("spec.trainer.workingDir", f"must not contain '..' ({t.working_dir!r})")]
    return []


@_rule(
    "trainer",
    f"({_CEL_BUILTIN}) || (has(self.image) && self.image != '' && has(self.workingDir) && "
    "self.workingDir.startsWith('/'))",
    "spec.trainer.image: image and an absolute workingDir are required with backend slime or miles",
    ".image",
)
def _byo_needs_image(spec: SpecParts) -> list[Problem]:
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


@_rule(
    "",
    "!has(self.replay.loader) || self.replay.loader != 'upstream' || "
    "(has(self.trainer) && has(self.trainer.backend) && self.trainer.backend != 'builtin')",
    "spec.replay.loader: upstream is slime's own loader: it needs backend slime or miles",
    ".replay.loader",
)
def _upstream_loader_needs_byo(spec: SpecParts) -> list[Problem]:
    if spec.replay.loader == "upstream" and spec.trainer.backend == "builtin":
        return [Problem("spec.replay.loader", "upstream is slime's own loader: it needs backend slime or miles "
                        "(the builtin trainer always uses forge-replay's safe loader)")]
    return []


_STRETCH_BUILTIN = ("builtin trainer only for now: slime and miles read the dumps with their own rollout function, "
                    "which does not stretch them")


@_rule(
    "",
    "!has(self.replay.stretch) || !has(self.trainer) || !has(self.trainer.backend) "
    "|| self.trainer.backend == 'builtin'",
    f"spec.replay.stretch: {_STRETCH_BUILTIN}",
    ".replay.stretch",
)
def _stretch_needs_builtin(spec: SpecParts) -> list[Problem]:
    if spec.replay.stretch is not None and spec.trainer.backend != "builtin":
        return [Problem("spec.replay.stretch", _STRETCH_BUILTIN)]
    return []


@_rule(
    "",
    "!has(self.replay.loader) || self.replay.loader != 'upstream' || self.replay.mode != 'forge' || "
    "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend != 'miles'",
    "spec.replay.loader: miles has no forge_load: use loader forgeReplay in forge mode",
    ".replay.loader",
)
def _miles_has_no_forge_load(spec: SpecParts) -> list[Problem]:
    if spec.replay.loader == "upstream" and spec.trainer.backend == "miles" and spec.replay.mode == "forge":
        return [Problem("spec.replay.loader", "miles has no forge_load: use loader forgeReplay in forge mode")]
    return []


@_rule(
    "",
    "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin' || "
    "!has(self.replay.dumps.fallbackToFirst) || self.replay.dumps.fallbackToFirst || "
    "(has(self.replay.loader) && self.replay.loader == 'upstream' && self.replay.mode == 'debug') || "
    "(self.trainer.backend == 'miles' && (!has(self.replay.loader) || self.replay.loader == 'forgeReplay'))",
    "spec.replay.dumps.fallbackToFirst: false can be honoured only by backend miles with loader forgeReplay, "
    "or by loader upstream in debug mode (slime's forge_load always falls back; slime drops flags it does not "
    "declare)",
    ".replay.dumps.fallbackToFirst",
)
def _byo_fallback_passable(spec: SpecParts) -> list[Problem]:
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


@_rule(
    "",
    f"!{_cel_backend_in(_backends_with('upstream-debug-loader', falls_back=False))} || "
    "!has(self.replay.loader) || self.replay.loader != 'upstream' || self.replay.mode != 'debug' || "
    "(has(self.replay.dumps.fallbackToFirst) && !self.replay.dumps.fallbackToFirst) || "
    f"!self.replay.dumps.path.matches('{CEL_IS_TEMPLATE}')",
    "spec.replay.dumps.fallbackToFirst: true cannot be honoured: --load-debug-rollout-data (loader upstream in "
    "debug mode) has no fallback; set fallbackToFirst: false or use loader forgeReplay",
    ".replay.dumps.fallbackToFirst",
)
def _upstream_debug_loader_has_no_fallback(spec: SpecParts) -> list[Problem]:
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


@_rule(
    "trainer",
    _cel_required_flags(),
    "spec.trainer.args: a flag the backend's parser requires is missing ("
    + "; ".join(f"{b} requires {', '.join(required_flags(b))}" for b in BACKENDS if required_flags(b))
    + "): the parser exits 2 without it",
    ".args",
)
def _byo_required_flags(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    if t.backend == "builtin":
        return []
    table = flag_table(t.backend)
    return [Problem("spec.trainer.args", f"{flag} is required by {t.backend}'s parser ({table.file}:"
                    f"{table.options[flag]['line']}, {table.repository}@{table.commit[:8]}), which exits 2 without it: "
                    "give it in args, as the run that wrote the dumps did")
            for flag in missing_required(t.backend, t.args)]


@_rule(
    "",
    f"!{_cel_backend_in(_backends_with('debug-skips-eval'))} || self.replay.mode != 'debug' || "
    "!has(self.replay.evalInterval) || self.replay.evalInterval == 0",
    "spec.replay.evalInterval: slime and miles never evaluate in debug mode (--debug-train-only): set "
    "evalInterval: 0, or replay in forge mode",
    ".replay.evalInterval",
)
def _byo_eval_in_debug(spec: SpecParts) -> list[Problem]:
    backend, replay = spec.trainer.backend, spec.replay
    rule = upstream_rule(backend, "debug-skips-eval") if backend != "builtin" else None
    if rule is None or replay.mode != "debug" or replay.eval_interval == 0:
        return []
    return [Problem("spec.replay.evalInterval", f"{backend} never evaluates in debug mode (--debug-train-only: "
                    f"{rule.where}), so no eval dump would be read: set evalInterval: 0, or replay in forge mode")]


@_rule(
    "",
    _cel_eval_datasets(),
    "spec.replay.evalInterval: slime and miles refuse --eval-interval unless spec.trainer.args configure eval "
    "datasets (--eval-prompt-data or --eval-config), which the replay never reads",
    ".replay.evalInterval",
)
def _byo_eval_needs_datasets(spec: SpecParts) -> list[Problem]:
    t, replay = spec.trainer, spec.replay
    rule = upstream_rule(t.backend, "eval-needs-datasets") if t.backend != "builtin" else None
    if rule is None or replay.mode != "forge" or replay.eval_interval == 0:
        return []
    if any(sets_flag(t.args, flag) for flag in rule["flags"]):
        return []
    return [Problem("spec.replay.evalInterval", f"{t.backend} refuses --eval-interval unless eval datasets are "
                    f"configured ({rule.where}): give {' or '.join(rule['flags'])} in spec.trainer.args (an eval "
                    "dataset the replay never reads: eval replays the eval_N dumps), or set evalInterval: 0")]


@_rule(
    "",
    "!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend != 'slime' || "
    "!has(self.faultTolerance) || !has(self.faultTolerance.enabled) || !self.faultTolerance.enabled || "
    "!has(self.faultTolerance.components) || 'rollout' in self.faultTolerance.components || "
    "self.replay.mode == 'debug'",
    "spec.faultTolerance.components: slime's fault tolerance has no components: [train] alone cannot be run",
    ".faultTolerance.components",
)
def _slime_ft_has_no_components(spec: SpecParts) -> list[Problem]:
    ft = spec.fault_tolerance  # in debug mode _ft_in_debug_watches_nothing says the one setting that works
    if spec.trainer.backend == "slime" and ft.enabled and ft.active_components == ["train"] \
            and spec.replay.mode != "debug":
        return [Problem("spec.faultTolerance.components", "slime's --use-fault-tolerance has no components (it "
                        "watches the rollout engines): [train] alone cannot be run; use [rollout] or backend miles")]
    return []


@_rule(
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
)
def _byo_gpus_divide(spec: SpecParts) -> list[Problem]:
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


# ------------------------------------------------------------------ what slime and miles refuse once the GPUs are up


def _cel_start_needs_checkpoint() -> str:
    per_backend = [f"self.trainer.backend != {_cel_literal(b)} || (has(self.trainer.args) && "
                   f"{_cel_args_set(_rule_facts(b, 'start-needs-checkpoint', 'flag'), 'self.trainer.args')})"
                   for b in _backends_with("start-needs-checkpoint")]
    return (f"!{_cel_backend_in(_backends_with('start-needs-checkpoint'))} || !has(self.replay.startRolloutId) || "
            "self.replay.startRolloutId == 0 || (" + " && ".join(f"({c})" for c in per_backend or ["true"]) + ")")


@_rule(
    "",
    _cel_start_needs_checkpoint(),
    "spec.replay.startRolloutId: miles resets --start-rollout-id to 0 unless --load holds a checkpoint: set "
    "startRolloutId: 0, or give --load (the checkpoint directory) in spec.trainer.args",
    ".replay.startRolloutId",
)
def _start_needs_checkpoint(spec: SpecParts) -> list[Problem]:
    t, replay = spec.trainer, spec.replay
    rule = upstream_rule(t.backend, "start-needs-checkpoint") if t.backend != "builtin" else None
    if rule is None or replay.start_rollout_id == 0 or sets_flag(t.args, rule["flag"]):
        return []
    start, end = replay.start_rollout_id, replay.start_rollout_id + replay.num_rollouts - 1
    return [Problem("spec.replay.startRolloutId", f"{t.backend} resets --start-rollout-id to 0 unless {rule['flag']} "
                    f"names a directory holding {rule['file']} ({rule.where}): it would replay rollouts 0-{end}, not "
                    f"{start}-{end}; give {rule['flag']} DIR (the checkpoint the run saved before rollout {start}) in "
                    "spec.trainer.args, or set startRolloutId: 0")]


@_rule(
    "trainer",
    f"!has(self.backend) || !(self.backend in {_cel_literal(_backends_with('debug-rollout-only'))}) || "
    "!has(self.args) || !" + _cel_args_set("--debug-rollout-only"),
    "spec.trainer.args: --debug-rollout-only cannot be used in a replay: slime and miles then never train, and a debug "
    "replay fails in their parser; remove it",
    ".args",
)
def _no_rollout_only(spec: SpecParts) -> list[Problem]:
    t = spec.trainer
    rule = upstream_rule(t.backend, "debug-rollout-only") if t.backend != "builtin" else None
    if rule is None:
        return []
    return [Problem(f"spec.trainer.args[{i}]", f"{rule['flag']} cannot be used in a replay: {t.backend} then never "
                    f"trains, and with the --debug-train-only of a debug replay its parser fails ({rule.where}); "
                    "remove it")
            for i, arg in enumerate(t.args) if flag_of(arg) == rule["flag"]]


@_rule(
    "",
    f"!{_cel_backend_in(_backends_with('ft-watches-rollout-only'))} || self.replay.mode != 'debug' || "
    "!has(self.faultTolerance) || !has(self.faultTolerance.enabled) || !self.faultTolerance.enabled",
    "spec.faultTolerance.enabled: slime's fault tolerance only watches the rollout engines, and a debug replay has "
    "none: set faultTolerance.enabled: false",
    ".faultTolerance.enabled",
)
def _ft_in_debug_watches_nothing(spec: SpecParts) -> list[Problem]:
    backend = spec.trainer.backend
    rule = upstream_rule(backend, "ft-watches-rollout-only") if backend != "builtin" else None
    if rule is None or spec.replay.mode != "debug" or not spec.fault_tolerance.enabled:
        return []
    return [Problem("spec.faultTolerance.enabled", f"{backend}'s --use-fault-tolerance only watches the rollout "
                    f"engines, which a debug replay does not start (with --debug-train-only it does nothing: "
                    f"{rule.where}): set faultTolerance.enabled: false; neither components: [train] nor [rollout] "
                    "can be run")]


@_rule(
    "",
    None,  # the global batch size over the cells: values of spec.trainer.args, in arithmetic
    "spec.faultTolerance.components: miles' train fault tolerance runs a cell per TP x PP x CP GPUs, each taking "
    "global-batch-size // cells samples a step: a global batch size below the cells fails in training; give "
    "--global-batch-size in spec.trainer.args",
    ".faultTolerance.components",
)
def _cells_need_a_batch(spec: SpecParts) -> list[Problem]:
    t, ft = spec.trainer, spec.fault_tolerance
    rule = upstream_rule(t.backend, "indep-dp-one-step") if t.backend != "builtin" else None
    from_ft = ft.enabled and "train" in ft.active_components
    if rule is None or not (from_ft or sets_flag(t.args, rule["flag"])) or sets_flag(t.args, _DYNAMIC_GBS):
        return []
    layout = batch_layout(t.backend, t.args, t.nodes * t.gpus_per_node, cells=True)
    gbs = layout.global_batch_size
    if layout.cells < 2 or gbs is None or gbs >= layout.cells:
        return []
    where = ("spec.faultTolerance.components", "train") if from_ft else ("spec.trainer.args", rule["flag"])
    source = ("Megatron's default: --micro-batch-size x the data-parallel size 1 of a cell" if
              layout.global_batch_from == "default" else layout.global_batch_from)
    return [Problem(where[0], f"{where[1]} makes {t.backend} run {layout.cells} independent data-parallel cells "
                    f"(nodes x gpusPerNode {layout.world_size} // TP x PP x CP {layout.model_size}), each taking "
                    f"global-batch-size // {layout.cells} samples a step, and the global batch size is {gbs} ({source}): "
                    f"none a step, a ZeroDivisionError in training ({rule.where}); give --global-batch-size in "
                    "spec.trainer.args: rollout-batch-size x n-samples-per-prompt, one step per rollout, which each "
                    f"cell must make (verify checks the dumps), or leave {where[1]} out")]
