"""``spec.sweep``, the memory frontier (issue 32): one job runs a list of points, each the job with some spec fields
set to other values, and answers what fits.

The models (``SweepAxis``, ``SweepSpec``, ``FrontierExpectation`` for ``spec.expect.frontier``) and the pure
functions over them: an axis's values (``axis_values``), the grid (``grid_points``), the job of one point
(``point_job``, validated as any job is) and the part of a point that changes the engines (``engine_key``). The
cross-field rules over a sweep, with their CEL twins, are in ``forge_replay.api.sweep_rules``; the search and the
report are in ``forge_replay.verdict.sweep``.

This module imports no other spec module (``spec_parts`` and ``job`` import it): ``point_job`` validates a point
with the class of the job it is given.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from forge_replay.api.base import ApiModel, FiniteFloat, Int
from forge_replay.api.names import Problem, SpecInvalid

SWEEPABLE_FIELDS = ("trainer.microBatchTokens", "replay.stretch.maxTokens")
"""The spec fields (paths relative to spec) an axis may sweep, besides ``rollout.engineArgs.<name>``."""
ENGINE_ARGS = "rollout.engineArgs."
"""The prefix of a swept sglang server argument: a point changes the engines' configuration."""
FIELD_PATTERN = (r"^(" + "|".join(re.escape(f) for f in SWEEPABLE_FIELDS)
                 + r"|rollout\.engineArgs\.[a-z0-9][a-z0-9-]*)$")
"""What ``field`` may be (the CRD's pattern; the engine argument's name is checked against sglang's list at each
point, as spec.rollout.engineArgs is)."""
MAX_AXES = 3
"""At most three axes (e.g. micro-batch x context length x mem-fraction-static): the CRD's CEL multiplies the axes'
lengths term by term, and a larger grid is rarely what one job should run."""
MAX_AXIS_VALUES = 64
"""At most this many values per axis (listed, or the geometric series')."""
MAX_POINTS = 1024
"""The upper bound of ``maxPoints``: every point is validated before anything starts."""
DEFAULT_MAX_POINTS = 32
DEFAULT_HEADROOM = 0.05
"""A point fits under budgetGiB x (1 - headroom): 5% of the budget is kept for what a short run does not show
(allocator fragmentation over a long run, a longer sample than the replayed ones, the next framework version)."""

Value = int | float
"""A value of an axis: an integer where it is integral (token counts), else a float (mem-fraction-static)."""


class SweepAxis(ApiModel):
    """One swept spec field: listed ``values``, or the geometric series ``min``, ``min x factor``, ... up to ``max``."""

    field: str = Field(
        min_length=1,
        max_length=253,
        description="The spec field swept, a path relative to spec: trainer.microBatchTokens, "
        "replay.stretch.maxTokens or rollout.engineArgs.<sglang server argument> (e.g. "
        "rollout.engineArgs.mem-fraction-static; the engines are restarted for each value of such an axis).",
        json_schema_extra={"pattern": FIELD_PATTERN},
    )
    values: list[FiniteFloat] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_AXIS_VALUES,
        description="The values, strictly increasing (the frontier search walks the last axis upwards). Or min, "
        "max and factor.",
    )
    min: FiniteFloat | None = Field(default=None, gt=0, description="The first value of a geometric axis.")
    max: FiniteFloat | None = Field(
        default=None, gt=0, description="The largest value a geometric axis may reach (included when the series "
        "lands on it)."
    )
    factor: FiniteFloat | None = Field(
        default=None, gt=1, description="The ratio of a geometric axis: min, min x factor, min x factor^2, ... <= max."
    )

    @field_validator("field")
    @classmethod
    def _sweepable(cls, value: str) -> str:
        if not re.match(FIELD_PATTERN, value):
            raise ValueError(
                f"{value!r} cannot be swept: an axis sweeps one of {', '.join(SWEEPABLE_FIELDS)} or "
                f"{ENGINE_ARGS}<name> (an sglang server argument, e.g. {ENGINE_ARGS}mem-fraction-static)"
            )
        return value


