"""Fault injection into engines, for CI and tests of rollout fault tolerance.

Faults are read from ``$FORGE_REPLAY_INJECT_FAULTS``: ``;``-separated entries like
``kill-engine:step=1,engine=0`` (after training step 1's weight sync, SIGKILL engine 0's process
group, so it dies while the next rollout is replayed). The injector exists only when the
rollout-side plan allows it (rollout fault tolerance); otherwise a set variable is reported as
ignored, never silently honoured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

FAULTS_ENV = "FORGE_REPLAY_INJECT_FAULTS"
FAULT_KINDS = ("kill-engine",)


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` hits ``engine`` right after the weight sync of training ``step``."""

    kind: str
    step: int
    engine: int


def parse_faults(text: str) -> list[Fault]:
    """Parse the fault list; ValueError naming the entry and what is wrong with it."""
    faults = []
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        kind, _, params = entry.partition(":")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{FAULTS_ENV}: fault {entry!r}: unknown kind {kind!r} (known: {', '.join(FAULT_KINDS)})")
        values: dict[str, int] = {}
        for item in filter(None, params.split(",")):
            key, _, value = item.partition("=")
            if key not in ("step", "engine") or not value.isdigit():
                raise ValueError(f"{FAULTS_ENV}: fault {entry!r}: expected step=N,engine=N, got {item!r}")
            values[key] = int(value)
        if set(values) != {"step", "engine"}:
            raise ValueError(f"{FAULTS_ENV}: fault {entry!r}: needs both step=N and engine=N")
        faults.append(Fault(kind, values["step"], values["engine"]))
    return faults


class FaultInjector:
    """Hands out the faults due after each training step, each once."""

    def __init__(self, faults: list[Fault], num_engines: int):
        for fault in faults:
            if not 0 <= fault.engine < num_engines:
                raise ValueError(f"{FAULTS_ENV}: {fault} targets engine {fault.engine}, but there are {num_engines}")
        self.pending = list(faults)
        self.injected: list[Fault] = []

    @classmethod
    def from_env(cls, num_engines: int, environ: Mapping[str, str] | None = None) -> FaultInjector:
        text = (os.environ if environ is None else environ).get(FAULTS_ENV, "")
        return cls(parse_faults(text), num_engines)

    def due(self, step: int) -> list[Fault]:
        """Faults to inject after ``step``; marked injected."""
        now = [fault for fault in self.pending if fault.step == step]
        self.pending = [fault for fault in self.pending if fault.step != step]
        self.injected.extend(now)
        return now
