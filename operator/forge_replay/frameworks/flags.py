"""slime's and miles' flags: the tables read from their upstream ``arguments.py`` and which flags forge-replay
injects, owns or refuses.

Data and pure functions; nothing here imports pydantic, Ray or the framework. The flag tables
(``slime_flags.json``, ``miles_flags.json``) are written by ``scripts/backend-flags`` from the upstream
``arguments.py`` at the commit each file records; a test checks every flag injected here is in its table. What
their code refuses, skips or falls back on beyond the flag tables is in ``upstream_rules.json`` (``rules.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

BACKENDS = ("slime", "miles")
"""Foreign trainers: the team's own image and script, replay flags injected (``builtin`` is ours)."""

UPSTREAM_FORGE_FUNCTION = "slime.rollout.forge_load.generate_rollout"
"""slime's own forge loader (unpickles with torch.load(weights_only=False)); miles has none."""

FALLBACK_FLAGS = ("--forge-replay-fallback-to-first", "--no-forge-replay-fallback-to-first")
"""Our loader's switch for spec.replay.dumps.fallbackToFirst (miles only: slime drops undeclared flags)."""

OWN_FLAGS = ("--load-forge-rollout-data", *FALLBACK_FLAGS)
"""Flags our rollout function's ``add_arguments`` adds to a parser that lacks them (miles has none of these)."""

INJECTED_FLAGS = (
    "--actor-num-nodes", "--actor-num-gpus-per-node", "--num-gpus-per-node",
    "--rollout-num-gpus", "--rollout-num-gpus-per-engine", "--colocate",
    "--rollout-function-path", "--eval-function-path", "--load-forge-rollout-data",
    "--debug-train-only", "--load-debug-rollout-data",
    "--start-rollout-id", "--num-rollout", "--eval-interval", "--skip-eval-before-train", "--reward-key",
    "--eval-reward-key", "--use-fault-tolerance",
)  # fmt: skip
"""Every flag the operator may inject for either backend (``--ft-components`` too, for miles)."""

BACKEND_INJECTED = {"slime": INJECTED_FLAGS, "miles": (*INJECTED_FLAGS, "--ft-components", *FALLBACK_FLAGS)}

INJECTED_UNLESS_GIVEN = ("--disable-rollout-global-dataset",)
"""Flags injected unless the team's args decide (rule global-dataset of upstream_rules.json): not refused in args."""

REFUSED_FLAGS = {
    "slime": ("--num-epoch", "--dump-details", "--save-debug-rollout-data"),
    "miles": (
        "--num-epoch", "--dump-details", "--save-debug-rollout-data",
        "--fully-async", "--ci-inject-rollout-data-path",
    ),
}  # fmt: skip
"""Flags the team's args may not set although we do not inject them, per backend."""

_REFUSED_WHY = {
    "--num-epoch": "replay runs exactly the rollouts the spec names (--start-rollout-id and --num-rollout)",
    "--dump-details": "it writes under the dumps, which are mounted read-only",
    "--save-debug-rollout-data": "it writes dumps, which are mounted read-only",
    "--fully-async": "miles' fully async rollout generates instead of replaying",
    "--ci-inject-rollout-data-path": "miles' CI injection replaces rollouts behind the replay's back",
}


@dataclass(frozen=True)
class FlagTable:
    """One backend's options as its upstream arguments.py declares them."""

    backend: str
    repository: str
    commit: str
    file: str
    options: dict[str, dict[str, Any]]

    def has(self, flag: str) -> bool:
        """Whether ``flag`` (``--name``) is declared, as an option string or an alias."""
        return flag in self.options or any(flag in row.get("aliases", ()) for row in self.options.values())


@lru_cache(maxsize=None)
def flag_table(backend: str) -> FlagTable:
    """The committed flag table of ``backend`` (slime or miles)."""
    if backend not in BACKENDS:
        raise ValueError(f"no flag table for backend {backend!r}; one of {', '.join(BACKENDS)}")
    data = json.loads((Path(__file__).parent / f"{backend}_flags.json").read_text(encoding="utf-8"))
    return FlagTable(data["backend"], data["repository"], data["commit"], data["file"], data["options"])


def required_flags(backend: str) -> list[str]:
    """The flags ``backend``'s parser requires (``required=True`` in its arguments.py), sorted."""
    return sorted(flag for flag, row in flag_table(backend).options.items() if row.get("required"))


def missing_required(backend: str, args: list[str]) -> list[str]:
    """The required flags of ``backend`` that neither the team's ``args`` nor forge-replay's injected flags give."""
    return [flag for flag in required_flags(backend) if flag not in BACKEND_INJECTED[backend]
            and not sets_flag(args, flag)]


def flag_of(arg: str) -> str | None:
    """The option an argv item sets (``--f`` of ``--f`` or ``--f=v``); None for a value."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg.split("=", 1)[0]


def sets_flag(args: list[str] | tuple[str, ...], flag: str) -> bool:
    """Whether an item of ``args`` sets ``flag`` (``--f`` or ``--f=v``)."""
    return any(flag_of(a) == flag for a in args)


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (the last one, as argparse keeps it; ``--f v`` or ``--f=v``), or None."""
    value = None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def arg_problems(backend: str, args: list[str]) -> list[tuple[int, str]]:
    """(index, message) for each item of the team's ``args`` that sets a flag the operator owns or refuses."""
    problems: list[tuple[int, str]] = []
    injected, refused = BACKEND_INJECTED[backend], REFUSED_FLAGS[backend]
    for index, arg in enumerate(args):
        flag = flag_of(arg)
        if flag in injected:
            problems.append((index, f"{flag} is set by forge-replay from the spec; remove it from args"))
        elif flag in refused:
            problems.append((index, f"{flag} cannot be used in a replay: {_REFUSED_WHY[flag]}"))
    return problems
