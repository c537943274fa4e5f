"""The cross-field rules of ``spec.sweep`` and ``spec.expect.frontier`` (issue 32), each Python check beside its CEL
twin as in ``rules``. ForgeReplayJobSpec runs them after the core and bring-your-own rules.

What the API server cannot check has no CEL twin (``cel=None``), and ``forge-replay validate`` and the operator
refuse it before anything is created: a geometric axis's length (a logarithm CEL lacks), and every point's job
(the spec with that point's values must be valid: the whole model's validation, once per point).
"""

from __future__ import annotations

from forge_replay.api.names import Problem
from forge_replay.api.rules import CrossFieldRule, SpecParts, recorder
from forge_replay.api.sweep import (
    ENGINE_ARGS,
    MAX_AXES,
    MAX_AXIS_VALUES,
    AxisProblemKind,
    PointInvalid,
    SweepSpec,
    axis_problem,
    axis_values,
    grid_points,
    point_job,
    point_label,
    tidy,
)

SWEEP_RULES: list[CrossFieldRule] = []
"""The sweep's rules, in order (after ``rules.CORE_RULES`` and ``byo_rules.BYO_RULES``)."""
_rule = recorder(SWEEP_RULES)

MAX_POINT_PROBLEMS = 5
"""Invalid points reported one by one; past this many, a count (a bad base value breaks every point alike)."""


def _sweep_ok(sweep: SweepSpec) -> bool:
    """Whether every axis gives values and the fields are distinct (what the point rules need)."""
    fields = [a.field for a in sweep.axes]
    return len(set(fields)) == len(fields) and all(axis_problem(a) is None for a in sweep.axes)


@_rule(
    "",
    "!has(self.sweep) || !has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend == 'builtin'",
    "spec.sweep: only with the builtin trainer (backend slime or miles cannot be swept yet)",
    ".sweep",
)
def _sweep_builtin_only(spec: SpecParts) -> list[Problem]:
    if spec.sweep is not None and spec.trainer.backend != "builtin":
        return [Problem("spec.sweep", f"only with the builtin trainer: backend {spec.trainer.backend} cannot be swept "
                        "yet (forge-replay cannot replace its trainer between points); run one job per point")]
    return []


@_rule(
    "",
    "!has(self.sweep) || has(self.sweep.budgetGiB) || "
    "(has(self.trainer) && has(self.trainer.gpusPerNode) ? self.trainer.gpusPerNode : 8) > 0",
    "spec.sweep.budgetGiB: required on CPU (spec.trainer.gpusPerNode 0): the budget per trainer rank",
    ".sweep.budgetGiB",
)
def _cpu_needs_budget(spec: SpecParts) -> list[Problem]:
    if spec.sweep is not None and spec.sweep.budget_gib is None and spec.trainer.gpus_per_node == 0:
        return [Problem("spec.sweep.budgetGiB", "required on CPU (spec.trainer.gpusPerNode is 0): the memory budget "
                        "per trainer rank in GiB (on GPUs it defaults to the device's total memory)")]
    return []


@_rule(
    "sweep",
    "self.axes.all(a, has(a.values) ? !has(a.min) && !has(a.max) && !has(a.factor) : "
    "has(a.min) && has(a.max) && has(a.factor))",
    "spec.sweep.axes: each axis needs exactly one of values, or min, max and factor together",
    ".axes",
)
def _axis_one_form(spec: SpecParts) -> list[Problem]:
    return _axis_problems(spec, "form")


@_rule(
    "sweep",
    "self.axes.all(a, !has(a.min) || !has(a.max) || a.min <= a.max)",
    "spec.sweep.axes: an axis's max must be at least its min",
    ".axes",
)
def _axis_min_max(spec: SpecParts) -> list[Problem]:
    return _axis_problems(spec, "range")


@_rule(
    "sweep",
    "self.axes.all(a, !has(a.values) || (a.values.isSorted() && "
    "a.values.all(v, a.values.filter(w, w == v).size() == 1)))",
    "spec.sweep.axes: an axis's values must be strictly increasing",
    ".axes",
)
def _axis_increasing(spec: SpecParts) -> list[Problem]:
    return _axis_problems(spec, "order")


@_rule("sweep", None, f"spec.sweep.axes: at most {MAX_AXIS_VALUES} values per axis, a geometric one's too "
       "(min, max and factor)", ".axes")
