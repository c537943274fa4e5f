"""The PersistentVolumeClaims a job names, checked before anything is requested for it.

A missing claim, or one whose access mode cannot be mounted by every pod of the job (verify Job, Ray head,
workers on other nodes), would otherwise leave the Ray pods Pending with GPUs reserved. Pure functions:
``named_claims`` says what the job needs, ``claim_problems`` compares it with the claims as read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge_replay.api import ForgeReplayJob

READ_MODES = ("ReadOnlyMany", "ReadWriteMany")
WRITE_MODES = ("ReadWriteMany",)


@dataclass(frozen=True)
class NamedClaim:
    """One claim of the job: its name, the spec fields naming it, and whether the job writes to it."""

    name: str
    fields: tuple[str, ...]
    writes: bool

    @property
    def usable_modes(self) -> tuple[str, ...]:
        return WRITE_MODES if self.writes else READ_MODES


@dataclass(frozen=True)
class ClaimProblem:
    """Why a named claim cannot be used: ``reason`` is ClaimNotFound or ClaimAccessMode."""

    reason: str
    message: str


def named_claims(job: ForgeReplayJob) -> list[NamedClaim]:
    """Every PVC the job mounts (dumps, model, the expectations' baseline, results), one entry per claim name."""
    spec = job.spec
    wanted: list[tuple[str, str, bool]] = [(spec.replay.dumps.claim_name, "spec.replay.dumps.claimName", False)]
    if spec.model.path and spec.model.claim_name:
        wanted.append((spec.model.claim_name, "spec.model.claimName", False))
    baseline = spec.expect.baseline if spec.expect is not None else None
    if baseline is not None and baseline.claim_name and not baseline.config_map_name:
        wanted.append((baseline.claim_name, "spec.expect.baseline.claimName", False))
    if spec.results.claim_name:
        wanted.append((spec.results.claim_name, "spec.results.claimName", True))
    merged: dict[str, NamedClaim] = {}
    for name, field, writes in wanted:
        before = merged.get(name)
        fields = (before.fields if before else ()) + (field,)
        merged[name] = NamedClaim(name, fields, writes or bool(before and before.writes))
    return list(merged.values())


def claim_problems(namespace: str, claims: list[tuple[NamedClaim, dict[str, Any] | None]]) -> list[ClaimProblem]:
    """Problems of the claims as read (``None``: not found); empty when every claim can be mounted."""
    problems = []
    for claim, pvc in claims:
        named = f"PersistentVolumeClaim {namespace}/{claim.name} ({', '.join(claim.fields)})"
        modes = " or ".join(claim.usable_modes)
        if pvc is None:
            problems.append(ClaimProblem(
                "ClaimNotFound",
                f"{named} does not exist: create it with access mode {modes}; nothing is requested until it "
                "exists (checked again on every resync)",
            ))
            continue
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            problems.append(ClaimProblem("ClaimNotFound", f"{named} is being deleted: re-create it ({modes})"))
            continue
        status_modes = (pvc.get("status") or {}).get("accessModes")
        have = status_modes or (pvc.get("spec") or {}).get("accessModes") or []
        if not set(have) & set(claim.usable_modes):
            use = "the job writes to it" if claim.writes else "every pod of the job mounts it, on several nodes"
            problems.append(ClaimProblem(
                "ClaimAccessMode",
                f"{named} has access modes {', '.join(have) or 'none'}, but {use}: it needs {modes}. Use a "
                "claim of a storage class that offers it (access modes cannot be changed on an existing claim)",
            ))
    return problems
