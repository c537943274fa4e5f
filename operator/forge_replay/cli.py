"""The `forge-replay` command line.

Subcommands owned by other packages are registered lazily (module:attribute), so that
`forge-replay validate` never pays for importing torch or ray.
"""

from __future__ import annotations

import importlib

import click

from forge_replay import __version__

# name -> ("module:attribute" of a click command, one-line help); imported only when that command runs.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("forge_replay.commands.validate:validate", "Check ForgeReplayJob YAML files against the API rules."),
    "crd": ("forge_replay.commands.validate:crd", "Print the ForgeReplayJob CRD generated from the API models."),
    "dumps": ("forge_replay.commands.dumps:dumps", "Inspect, verify, synthesize and pack rollout dumps."),
    "run": ("forge_replay.commands.run:run", "Run a ForgeReplayJob on this machine with a local Ray."),
    "report": ("forge_replay.commands.report:report",
               "Compare run reports; print a baseline ConfigMap; list a results root's runs, untrust one."),
    "render": ("forge_replay.commands.render:render", "Print the Kubernetes objects the operator would create."),
    "operator": ("forge_replay.commands.operator:operator", "Run the kopf operator that reconciles ForgeReplayJobs."),
}


# Packages of the `runtime` extra: the base install (operator, validate, render, crd) has none of them.
RUNTIME_PACKAGES = {"torch", "ray", "transformers", "numpy", "matplotlib", "psutil"}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = LAZY_COMMANDS.get(name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in RUNTIME_PACKAGES:
                raise click.ClickException(
                    f"`forge-replay {name}` needs the runtime extra ({exc.name} is not installed): "
                    "pip install 'forge-replay[runtime]'"
                ) from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing commands must not import them (torch and ray take seconds to import).
        with formatter.section("Commands"):
            formatter.write_dl([(name, LAZY_COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="forge-replay")
def main() -> None:
    """Replay-mode RL training jobs: validate, render, verify dumps, run locally, or run the operator."""


if __name__ == "__main__":  # pragma: no cover
    main()
