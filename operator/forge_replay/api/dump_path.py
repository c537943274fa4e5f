"""Dump path rules (slime's forge_load semantics): the single source of truth for templates.

A dump path is either literal (the same file for every rollout) or a template whose only
placeholder is ``{rollout_id}``. Training rollout N reads ``template.format(rollout_id=str(N))``;
eval N reads ``template.format(rollout_id="eval_" + str(N))``.
"""

from __future__ import annotations

import string
from pathlib import PurePosixPath

PLACEHOLDER = "rollout_id"
MAX_COMPONENT_BYTES = 255  # NAME_MAX of Linux file systems
_LONGEST_ID = "eval_9999999"  # rollout and eval ids stay under 10^7 (ReplaySpec's bounds)


def path_problem(path: str) -> str | None:
    """Return why ``path`` is not an acceptable dump path, or None when it is."""
    if not path:
        return "must not be empty"
    if "\x00" in path:
        return "must not contain a NUL character"
    if path.startswith("/"):
        return f"must be relative to the PVC root, not absolute ({path!r})"
    if ".." in PurePosixPath(path).parts:
        return f"must not contain a '..' segment ({path!r})"
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(path) if f is not None]
        specs = [(spec, conv) for _, f, spec, conv in string.Formatter().parse(path) if f is not None]
    except ValueError as exc:
        return f"is not a valid template ({exc}); use {{{PLACEHOLDER}}} and double any other braces"
    bad = sorted({f for f in fields if f != PLACEHOLDER})
    if bad:
        shown = ", ".join("{" + f + "}" for f in bad)
        return f"only the placeholder {{{PLACEHOLDER}}} is allowed, found {shown}"
    if any(spec or conv for spec, conv in specs):
        return f"{{{PLACEHOLDER}}} takes no format spec or conversion"
    for part in path.replace("{" + PLACEHOLDER + "}", _LONGEST_ID).split("/"):
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return (f"has a path component of {len(part.encode('utf-8'))} bytes ({part[:40]!r}...) with the longest "
                    f"rollout id; file systems allow at most {MAX_COMPONENT_BYTES}")
    return None


def is_template(path: str) -> bool:
    """True when ``path`` contains the ``{rollout_id}`` placeholder (one file per rollout)."""
    return any(f == PLACEHOLDER for _, f, _, _ in string.Formatter().parse(path))


def train_path(path: str, rollout_id: int) -> str:
    """Path of training rollout ``rollout_id``: a literal path is reused for every rollout."""
    return path.format(rollout_id=str(rollout_id)) if is_template(path) else path


def eval_path(path: str, eval_id: int) -> str | None:
    """Path of eval ``eval_id`` (``eval_N``), or None for a literal path (literal paths have no eval dumps)."""
    return path.format(rollout_id=f"eval_{eval_id}") if is_template(path) else None
