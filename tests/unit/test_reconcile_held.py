"""The copy of each job the reconciler holds (child-event reconciles work from it instead of a GET)."""

from __future__ import annotations

from forge_replay.controller.reconcile import Reconciler
from forge_replay.controller.settings import OperatorSettings


def _body(rv: str, phase: str) -> dict:
    return {"metadata": {"namespace": "ml", "name": "j", "resourceVersion": rv}, "status": {"phase": phase}}


def test_a_late_watch_event_never_hides_a_status_just_written() -> None:
    reconciler = Reconciler(kube=None, settings=OperatorSettings())  # type: ignore[arg-type]
    reconciler.observe_job(_body("100", "Launching"))
    reconciler.observe_job(_body("120", "Suspended"))  # the answer to our own status patch
    reconciler.observe_job(_body("110", "Launching"))  # the watch event of an earlier change, delivered late
    assert reconciler._held_job("ml", "j")["status"]["phase"] == "Suspended"
    reconciler.observe_job(_body("130", "Running"))
    assert reconciler._held_job("ml", "j")["status"]["phase"] == "Running"
    reconciler.forget("ml", "j")
    assert reconciler._held_job("ml", "j") is None