def _axis_length(spec: SpecParts) -> list[Problem]:
    # A geometric axis's length is floor(log(max / min) / log(factor)) + 1: CEL has no logarithm.
    return _axis_problems(spec, "length")


def _axis_problems(spec: SpecParts, kind: AxisProblemKind) -> list[Problem]:
    """The problems of that kind of the sweep's axes (``sweep.axis_problem``), each with its axis's path."""
    if spec.sweep is None:
        return []
    problems = []
    for i, axis in enumerate(spec.sweep.axes):
        problem = axis_problem(axis)
        if problem is not None and problem[0] == kind:
            problems.append(Problem(f"spec.sweep.axes[{i}]", f"{axis.field}: {problem[1]}"))
    return problems


@_rule(
    "sweep",
    "self.axes.all(a, self.axes.filter(b, b.field == a.field).size() == 1)",
    "spec.sweep.axes: each field is swept by one axis",
    ".axes",
)
def _fields_unique(spec: SpecParts) -> list[Problem]:
    if spec.sweep is None:
        return []
    fields = [a.field for a in spec.sweep.axes]
    repeated = sorted({f for f in fields if fields.count(f) > 1})
    if repeated:
        return [Problem("spec.sweep.axes", f"{', '.join(repeated)} swept by more than one axis; give each field one "
                        "axis")]
    return []


def _cel_grid_size() -> str:
    """CEL: the product of the axes' lengths, all axes listing values (at most MAX_AXES of them)."""
    terms = [f"size(self.axes[{i}].values)" for i in range(MAX_AXES)]
    expr = " * ".join(terms)
    for n in range(MAX_AXES - 1, 0, -1):
        expr = f"size(self.axes) == {n} ? {' * '.join(terms[:n])} : ({expr})"
    return expr


@_rule(
    "sweep",
    f"!self.axes.all(a, has(a.values)) || ({_cel_grid_size()}) <= (has(self.maxPoints) ? self.maxPoints : 32)",
    "spec.sweep.maxPoints: the grid (the product of the axes' lengths) has more points than maxPoints (the API "
    "server counts axes that list values; validate and the operator count geometric ones too)",
    ".maxPoints",
)
def _grid_within_max_points(spec: SpecParts) -> list[Problem]:
    # The CEL twin counts axes that list values; a geometric axis's length is the Python check's alone.
    sweep = spec.sweep
    if sweep is None or not _sweep_ok(sweep):
        return []
    lengths = [len(axis_values(a)) for a in sweep.axes]
    count = 1
    for n in lengths:
        count *= n
    if count > sweep.max_points:
        shape = " x ".join(str(n) for n in lengths)
        return [Problem("spec.sweep.maxPoints", f"the grid has {shape} = {count} points, more than maxPoints "
                        f"{sweep.max_points}: raise maxPoints or give fewer values")]
    return []


@_rule(
    "",
    f"!has(self.sweep) || has(self.rollout) || self.sweep.axes.all(a, !a.field.startsWith('{ENGINE_ARGS}'))",
    f"spec.sweep.axes: a {ENGINE_ARGS}<name> axis needs spec.rollout (the engines of forge mode)",
    ".sweep.axes",
)
def _engine_axis_needs_rollout(spec: SpecParts) -> list[Problem]:
    if spec.sweep is None or spec.rollout is not None:
        return []
    return [Problem(f"spec.sweep.axes[{i}].field", f"{a.field}: needs spec.rollout (debug mode starts no sglang "
                    "engines, so there are no engine arguments to sweep)")
            for i, a in enumerate(spec.sweep.axes) if a.field.startswith(ENGINE_ARGS)]


@_rule("", None, "spec.sweep: the spec at every point of the grid (its values set, its rolloutsPerPoint as "
       "numRollouts) must be valid; each invalid point is named with its field", ".sweep")