class SweepSpec(ApiModel):
    """The memory frontier: run the job at every point of the axes (grid), or search, for each combination of the
    other axes, the largest value of the last axis that fits (frontier). One Ray cluster, one queue admission."""

    axes: list[SweepAxis] = Field(
        min_length=1,
        max_length=MAX_AXES,
        description="The swept fields, each once; the last axis is the one the frontier is searched along.",
    )
    search: Literal["grid", "frontier"] = Field(
        default="frontier",
        description="grid: every point, in grid order grouped by engine configuration (the points that share "
        "rollout.engineArgs values run together: the engines start once per configuration). frontier: for each combination of the other axes, the largest "
        "value of the last axis such that it and every smaller value fit, from a fitted peak = fixed + slope x "
        "value (bisection where the curve is not linear): at most ceil(log2 n) + 3 points on an axis of n >= 8 "
        "values.",
    )
    budget_gib: FiniteFloat | None = Field(
        default=None,
        gt=0,
        alias="budgetGiB",
        description="Memory budget in GiB: per GPU (default: the device's total memory), or per trainer rank on "
        "CPU (spec.trainer.gpusPerNode 0), where it is required.",
    )
    headroom: FiniteFloat = Field(
        default=DEFAULT_HEADROOM,
        ge=0,
        lt=1,
        description="A point fits when it did not run out of memory and its peak <= budgetGiB x (1 - headroom). "
        "The default 0.05 keeps 5% for what a short run does not show (fragmentation, longer samples).",
    )
    rollouts_per_point: Int = Field(
        default=2,
        ge=2,
        le=1_000_000,
        description="Rollouts (training steps) each point runs, from spec.replay.startRolloutId (it replaces "
        "spec.replay.numRollouts there): at least 2, as the second step is where colocated runs often run out of "
        "memory.",
    )
    max_points: Int = Field(
        default=DEFAULT_MAX_POINTS,
        ge=1,
        le=MAX_POINTS,
        description="The grid's point count (the product of the axes' lengths) may not exceed this.",
    )


class FrontierExpectation(ApiModel):
    """One requirement on the frontier: at the combination ``at`` of the other axes, the frontier of the last axis
    is at least the value in ``fits``."""

    at: dict[str, FiniteFloat] = Field(
        default_factory=dict,
        max_length=MAX_AXES - 1,
        description="A value of each axis but the last, by field (e.g. {trainer.microBatchTokens: 32768}); empty "
        "with one axis.",
    )
    fits: dict[str, FiniteFloat] = Field(
        min_length=1,
        max_length=1,
        description="The last axis's field and the value that must fit there (e.g. {replay.stretch.maxTokens: "
        "65536}): the frontier at `at` must be >= it.",
    )


# ------------------------------------------------------------------------------------------ points


def tidy(value: float) -> Value:
    """``value`` to 12 significant digits, an int when integral: 1024 x 1.5^3 is 3456, not 3455.9999999999995."""
    rounded = float(f"{value:.12g}")
    return int(rounded) if rounded.is_integer() else rounded


AxisProblemKind = Literal["form", "range", "order", "length"]
"""Which of an axis's rules it breaks: one form (values, or min, max and factor), max >= min, values strictly
increasing, at most MAX_AXIS_VALUES values."""


def axis_problem(axis: SweepAxis) -> tuple[AxisProblemKind, str] | None:
    """Why ``axis`` gives no values, and which rule that is; None when it is well formed. The rules in
    ``sweep_rules`` report it with the axis's path."""
    geometric = (axis.min, axis.max, axis.factor)
    if axis.values is not None and any(v is not None for v in geometric):
        return "form", "give either values or min, max and factor, not both"
    if axis.values is None:
        if any(v is None for v in geometric):
            return "form", "needs values, or all of min, max and factor"
        assert axis.min is not None and axis.max is not None and axis.factor is not None
        if axis.max < axis.min:
            return "range", f"max {tidy(axis.max)} is below min {tidy(axis.min)}"
        count = _geometric_count(axis.min, axis.max, axis.factor)
        if count > MAX_AXIS_VALUES:
            return "length", f"min, max and factor give more than {MAX_AXIS_VALUES} values; at most {MAX_AXIS_VALUES}"
        return None
    if any(b <= a for a, b in itertools.pairwise(axis.values)):
        return "order", "values must be strictly increasing"
    return None


def _geometric_count(low: float, high: float, factor: float) -> int:
    """How many of low, low x factor, ... are <= high (with a relative tolerance for float rounding)."""
    if high < low:
        return 0
    estimate = int(math.floor(math.log(high / low) / math.log(factor) + 1e-9)) + 1
    return min(estimate, MAX_AXIS_VALUES + 1)


def axis_values(axis: SweepAxis) -> list[Value]:
    """The values of ``axis``, increasing: its list, or min, min x factor, ... <= max; each ``tidy``."""
    problem = axis_problem(axis)
    if problem is not None:
        raise SpecInvalid([Problem("spec.sweep.axes", f"{axis.field}: {problem[1]}")])
    if axis.values is not None:
        return [tidy(v) for v in axis.values]
    assert axis.min is not None and axis.max is not None and axis.factor is not None
    count = _geometric_count(axis.min, axis.max, axis.factor)
    return [tidy(axis.min * axis.factor**k) for k in range(count)]


