"""What slime's and miles' own code refuses, skips or falls back on, kept as data (``upstream_rules.json``).

Each rule is written in our words and cites the upstream lines it stands on (file, line, end and an anchor: a hash
of those lines, so ``scripts/backend-rules`` finds them again in a fetched tree and moves the line numbers, or says
the code changed). The spec rules (api/byo_rules.py), the injected argv (``injected_argv``), eval before training
(``dumps/evals.py``) and verify's acceptance rules (``dumps/acceptance.py``) read their facts here.
Required flags are in the flag tables (``required``), written by ``scripts/backend-flags``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from forge_replay.frameworks.flags import flag_table, required_flags, sets_flag

RULE_IDS = (
    "eval-needs-datasets", "debug-skips-eval", "eval-before-train", "global-dataset", "upstream-debug-loader",
    "upstream-forge-loader", "reward-key-needs-dict", "rollout-shares-reward", "world-size", "steps-split-by-episode",
    "megatron-pin", "step-micro-batches-align", "trailing-episodes-dropped", "top-p-needs-token-ids",
    "rollout-log-probs", "debug-rollout-only", "ft-watches-rollout-only", "start-needs-checkpoint",
    "trim-to-global-batch", "indep-dp-one-step", "data-parallel-size", "default-global-batch-size",
)  # fmt: skip
"""Every rule forge-replay reads; a backend lacks the ones its code has no counterpart of (miles has no forge_load,
slime no shared-reward check)."""

MEGATRON = "megatron"
"""The third repository of the rules file: Megatron-LM, whose argument checks slime and miles both run (the batch
size and data-parallel rules). slime's image pins its commit (slime's rule megatron-pin); miles follows a branch of
its own fork at this revision (radixark/Megatron-LM, miles-main), so for miles the same lines are read at slime's
pin."""


@dataclass(frozen=True)
class UpstreamRule:
    """One rule of one backend: ``what`` it does, the facts forge-replay reads (``data``) and where it is."""

    backend: str
    rule_id: str
    what: str
    cites: tuple[dict[str, Any], ...]
    data: dict[str, Any]
    repository: str
    commit: str

    @property
    def where(self) -> str:
        """``file:line[-end], ... (repository@commit)``, for messages and docs."""
        spots = ", ".join(f"{c['file']}:{c['line']}" + (f"-{c['end']}" if "end" in c else "") for c in self.cites)
        return f"{spots} ({self.repository}@{self.commit[:8]})"

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


@lru_cache(maxsize=None)
def _rules() -> dict[str, Any]:
    return json.loads((Path(__file__).parent / "upstream_rules.json").read_text(encoding="utf-8"))


def upstream_rule(backend: str, rule_id: str) -> UpstreamRule | None:
    """The rule ``rule_id`` of ``backend`` (slime or miles, or ``MEGATRON``), or None when that code has no such
    rule."""
    if rule_id not in RULE_IDS:
        raise KeyError(f"no upstream rule {rule_id!r}; one of {', '.join(RULE_IDS)}")
    part = _rules().get(backend)
    row = part["rules"].get(rule_id) if part else None
    if row is None:
        return None
    data = {k: v for k, v in row.items() if k not in ("what", "cites")}
    return UpstreamRule(backend, rule_id, row["what"], tuple(row["cites"]), data, part["repository"], part["commit"])


def upstream_rules(backend: str) -> list[UpstreamRule]:
    """Every rule of ``backend``, in the file's order."""
    part = _rules().get(backend, {"rules": {}})
    return [rule for rule_id in part["rules"] if (rule := upstream_rule(backend, rule_id)) is not None]


def argv_problems(backend: str, argv: list[str]) -> list[str]:
    """What ``backend``'s own code would refuse in a whole argv (the team's args and forge-replay's injected flags):
    a required flag missing, ``--eval-interval`` without eval datasets, or a data source that would load prompt data
    the argv does not give. Empty when the argv meets every rule. Flags Megatron declares are not in the tables, so
    an unknown flag is not a problem here."""
    table = flag_table(backend)
    problems = [f"{flag} is required ({table.file}:{table.options[flag]['line']})"
                for flag in required_flags(backend) if not sets_flag(argv, flag)]
    evals = upstream_rule(backend, "eval-needs-datasets")
    if evals is not None and sets_flag(argv, "--eval-interval") and not any(sets_flag(argv, f) for f in evals["flags"]):
        problems.append(f"--eval-interval without {' or '.join(evals['flags'])} ({evals.where})")
    dataset = upstream_rule(backend, "global-dataset")
    if dataset is not None and dataset["needs_prompt_data"] and not (
            sets_flag(argv, dataset["data_flag"]) or sets_flag(argv, dataset["off_flag"])):
        problems.append(f"the global dataset loads {dataset['data_flag']}, which is not given: pass "
                        f"{dataset['off_flag']} ({dataset.where})")
    return problems
