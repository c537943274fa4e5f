"""`forge-replay render FILE`: print the Kubernetes objects the operator would create for a ForgeReplayJob.

No torch, ray or kopf import at module level: `forge-replay render` stays fast.
"""

from __future__ import annotations

import sys
from typing import Any

import click
import yaml

from forge_replay.controller.settings import DEFAULT_RUNTIME_IMAGE, OperatorSettings


class _LiteralDumper(yaml.SafeDumper):
    """YAML with multi-line strings as literal blocks (config.yaml stays readable in a diff)."""


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str)


def objects_yaml(objects: list[dict[str, Any]]) -> str:
    """Objects as multi-document YAML, in creation order."""
    return yaml.dump_all(objects, Dumper=_LiteralDumper, sort_keys=False, explicit_start=True)


@click.command()
@click.argument("file", metavar="FILE")
@click.option("--runtime-image", default=DEFAULT_RUNTIME_IMAGE, show_default=True,
              help="The operator's default runtime image (used when spec.image is empty).")
@click.option("--namespace", "-n", default=None, help="Namespace for jobs whose metadata has none.")
def render(file: str, runtime_image: str, namespace: str | None) -> None:
    """Print the objects the operator creates for the ForgeReplayJob(s) in FILE, as multi-document YAML.

    For GitOps review and diffs. Owner references appear only for objects read back from a cluster
    (they need the job's uid). Invalid specs print `FILE: field.path: message` and exit 1.
    """
    from forge_replay.api import SpecInvalid
    from forge_replay.api.parse import DocumentError, NotAForgeReplayJob, load_documents, parse_job
    from forge_replay.controller.render import render as render_objects

    settings = OperatorSettings(runtime_image=runtime_image)
    try:
        docs = load_documents(file)
    except DocumentError as exc:
        click.echo(f"{file}: {exc}", err=True)
        sys.exit(2)
    if not docs:
        click.echo(f"{file}: holds no YAML document (expected a ForgeReplayJob)", err=True)
        sys.exit(2)
    objects: list[dict[str, Any]] = []
    failed = 0
    for index, doc in enumerate(docs):
        where = file if len(docs) == 1 else f"{file}[{index}]"
        try:
            job = parse_job(doc)
        except NotAForgeReplayJob as exc:
            click.echo(f"{where}: {exc}", err=True)
            failed = max(failed, 2)
            continue
        except SpecInvalid as exc:
            for problem in exc.problems:
                click.echo(f"{where}: {problem}", err=True)
            failed = max(failed, 1)
            continue
        if namespace and not job.metadata.namespace:
            job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})})
        if not job.metadata.name:
            click.echo(f"{where}: metadata.name: required to render (generateName cannot name the RayJob)", err=True)
            failed = max(failed, 1)
            continue
        objects += render_objects(job, settings)
    if failed:
        sys.exit(failed)
    sys.stdout.write(objects_yaml(objects))
