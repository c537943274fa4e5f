"""`forge-replay validate` and `forge-replay crd`: check ForgeReplayJob YAML files against the API rules; print the
CRD generated from the API models."""

from __future__ import annotations

import sys

import click

from forge_replay.api import SpecInvalid
from forge_replay.api.job_notes import job_notes
from forge_replay.api.parse import (
    DocumentError,
    DocumentInvalid,
    NotAForgeReplayJob,
    load_documents,
    other_kind,
    parse_job,
)

EXIT_OK, EXIT_INVALID, EXIT_UNUSABLE = 0, 1, 2


def validate_files(files: list[str], out=None) -> int:
    """Validate every document of every file; print `FILE: field.path: message` per problem.

    Returns 0 when all are valid, 1 when any ForgeReplayJob is invalid (or its YAML is one the API server
    refuses: duplicate keys, an alias bomb, runaway nesting), 2 when a file cannot be read, is not YAML,
    or holds no ForgeReplayJob (2 wins over 1). Other kinds next to a ForgeReplayJob (a GitOps folder,
    `render | validate -`) are skipped with a note.
    """
    from forge_replay.dumps.model_limits import inline_position_problems

    out = out or sys.stdout
    worst = EXIT_OK
    for name in files:
        try:
            docs = load_documents(name)
        except DocumentInvalid as exc:  # YAML the API server refuses: a field problem, like an invalid spec
            for problem in exc.problems:
                print(f"{name}: {problem}", file=out)
            worst = max(worst, EXIT_INVALID)
            continue
        except DocumentError as exc:
            print(f"{name}: {exc}", file=out)
            worst = EXIT_UNUSABLE
            continue
        if not docs:
            print(f"{name}: holds no YAML document (expected a ForgeReplayJob)", file=out)
            worst = EXIT_UNUSABLE
            continue
        has_job = any(other_kind(doc) is None for doc in docs)
        for index, doc in enumerate(docs):
            where = name if len(docs) == 1 else f"{name}[{index}]"
            if has_job and other_kind(doc) is not None:
                print(f"{where}: skipped (kind {other_kind(doc)}, not a ForgeReplayJob)", file=out)
                continue
            try:
                job = parse_job(doc)
            except NotAForgeReplayJob as exc:
                print(f"{where}: {exc}", file=out)
                worst = EXIT_UNUSABLE
            except SpecInvalid as exc:
                for problem in exc.problems:
                    print(f"{where}: {problem}", file=out)
                worst = max(worst, EXIT_INVALID)
            else:
                problems = inline_position_problems(job.spec)
                for problem in problems:
                    print(f"{where}: {problem}", file=out)
                if problems:
                    worst = max(worst, EXIT_INVALID)
                    continue
                print(f"{where}: ok ({job.metadata.name or job.metadata.generate_name}, {job.spec.replay.mode} mode)",
                      file=out)
                for note in job_notes(job.spec):
                    print(f"{where}: note: {note}", file=out)
    return worst


@click.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
def validate(files: tuple[str, ...]) -> None:
    """Check ForgeReplayJob YAML files (multi-document; `-` reads stdin) against the API rules.

    Prints every problem, one line each, as `FILE: field.path: message`; other kinds next to a ForgeReplayJob
    are skipped with a note. Exit status: 0 all valid, 1 a ForgeReplayJob is invalid, 2 a file cannot be read,
    is not YAML, or holds no ForgeReplayJob.
    """
    sys.exit(validate_files(list(files)))


@click.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file instead of stdout.")
def crd(output: str | None) -> None:
    """Print the ForgeReplayJob CustomResourceDefinition generated from the API models.

    Apply it server-side (it carries CEL rules): `forge-replay crd | kubectl apply --server-side -f -`.
    """
    from forge_replay.api.crd import crd_yaml

    text = crd_yaml()
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
