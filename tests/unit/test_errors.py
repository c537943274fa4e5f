"""Our errors survive pickling (Ray ships an actor's error to the caller pickled) and reach the user as one line."""

from __future__ import annotations

import pickle

import pytest

from forge_replay.api.models import Problem, SpecInvalid
from forge_replay.api.parse import DocumentInvalid
from forge_replay.replay import ReplayError

ERRORS = [
    ReplayError(4, "/d/rollout_4.pt", "rollout 4: dump /d/rollout_4.pt does not exist"),
    SpecInvalid([Problem("spec.replay.numRollouts", "must be >= 1"), Problem("spec.model", "required")]),
    DocumentInvalid([Problem("spec", "duplicate key 'spec' at line 9 (first at line 3)")]),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_pickle_keeps_type_message_and_attributes(error):
    # ReplayError(rollout_id, path, message) came back as ReplayError(message): a TypeError, and Ray printed
    # "Failed to deserialize exception" with a traceback instead of the message.
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
    assert vars(copy) == vars(error)


def test_an_actor_error_is_its_one_line():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    from forge_replay.runtime.driver import actor_error_line

    error = ERRORS[0]
    wrapped = ray_exceptions.RayTaskError("RolloutManager.get_rollout", "Traceback ...", error)
    assert actor_error_line(wrapped) == "ReplayError: rollout 4: dump /d/rollout_4.pt does not exist"


def test_an_error_pickle_cannot_rebuild_is_still_one_line():
    # An error class without Portable (or a third party's) arrives as Ray's UnserializableException carrying the
    # traceback text; the user gets its last exception line, not the traceback.
    ray_exceptions = pytest.importorskip("ray.exceptions")
    from forge_replay.runtime.driver import actor_error_line

    trace = (
        "ray.exceptions.RayTaskError: ray::RolloutManager.get_rollout() (pid=17053, ip=192.0.2.2)\n"
        '  File "/work/operator/forge_replay/replay.py", line 152, in load_train\n'
        "    raise ReplayError(\n"
        "forge_replay.dumps.safe_pickle.DumpError: /d/rollout_4.pt: not a torch.save file (truncated zip)\n"
    )
    line = actor_error_line(ray_exceptions.UnserializableException(trace))
    assert line == "DumpError: /d/rollout_4.pt: not a torch.save file (truncated zip)"
