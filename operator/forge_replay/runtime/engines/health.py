"""Health monitors for engine groups (rollout fault tolerance only).

One monitor thread per engine group probes every live engine's ``/health_generate`` each
``intervalSeconds`` with ``timeoutSeconds``, after ``firstWaitSeconds`` on start and on every
resume. The interval holds across pauses: a resume never brings the next probe forward, so short
steps (a pause and resumes around each) do not multiply the probes. An engine that fails a probe
is stopped (its process group killed), so the recovery before the next weight sync restarts it.
Monitors are paused around offload and weight sync and resumed when generation (here: replay) or
eval starts. They exist only when the rollout-side plan says so
(:func:`forge_replay.runtime.gating.plan_rollout_side`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class HealthCounters:
    """What a monitor did; the report and the tests read these."""

    probes: int = 0
    failures: int = 0
    engines_stopped: list[int] = field(default_factory=list)


class HealthMonitor:
    """A thread probing one engine group; ``targets()`` gives (engine index, url) of live engines."""

    def __init__(
        self,
        group: str,
        targets: Callable[[], Sequence[tuple[int, str]]],
        probe: Callable[[str, float], str | None],
        stop_engine: Callable[[int, str], None],
        *,
        interval_s: float,
        timeout_s: float,
        first_wait_s: float = 0.0,
    ):
        if interval_s <= 0 or timeout_s <= 0 or first_wait_s < 0:
            raise ValueError(
                f"health check of group {group}: interval {interval_s} s and timeout {timeout_s} s must be "
                f"positive and first wait {first_wait_s} s not negative (spec.faultTolerance.healthCheck)"
            )
        self.group = group
        self._targets = targets
        self._probe = probe
        self._stop_engine = stop_engine
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.first_wait_s = first_wait_s
        self.counters = HealthCounters()
        self._lock = threading.Lock()
        self._probing = threading.Lock()  # held across one probe, so pause() can wait it out
        self._wake = threading.Condition(self._lock)
        self._paused = True
        self._resumed_at_generation = 0  # bumps on every resume: a pause mid-sweep drops that sweep
        self._last_sweep_at: float | None = None  # monotonic start of the last sweep that probed
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"health-monitor-{group}", daemon=True)

    def start(self) -> None:
        """Start the thread and resume probing (after the first wait)."""
        self._thread.start()
        self.resume()

    def pause(self) -> None:
        """Stop probing until :meth:`resume` (offload, weight sync); returns once no probe (or the stop
        of a failed engine) is under way."""
        with self._lock:
            self._paused = True
            self._wake.notify_all()
        with self._probing:
            pass

    def resume(self) -> None:
        """Probe again, after the first wait and no sooner than an interval after the last sweep.
        A no-op while already probing (it keeps the schedule: no extra probe)."""
        with self._lock:
            if not self._paused:
                return
            self._paused = False
            self._resumed_at_generation += 1
            self._wake.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s + 5)

    def _wait(self, seconds: float, generation: int) -> bool:
        """Sleep ``seconds`` unless paused/stopped/resumed meanwhile; True if probing may go on."""
        with self._lock:
            self._wake.wait_for(
                lambda: self._stopping or self._paused or self._resumed_at_generation != generation,
                timeout=seconds,
            )
            return not (self._stopping or self._paused or self._resumed_at_generation != generation)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._stopping or not self._paused)
                if self._stopping:
                    return
                generation = self._resumed_at_generation
            wait = self.first_wait_s
            if self._last_sweep_at is not None:
                wait = max(wait, self._last_sweep_at + self.interval_s - time.monotonic())
            if wait > 0 and not self._wait(wait, generation):
                continue
            while self._sweep(generation) and self._wait(self.interval_s, generation):
                pass

    def _sweep(self, generation: int) -> bool:
        started = time.monotonic()
        for index, url in list(self._targets()):
            # Probe and stop under one lock: pause() returns only once no probe or stop is under way,
            # so a weight sync never races a monitor killing an engine it is about to push to.
            with self._probing:
                with self._lock:
                    if self._stopping or self._paused or self._resumed_at_generation != generation:
                        return False
                    self.counters.probes += 1
                    self._last_sweep_at = started
                problem = self._probe(url, self.timeout_s)
                if problem is None:
                    continue
                with self._lock:
                    if self._paused or self._stopping:
                        return False  # paused meanwhile (e.g. memory released): not a health failure
                log.error(
                    "health monitor %s: engine %d at %s failed its health check (%s); stopping it",
                    self.group, index, url, problem,
                )
                self._stop_engine(index, problem)
                with self._lock:  # counted once stopped: a reader of the counters never sees it still running
                    self.counters.failures += 1
                    self.counters.engines_stopped.append(index)
        return True
