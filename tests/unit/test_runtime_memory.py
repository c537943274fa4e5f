"""Per-step memory peaks on CPU: each step reports its own peak, not the process's lifetime peak."""

from __future__ import annotations

from forge_replay.runtime.trainer.memory import MemoryProbe


def test_each_step_reports_its_own_peak_rss():
    probe = MemoryProbe(rank=0, device="cpu")
    probe.reset()
    block = bytearray(256 * 1024**2)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    big = probe.read()
    del block
    probe.reset()
    small = probe.read()
    assert big.device == "cpu" and big.peak_allocated_gib is None
    assert big.peak_rss_gib >= 0.25
    if big.rss_reset:  # Linux with /proc/self/clear_refs: the second step no longer sees the first's peak
        assert small.peak_rss_gib < big.peak_rss_gib - 0.2
    assert big.headline_gib == big.peak_rss_gib
    import socket

    assert big.host == socket.gethostname()  # which pod, where a trainer spans pods
