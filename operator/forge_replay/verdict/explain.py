"""What differs between a run and its references (issue 35): the explanation a band's miss carries, from report.json's
``environment`` (versions, image digests, GPU product, engine arguments, memory-only trainer settings). Generic over
the environment dict: whatever a later version records is compared the same way."""

from __future__ import annotations

MAX_CHANGES = 6
"""How many changed settings one message names (then how many more)."""
DIGESTS = "image_digests"
"""The environment's image digests by role (``forge_replay.api.images``): named "<role> image", each digest cut to
its first DIGEST_CHARS hex digits, and compared only where both the run and a reference recorded one (a local run,
or one whose digests the operator had not recorded in time, says nothing about its image)."""
DIGEST_CHARS = 12


def flatten(env: dict, prefix: str = "") -> dict[str, object]:
    """``env`` as dotted keys (``trainer.gradient_checkpointing``); lists kept as values."""
    out: dict[str, object] = {}
    for key, value in (env or {}).items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _show(value: object, key: str = "") -> str:
    if value is None:
        return "(not recorded)"
    if key.startswith(DIGESTS + "."):
        return " ".join(short_digest(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def short_digest(digest: object) -> str:
    """``sha256:0123456789abcdef...`` as ``sha256:0123456789ab..`` (DIGEST_CHARS hex digits)."""
    algorithm, _, hexdigits = str(digest).rpartition(":")
    if len(hexdigits) <= DIGEST_CHARS:
        return str(digest)
    return f"{algorithm}:{hexdigits[:DIGEST_CHARS]}.." if algorithm else f"{hexdigits[:DIGEST_CHARS]}.."


def _label(key: str) -> str:
    """How a message names a setting: its dotted key, an image digest as "<role> image"."""
    return key[len(DIGESTS) + 1:] + " image" if key.startswith(DIGESTS + ".") else key


def what_changed(run_env: dict, reference_envs: list[dict]) -> str:
    """The settings of ``run_env`` that none of ``reference_envs`` had (``sglang 0.5.22 -> 0.5.23``; references
    that disagree among themselves are listed ``{a, b} -> c``), separated by "; "; "" when the run has no environment
    or none differs. References without an environment are ignored."""
    mine = flatten(run_env or {})
    refs = [flatten(e) for e in reference_envs if e]
    if not mine or not refs:
        return ""
    changes = []
    for key in sorted(set(mine).union(*refs)):
        value = mine.get(key)
        seen = []
        for ref in refs:
            if ref.get(key) not in seen:
                seen.append(ref.get(key))
        if key.startswith(DIGESTS + "."):  # unrecorded is not a change of image
            seen = [v for v in seen if v is not None]
            if value is None or not seen:
                continue
        if value in seen:
            continue
        before = _show(seen[0], key) if len(seen) == 1 else "{" + ", ".join(_show(v, key) for v in seen) + "}"
        changes.append(f"{_label(key)} {before} -> {_show(value, key)}")
    if len(changes) > MAX_CHANGES:
        changes = changes[:MAX_CHANGES] + [f"and {len(changes) - MAX_CHANGES} more setting(s)"]
    return "; ".join(changes)
