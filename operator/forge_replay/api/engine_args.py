"""Rules for spec.rollout.engineArgs (the sglang server flags passed through as ``--key value``)."""

from __future__ import annotations

from collections.abc import Mapping

RESERVED_ENGINE_ARGS = frozenset({"host", "port", "model-path", "tp-size", "tp", "base-gpu-id"})
"""Server arguments forge-replay sets itself: an engineArgs entry for one of them is an error."""


def engine_args_problems(engine_args: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field path, message) for every engineArgs entry forge-replay cannot pass through."""
    problems = []
    for key in engine_args:
        path = f"spec.rollout.engineArgs.{key}"
        name = key[2:] if key.startswith("--") else key
        if not name or name.startswith("-") or any(c.isspace() for c in name):
            problems.append((path, "an engine argument name is a sglang flag name like mem-fraction-static"))
        elif name in RESERVED_ENGINE_ARGS:
            problems.append((path, f"--{name} is set by forge-replay itself; remove it from engineArgs"))
    return problems
