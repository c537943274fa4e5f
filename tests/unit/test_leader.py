"""Leader election decisions (pure): who may take a Lease, and what taking it writes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from forge_replay.controller.leader import may_take, micro_time, taken

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def held_by(holder: str, renewed: datetime, duration: int = 15) -> dict:
    return {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": micro_time(renewed),
            "acquireTime": micro_time(renewed - timedelta(minutes=5)), "leaseTransitions": 2}


def test_a_free_or_own_lease_may_be_taken():
    assert may_take(None, "a", NOW)
    assert may_take({}, "a", NOW)
    assert may_take(held_by("a", NOW - timedelta(seconds=60)), "a", NOW)


def test_a_lease_renewed_within_its_duration_is_not_taken_over():
    assert not may_take(held_by("b", NOW - timedelta(seconds=14)), "a", NOW)
    assert may_take(held_by("b", NOW - timedelta(seconds=16)), "a", NOW)


def test_taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time():
    before = held_by("b", NOW - timedelta(seconds=30))
    took = taken(before, "a", NOW, 15)
    assert took["holderIdentity"] == "a" and took["leaseTransitions"] == 3
    assert took["acquireTime"] == took["renewTime"] == micro_time(NOW)
    later = NOW + timedelta(seconds=5)
    renewed = taken(took, "a", later, 15)
    assert renewed["acquireTime"] == micro_time(NOW) and renewed["renewTime"] == micro_time(later)
    assert renewed["leaseTransitions"] == 3
    assert taken(None, "a", NOW, 15)["leaseTransitions"] == 0
