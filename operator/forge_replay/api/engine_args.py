"""Rules for spec.rollout.engineArgs (the sglang server flags passed through as ``--key value``).

A key is an sglang server argument name, exactly (``mem-fraction-static``; a leading ``--`` is allowed): sglang's
argparse accepts any unambiguous prefix (``tp-siz`` for ``tp-size``) and ``--key=value``, which would let an entry
smuggle in a flag forge-replay sets itself after our own. The names come from the pinned sglang's own parser,
kept as data in ``sglang_server_args.json`` (the operator image has no sglang), written by
``scripts/sglang-server-args`` from the installed sglang and checked against it by tests/conformance.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVER_ARGS_FILE = Path(__file__).with_name("sglang_server_args.json")

RESERVED_DESTS = {
    "host": "set by forge-replay itself",
    "port": "set by forge-replay itself",
    "model_path": "set by forge-replay itself",
    "tp_size": "set by forge-replay itself (spec.rollout.numGpusPerEngine)",
    "base_gpu_id": "set by forge-replay itself",
    "config": "reads more flags from a file, which could set the ones forge-replay sets; give each flag here",
    "help": "prints help and exits: the engine would never start",
}
"""sglang server arguments (by argparse dest, so every alias such as ``--model`` counts) an engineArgs key may not
name, and why."""


@dataclass(frozen=True)
class ServerArg:
    """One option name of sglang's server parser."""

    dest: str
    takes_value: bool
    """False for on/off switches (``store_true``, ``--no-...``), which take no value on the command line."""


def option_table(parser: argparse.ArgumentParser) -> dict[str, ServerArg]:
    """Every long option name of ``parser`` (without ``--``), with its dest and whether it takes a value."""
    table = {}
    for action in parser._actions:  # argparse has no public list of its actions
        for option in action.option_strings:
            if option.startswith("--"):
                table[option[2:]] = ServerArg(action.dest, action.nargs != 0)
    return dict(sorted(table.items()))


def table_document(parser: argparse.ArgumentParser, sglang_version: str) -> dict:
    """The JSON document of :data:`SERVER_ARGS_FILE` for ``parser`` (sglang's, of ``sglang_version``)."""
    return {
        "sglang": sglang_version,
        "source": "sglang.srt.server_args.ServerArgs.add_cli_args, written by scripts/sglang-server-args",
        "options": {name: {"dest": arg.dest, "takes_value": arg.takes_value}
                    for name, arg in option_table(parser).items()},
    }


@functools.cache
def server_args() -> tuple[str, dict[str, ServerArg]]:
    """(sglang version, option table) read from :data:`SERVER_ARGS_FILE`."""
    document = json.loads(SERVER_ARGS_FILE.read_text(encoding="utf-8"))
    return document["sglang"], {name: ServerArg(**arg) for name, arg in document["options"].items()}


def _closest(name: str, names: list[str]) -> str:
    """" (did you mean X?)": the name ``name`` abbreviates (as sglang's argparse would read it), else the closest."""
    match = sorted((n for n in names if name and n.startswith(name)), key=len)[:1]
    match = match or difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def engine_args_problems(engine_args: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field path, message) for every engineArgs entry forge-replay cannot pass through."""
    version, table = server_args()
    names = sorted(table)
    problems = []
    for key, value in engine_args.items():
        path = f"spec.rollout.engineArgs.{key}"
        name = key[2:] if key.startswith("--") else key
        arg = table.get(name)
        if not name or name.startswith("-") or "=" in name or any(c.isspace() for c in name):
            problems.append((path, "a key is one sglang server argument name, like mem-fraction-static (no '=', "
                                   f"no spaces, the value goes on the right){_closest(name.split('=')[0].strip('-'), names)}"))
        elif arg is None:
            problems.append((path, f"sglang {version} has no server argument --{name}{_closest(name, names)}"))
        elif arg.dest in RESERVED_DESTS:
            problems.append((path, f"--{name} is {RESERVED_DESTS[arg.dest]}; remove it from engineArgs"))
        elif not arg.takes_value and str(value).lower() not in ("", "true", "false"):
            problems.append((path, f"--{name} is an on/off switch: give true, false or \"\", not {value!r}"))
        elif arg.takes_value and str(value).lower() in ("", "true"):
            problems.append((path, f"--{name} takes a value (\"{value}\" would pass the flag alone)"))
    return problems
