"""Our errors survive pickling (Ray ships an actor's error to the caller pickled) and reach the user as one line."""

from __future__ import annotations

import pickle

import pytest

from forge_replay.api import Problem, SpecInvalid
from forge_replay.api.parse import DocumentInvalid
from forge_replay.dumps.bounds import BoundsError
from forge_replay.dumps.safe_pickle import DumpError, RefusedGlobal
from forge_replay.dumps.sample import SampleError
from forge_replay.errors import Portable
from forge_replay.replay import ReplayError
from forge_replay.runtime.engines.http import EngineHTTPError
from forge_replay.runtime.weights.sync import PushFailed

ERRORS = [
    ReplayError(4, "/d/rollout_4.pt", "rollout 4: dump /d/rollout_4.pt does not exist"),
    SpecInvalid([Problem("spec.replay.numRollouts", "must be >= 1"), Problem("spec.model", "required")]),
    DocumentInvalid([Problem("spec", "duplicate key 'spec' at line 9 (first at line 3)")]),
    DumpError("/d/rollout_4.pt", "not a torch.save file (truncated zip)", "written while the run was killed?"),
    RefusedGlobal("os", "system"),
    SampleError(7, "loss_mask", "has 3 entries for a 5-token response", where="/d/rollout_4.pt"),
    BoundsError("values nested 300 deep, more than max_depth 100", "max_depth"),
    EngineHTTPError("engine 1 (http://127.0.0.1:30001): POST /update_weights_from_disk answered 400: bad", 400),
    PushFailed("weight push after step 3: engine 1 refused it", stuck=[]),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_pickle_keeps_type_message_and_attributes(error):
    # ReplayError(rollout_id, path, message) came back as ReplayError(message): a TypeError, and Ray printed
    # "Failed to deserialize exception" with a traceback instead of the message.
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
    assert vars(copy) == vars(error)


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_ray_ships_each_error_to_the_driver_as_its_one_line(error):
    # What Ray does with an error raised in an actor: wrap it in a RayTaskError (a subclass of the error's own type),
    # serialize that (RayError.to_bytes) and rebuild it in the driver (from_bytes), which answered "Failed to
    # deserialize exception" with a traceback for DumpError, SampleError, RefusedGlobal and PushFailed.
    ray_exceptions = pytest.importorskip("ray.exceptions")
    from forge_replay.runtime.driver import actor_error_line

    wrapped = ray_exceptions.RayTaskError("RolloutManager.get_rollout", "Traceback ...", error, proctitle="ray::x",
                                          pid=1, ip="127.0.0.1").as_instanceof_cause()
    received = ray_exceptions.RayError.from_bytes(wrapped.to_bytes())
    assert not isinstance(received, ray_exceptions.UnserializableException), str(received)[:300]
    assert type(received.cause) is type(error) and vars(received.cause) == vars(error)
    assert actor_error_line(received) == f"{type(error).__name__}: {error}"


def test_every_error_with_its_own_arguments_is_portable():
    # A new error type whose __init__ takes other arguments than its message would bring Ray's "Failed to
    # deserialize exception" back; the controller's KubeError and the YAML loader's _Refused never cross Ray.
    import importlib
    import pkgutil

    import forge_replay

    for module in pkgutil.walk_packages(forge_replay.__path__, "forge_replay."):
        if not module.name.startswith("forge_replay.controller"):
            importlib.import_module(module.name)
    found, pending = [], [BaseException]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if cls.__module__.startswith("forge_replay.") and "__init__" in vars(cls) and cls.__name__ != "_Refused":
            found.append(cls)
    assert {ReplayError, DumpError, SampleError, PushFailed} <= set(found)
    assert [cls.__qualname__ for cls in found if not issubclass(cls, Portable)] == []


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
