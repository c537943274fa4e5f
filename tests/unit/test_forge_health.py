"""Health monitor timing and pause rules, with an in-process probe function (no engine needed)."""

from __future__ import annotations

import threading
import time

import pytest

from forge_replay.runtime.engines.health import HealthMonitor


class Probes:
    """Records probe calls; answers from ``verdict`` (None = healthy)."""

    def __init__(self):
        self.calls: list[tuple[float, str]] = []
        self.verdict: str | None = None
        self.lock = threading.Lock()

    def __call__(self, url: str, timeout: float) -> str | None:
        with self.lock:
            self.calls.append((time.monotonic(), url))
        return self.verdict


def wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_first_wait_delays_the_first_probe_on_start_and_on_every_resume():
    probes = Probes()
    monitor = HealthMonitor("g", lambda: [(0, "u0")], probes, lambda i, p: None,
                            interval_s=0.1, timeout_s=1, first_wait_s=0.6)
    started = time.monotonic()
    monitor.start()
    try:
        assert wait_for(lambda: probes.calls)
        assert probes.calls[0][0] - started >= 0.55
        monitor.pause()
        count = len(probes.calls)
        resumed = time.monotonic()
        monitor.resume()
        assert wait_for(lambda: len(probes.calls) > count)
        assert probes.calls[count][0] - resumed >= 0.55
    finally:
        monitor.stop()


def test_every_engine_of_the_group_is_probed_each_interval_and_a_failure_stops_only_that_one():
    probes = Probes()
    stopped: list[tuple[int, str]] = []
    alive = {0, 1}
    u1_bad = threading.Event()

    def probe(url: str, timeout: float) -> str | None:
        probes(url, timeout)
        return "503" if url == "u1" and u1_bad.is_set() else None

    monitor = HealthMonitor("g", lambda: [(i, f"u{i}") for i in sorted(alive)], probe,
                            lambda i, p: (stopped.append((i, p)), alive.discard(i)),
                            interval_s=0.05, timeout_s=1)
    monitor.start()
    try:
        assert wait_for(lambda: {u for _, u in probes.calls} == {"u0", "u1"})
        u1_bad.set()
        assert wait_for(lambda: stopped)
        after_stop = len(probes.calls)
        assert wait_for(lambda: len(probes.calls) > after_stop + 2)
        assert {u for _, u in probes.calls[after_stop + 1:]} == {"u0"}  # the stopped engine is left alone
        assert stopped == [(1, "503")] and monitor.counters.failures == 1
        assert monitor.counters.engines_stopped == [1]
    finally:
        monitor.stop()


def test_pause_returns_only_after_the_probe_in_flight():
    entered, release = threading.Event(), threading.Event()

    def slow_probe(url: str, timeout: float) -> str | None:
        entered.set()
        release.wait(5)
        return None

    monitor = HealthMonitor("g", lambda: [(0, "u0")], slow_probe, lambda i, p: None, interval_s=0.05, timeout_s=1)
    monitor.start()
    try:
        assert entered.wait(5)
        paused = threading.Event()
        threading.Thread(target=lambda: (monitor.pause(), paused.set()), daemon=True).start()
        assert not paused.wait(0.3)  # still probing: pause must wait
        release.set()
        assert paused.wait(5)
    finally:
        release.set()
        monitor.stop()


@pytest.mark.parametrize(("interval", "timeout", "first"), [(0, 1, 0), (1, 0, 0), (1, 1, -1)])
def test_bad_timing_is_refused_naming_the_spec_field(interval, timeout, first):
    with pytest.raises(ValueError, match="spec.faultTolerance.healthCheck"):
        HealthMonitor("g", list, lambda u, t: None, lambda i, p: None,
                      interval_s=interval, timeout_s=timeout, first_wait_s=first)
