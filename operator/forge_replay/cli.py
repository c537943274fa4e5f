"""The `forge-replay` command line.

Subcommands owned by other packages are registered lazily (module:attribute), so that
`forge-replay validate` never pays for importing torch or ray.
"""

from __future__ import annotations

import importlib

import click

from forge_replay import __version__

# name -> "module:attribute" of a click command; imported only when that command runs.
LAZY_COMMANDS: dict[str, str] = {
    "validate": "forge_replay.api.cli:validate",
    "crd": "forge_replay.api.cli:crd",
    "dumps": "forge_replay.dumps.cli:dumps",
    "run": "forge_replay.runtime.cli:run",
    "render": "forge_replay.controller.cli:render",
    "operator": "forge_replay.controller.cli:operator",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="forge-replay")
def main() -> None:
    """Replay-mode RL training jobs: validate, render, verify dumps, run locally, or run the operator."""


if __name__ == "__main__":  # pragma: no cover
    main()
