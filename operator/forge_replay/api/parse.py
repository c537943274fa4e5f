"""Turn YAML documents into validated ForgeReplayJobs, or into Problems that name the field."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from forge_replay.api.models import API_VERSION, KIND, ForgeReplayJob, Problem, SpecInvalid


class NotAForgeReplayJob(ValueError):
    """The document is not a ForgeReplayJob at all (wrong kind/apiVersion, or not a mapping)."""


class DocumentError(ValueError):
    """A file cannot be read or is not YAML."""


def load_documents(path: str | Path) -> list[Any]:
    """Read every YAML document of ``path`` (``-`` is stdin), skipping empty ones."""
    import sys

    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {' '.join(str(exc).split())}") from exc


def check_kind(doc: Any) -> None:
    """Raise NotAForgeReplayJob unless ``doc`` declares this API's kind and apiVersion."""
    if not isinstance(doc, dict):
        raise NotAForgeReplayJob(f"a document is a {type(doc).__name__}, not a ForgeReplayJob mapping")
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if kind != KIND or api_version != API_VERSION:
        raise NotAForgeReplayJob(
            f"kind {kind!r} apiVersion {api_version!r} is not a ForgeReplayJob "
            f"(expected kind: {KIND}, apiVersion: {API_VERSION})"
        )


def parse_job(doc: Any) -> ForgeReplayJob:
    """Validate one document as a ForgeReplayJob.

    Raises NotAForgeReplayJob for other kinds and SpecInvalid (with field-path Problems) for
    ForgeReplayJobs that break the API rules; never any other exception for any input.
    """
    check_kind(doc)
    try:
        return ForgeReplayJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecInvalid(problems_from(exc, ForgeReplayJob)) from None
    except SpecInvalid:
        raise
    except (TypeError, ValueError, RecursionError) as exc:  # defensive: odd YAML values
        raise SpecInvalid([Problem("", f"cannot be validated: {exc}")]) from None


def problems_from(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> list[Problem]:
    """Translate a pydantic ValidationError into Problems with camelCase dotted paths."""
    problems: list[Problem] = []
    for err in exc.errors():
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, SpecInvalid):
            base = _dotted(err["loc"], prefix)
            for p in inner.problems:
                # Cross-field rules report full paths already when raised at the spec or job level.
                problems.append(p if p.path.startswith(("spec", "metadata")) or not base else Problem(
                    f"{base}.{p.path}" if p.path else base, p.message))
            continue
        problems.append(Problem(_dotted(err["loc"], prefix), _message(err, root)))
    return problems


def _dotted(loc: tuple[Any, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _message(err: dict[str, Any], root: type[BaseModel]) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        allowed = _allowed_fields(root, err["loc"][:-1])
        name = str(err["loc"][-1])
        hint = difflib.get_close_matches(name, allowed, n=1)
        text = "unknown field"
        if hint:
            text += f"; did you mean {hint[0]!r}?"
        if allowed:
            text += f" (allowed: {', '.join(allowed)})"
        return text
    if kind == "value_error":  # our own validators already name the offending value
        return _lower_first(msg.removeprefix("Value error, "))
    if "input" not in err or isinstance(err["input"], (dict, list)):
        return _lower_first(msg)
    shown = repr(err["input"])
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{_lower_first(msg)} (got {shown})"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _allowed_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """camelCase field names of the model reached by following ``loc`` from ``root``."""
    import typing

    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = next(
            (f for name, f in model.model_fields.items() if (f.alias or name) == part or name == part), None
        )
        if field is None:
            return []
        model = _unwrap(field.annotation, typing)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or name for name, f in model.model_fields.items()]
    return []


def _unwrap(annotation: Any, typing: Any) -> Any:
    """The model class inside Optional[...] / list[...] annotations."""
    while True:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        origin = typing.get_origin(annotation)
        if origin is None or not args:
            return annotation
        annotation = args[-1] if origin is dict else args[0]
