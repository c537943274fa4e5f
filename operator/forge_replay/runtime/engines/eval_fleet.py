"""The eval fleet: the engines used for eval, checked before each eval.

When rollout fault tolerance is on, the health monitor watches these engines and is resumed for
eval. When it is off (no FT, or train-only FT), no monitor runs, so the eval fleet probes its
engines itself before use (``plan.eval_fleet_self_probe``) and fails with the engine's address if
one is not healthy, instead of scoring an eval against a dead engine. The probe is one
``/health_generate`` per engine, nothing else: train-only FT leaves the engines otherwise untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from forge_replay.runtime.engines.process import probe_health

log = logging.getLogger(__name__)


class EvalFleetUnhealthy(RuntimeError):
    """An eval engine failed its self-probe."""


@dataclass
class EvalFleet:
    """Engines used for eval; ``targets()`` gives (engine index, url) of the engines to use."""

    targets: Callable[[], Sequence[tuple[int, str]]]
    self_probe: bool
    timeout_s: float
    probe: Callable[[str, float], str | None] = probe_health
    self_probes: int = 0

    def before_use(self, eval_id: int) -> None:
        """Probe every eval engine when no monitor watches them; EvalFleetUnhealthy if one fails."""
        if not self.self_probe:
            return
        problems = []
        for index, url in self.targets():
            self.self_probes += 1
            problem = self.probe(url, self.timeout_s)
            if problem is not None:
                problems.append(f"engine {index} at {url}: {problem}")
        if problems:
            raise EvalFleetUnhealthy(
                f"eval {eval_id}: the eval fleet's self-probe found unhealthy engines "
                f"(no health monitor runs without rollout fault tolerance, so none is restarted): "
                + "; ".join(problems)
            )
        log.info("eval %d: eval fleet self-probe: all engines healthy", eval_id)