def point_count(sweep: SweepSpec) -> int:
    """The number of points of a full grid: the product of the axes' lengths."""
    return math.prod(len(axis_values(axis)) for axis in sweep.axes)


def grid_points(sweep: SweepSpec) -> list[dict[str, Value]]:
    """Every point of the grid, as {field: value}, the last axis varying fastest."""
    fields = [axis.field for axis in sweep.axes]
    return [dict(zip(fields, combo, strict=True))
            for combo in itertools.product(*(axis_values(axis) for axis in sweep.axes))]


def point_label(values: dict[str, Value]) -> str:
    """A point as people read it: ``{trainer.microBatchTokens: 4096, replay.stretch.maxTokens: 65536}``."""
    return "{" + ", ".join(f"{field}: {value}" for field, value in values.items()) + "}"


def engine_key(values: dict[str, Value]) -> tuple[tuple[str, Value], ...]:
    """The part of a point that changes the engines' configuration (its ``rollout.engineArgs.*`` values, sorted):
    points with the same key can share warm engines, only the trainer is replaced between them."""
    return tuple(sorted((field, value) for field, value in values.items() if field.startswith(ENGINE_ARGS)))


class PointInvalid(SpecInvalid):
    """The job at one point of a sweep breaks the API rules: ``values`` is the point, each problem names the field
    and the point."""

    def __init__(self, values: dict[str, Value], problems: list[Problem]):
        self.values = dict(values)
        self.causes = list(problems)
        """The problems as the point's job has them, without the point's name."""
        super().__init__([Problem(p.path, f"at sweep point {point_label(values)}: {p.message}") for p in problems])


Job = TypeVar("Job", bound=BaseModel)


def point_job(job: Job, values: dict[str, Value]) -> Job:
    """The job (a ForgeReplayJob, or a ForgeReplayJobSpec) at one point of its sweep, validated as any job is.

    Each ``values`` field is set to its value (an integral number as an int; an engine argument as text, as
    spec.rollout.engineArgs holds it); ``spec.replay.numRollouts`` becomes the sweep's rolloutsPerPoint. The point's
    job has no ``sweep`` and no ``expect.frontier`` (those are the sweep's, not a point's): it is what one point
    runs, a plain single job. Raises ``PointInvalid`` naming the point and the field when the point is invalid."""
    wrapped = hasattr(job, "spec")
    data = job.model_dump(mode="json", by_alias=True, exclude_unset=True)
    spec = data.setdefault("spec", {}) if wrapped else data
    sweep = getattr(job.spec if wrapped else job, "sweep", None)  # type: ignore[attr-defined]
    spec.pop("sweep", None)
    _drop_frontier_expectation(spec)
    if sweep is not None:
        spec.setdefault("replay", {})["numRollouts"] = sweep.rollouts_per_point
    for field, value in values.items():
        problem = _set(spec, field, value)
        if problem is not None:
            raise PointInvalid(values, [problem])
    try:
        return type(job).model_validate(data)
    except SpecInvalid as exc:
        raise PointInvalid(values, exc.problems) from None
    except ValidationError as exc:
        raise PointInvalid(values, _problems(exc, "" if wrapped else "spec")) from None


def _drop_frontier_expectation(spec: dict[str, Any]) -> None:
    expect = spec.get("expect")
    if isinstance(expect, dict) and "frontier" in expect:
        expect.pop("frontier")
        if not any(v is not None for v in expect.values()):
            spec.pop("expect")


def _set(spec: dict[str, Any], field: str, value: Value) -> Problem | None:
    """Set ``field`` (a path relative to spec) in the spec dict; a Problem when its parent object is absent."""
    if field.startswith(ENGINE_ARGS):
        rollout = spec.get("rollout")
        if not isinstance(rollout, dict):
            return Problem("spec.rollout", f"required to sweep {field} (engine arguments need the sglang engines of "
                           "forge mode)")
        rollout.setdefault("engineArgs", {})[field.removeprefix(ENGINE_ARGS)] = str(tidy(value))
        return None
    *parents, name = field.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return Problem("spec." + field, "its parent is not an object")
    node[name] = tidy(value)
    return None


def _problems(exc: ValidationError, prefix: str) -> list[Problem]:
    """A point's ValidationError as Problems with camelCase paths (``parse.problems_from`` is above this module:
    ``parse`` imports ``job``, which imports this one)."""
    problems: list[Problem] = []
    for err in exc.errors():
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, SpecInvalid):
            problems.extend(inner.problems)
            continue
        path = prefix
        for part in err["loc"]:
            path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else str(part))
        message = str(err["msg"]).removeprefix("Value error, ")
        if "input" in err and not isinstance(err["input"], (dict, list)):
            message += f" (got {err['input']!r})"
        problems.append(Problem(path, message[:1].lower() + message[1:]))
    return problems