def _every_point_valid(spec: SpecParts) -> list[Problem]:
    """Every point's job is valid: the spec with that point's values, validated as any spec (each problem names the
    point and the field). Problems the spec has without the sweep are the other rules' to report, not repeated."""
    sweep = spec.sweep
    if sweep is None or spec.trainer.backend != "builtin" or not _sweep_ok(sweep) or _grid_within_max_points(spec):
        return []
    if spec.rollout is None and any(a.field.startswith(ENGINE_ARGS) for a in sweep.axes):
        return []
    _touch(spec)
    try:
        point_job(spec, {})  # type: ignore[type-var]
        known: set[Problem] = set()
    except PointInvalid as exc:
        known = set(exc.causes)
    invalid: list[PointInvalid] = []
    for values in grid_points(sweep):
        try:
            point_job(spec, values)  # type: ignore[type-var]
        except PointInvalid as exc:
            if set(exc.causes) - known:
                invalid.append(exc)
    problems = [Problem("spec.sweep", f"point {point_label(exc.values)} is invalid: " + "; ".join(
        str(p) for p in exc.causes if p not in known)) for exc in invalid[:MAX_POINT_PROBLEMS]]
    if len(invalid) > MAX_POINT_PROBLEMS:
        problems.append(Problem("spec.sweep", f"and {len(invalid) - MAX_POINT_PROBLEMS} more invalid points"))
    return problems


def _touch(model: object) -> None:
    """Read every field of ``model``, nested models too: a spec that ``parse`` built around invalid fields (to list
    the rules' problems beside the fields') has stand-ins there that refuse to be read, and the rule is skipped."""
    for name in type(model).model_fields:  # type: ignore[attr-defined]
        value = getattr(model, name)
        if hasattr(type(value), "model_fields"):
            _touch(value)
        else:
            bool(value)


# ------------------------------------------------------------------------------------------ spec.expect.frontier


@_rule(
    "",
    "!has(self.expect) || !has(self.expect.frontier) || has(self.sweep)",
    "spec.expect.frontier: needs spec.sweep (a frontier is what a sweep finds)",
    ".expect.frontier",
)
def _frontier_needs_sweep(spec: SpecParts) -> list[Problem]:
    if spec.expect is not None and spec.expect.frontier is not None and spec.sweep is None:
        return [Problem("spec.expect.frontier", "needs spec.sweep: a frontier is what a sweep finds")]
    return []


@_rule(
    "",
    "!has(self.expect) || !has(self.expect.frontier) || !has(self.sweep) || self.expect.frontier.all(f, "
    "f.fits.all(k, k == self.sweep.axes[size(self.sweep.axes) - 1].field) && "
    "(has(f.at) ? size(f.at) : 0) == size(self.sweep.axes) - 1 && "
    "(!has(f.at) || f.at.all(k, k != self.sweep.axes[size(self.sweep.axes) - 1].field && "
    "self.sweep.axes.exists(a, a.field == k))))",
    "spec.expect.frontier: each entry's fits names the sweep's last axis, and at gives a value of every other axis",
    ".expect.frontier",
)
def _frontier_names_the_axes(spec: SpecParts) -> list[Problem]:
    if spec.expect is None or spec.expect.frontier is None or spec.sweep is None:
        return []
    fields = [a.field for a in spec.sweep.axes]
    last, others = fields[-1], fields[:-1]
    problems = []
    for i, want in enumerate(spec.expect.frontier):
        path = f"spec.expect.frontier[{i}]"
        wrong = [k for k in want.fits if k != last]
        if wrong:
            problems.append(Problem(f"{path}.fits", f"names {', '.join(wrong)}; the frontier is searched along the "
                            f"sweep's last axis, {last}"))
        if sorted(want.at) != sorted(others):
            problems.append(Problem(f"{path}.at", f"gives {', '.join(sorted(want.at)) or 'no field'}; it needs a "
                            f"value of each other axis: {', '.join(others) or 'none (one axis: leave at empty)'}"))
    return problems


@_rule("", None, "spec.expect.frontier: each value in at is a value of that axis (a point of the grid)",
       ".expect.frontier")
def _frontier_at_grid_values(spec: SpecParts) -> list[Problem]:
    sweep, expect = spec.sweep, spec.expect
    if expect is None or expect.frontier is None or sweep is None or not _sweep_ok(sweep):
        return []
    values = {a.field: axis_values(a) for a in sweep.axes}
    problems = []
    for i, want in enumerate(expect.frontier):
        for field, value in want.at.items():
            if field in values and tidy(value) not in values[field]:
                problems.append(Problem(f"spec.expect.frontier[{i}].at.{field}", f"{tidy(value)} is not a value of "
                                f"that axis ({', '.join(str(v) for v in values[field])})"))
    return problems
