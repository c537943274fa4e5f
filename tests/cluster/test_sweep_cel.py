"""spec.sweep's CEL twins (issue 32): `forge-replay validate` and the real API server refuse the same sweeps naming
the same field, and accept the same ones. What CEL cannot check (a geometric axis's length, every point's whole
spec) is validate's and the operator's alone: tests/unit/test_sweep_api.py."""

from __future__ import annotations

import pytest

from tests.cluster.test_control_plane import _set, minimal_job, project_crd  # noqa: F401
from tests.cluster.test_spec_bounds import create, validate

pytestmark = pytest.mark.cluster

MBT = "trainer.microBatchTokens"
MEM = "rollout.engineArgs.mem-fraction-static"
SLIME = {"backend": "slime", "nodes": 1, "gpusPerNode": 8, "image": "registry.example.com/team/slime:v1",
         "workingDir": "/root/slime", "args": ["--rollout-batch-size", "32"]}


def swept(*axes, **settings) -> dict:
    return _set(minimal_job("sweep"), "spec.sweep", {"axes": list(axes), **settings})


def debug(document: dict) -> dict:
    document["spec"]["replay"]["mode"] = "debug"
    del document["spec"]["rollout"]
    return document


REFUSED = [
    ("slime", _set(swept({"field": MBT, "values": [1024]}), "spec.trainer", SLIME), "spec.sweep"),
    ("cpu without budget", _set(swept({"field": MBT, "values": [1024]}), "spec.trainer.gpusPerNode", 0),
     "spec.sweep.budgetGiB"),
    ("both forms", swept({"field": MBT, "values": [1024], "min": 1, "max": 2, "factor": 2}), "spec.sweep.axes"),
    ("half a geometric axis", swept({"field": MBT, "min": 1024, "max": 4096}), "spec.sweep.axes"),
    ("max below min", swept({"field": MBT, "min": 4096, "max": 1024, "factor": 2}), "spec.sweep.axes"),
    ("decreasing", swept({"field": MBT, "values": [2048, 1024]}), "spec.sweep.axes"),
    ("repeated value", swept({"field": MBT, "values": [1024, 1024]}), "spec.sweep.axes"),
    ("a field twice", swept({"field": MBT, "values": [1]}, {"field": MBT, "values": [2]}), "spec.sweep.axes"),
    ("unknown field", swept({"field": "trainer.nodes", "values": [1, 2]}), "spec.sweep.axes[0].field"),
    ("too many points", swept({"field": MEM, "values": [0.5, 0.6, 0.7]}, {"field": MBT, "values": [1, 2, 3]},
                              maxPoints=8), "spec.sweep.maxPoints"),
    ("one rollout per point", swept({"field": MBT, "values": [1024]}, rolloutsPerPoint=1),
     "spec.sweep.rolloutsPerPoint"),
    ("engine axis in debug mode", debug(swept({"field": MEM, "values": [0.5]})), "spec.sweep.axes"),
    ("frontier without sweep", _set(minimal_job("sweep"), "spec.expect", {"frontier": [{"fits": {MBT: 1024}}]}),
     "spec.expect.frontier"),
    ("frontier on another axis", _set(swept({"field": MEM, "values": [0.5]}, {"field": MBT, "values": [1024]}),
                                      "spec.expect", {"frontier": [{"at": {MBT: 1024}, "fits": {MEM: 0.5}}]}),
     "spec.expect.frontier"),
]
ACCEPTED = [
    ("two axes and a frontier", _set(swept({"field": MEM, "values": [0.5, 0.7]},
                                           {"field": MBT, "min": 1024, "max": 65536, "factor": 2}),
                                     "spec.expect", {"frontier": [{"at": {MEM: 0.7}, "fits": {MBT: 8192}}]})),
    ("exactly maxPoints", swept({"field": MEM, "values": [0.5, 0.6, 0.7]}, {"field": MBT, "values": [1, 2, 3]},
                                maxPoints=9)),
    ("cpu with a budget", _set(swept({"field": MBT, "values": [1024, 2048]}, budgetGiB=4, search="grid"),
                               "spec.trainer.gpusPerNode", 0)),
]


@pytest.mark.parametrize("case, document, field", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_by_validate_and_the_api_server(control_plane, project_crd, namespace, tmp_path,  # noqa: F811
                                                case, document, field):
    code, out = validate(tmp_path, document)
    assert code == 1 and f": {field}" in out, out
    message = create(control_plane, namespace, document)
    assert message is not None, f"the API server stored a sweep that validate refuses ({case})"
    assert field in message, message


@pytest.mark.parametrize("case, document", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_by_both(control_plane, project_crd, namespace, tmp_path, case, document):  # noqa: F811
    code, out = validate(tmp_path, document)
    assert code == 0, out
    assert create(control_plane, namespace, document) is None
