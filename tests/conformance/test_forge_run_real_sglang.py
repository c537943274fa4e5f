"""Issue 12's "Done when": a forge run on CPU for a ``model.config`` job against the double, which parses its argv
with sglang's real ``ServerArgs`` and forms the weight group with sglang's real ``init_custom_process_group``
(tests/doubles/real_sglang.py) and answers as the pinned version does, passes with ``weightSync: disk`` and with
``weightSync: distributed``: one push per step, every version read back from ``/model_info``, no request answered
404, 405 or 422."""

from __future__ import annotations

import pytest

from tests.conformance.conftest import RECORDED_RUNS, STEPS
from tests.doubles import real_sglang

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PUSH = {"disk": "/update_weights_from_disk", "distributed": "/update_weights_from_distributed"}


@pytest.mark.parametrize("name", sorted(RECORDED_RUNS))
def test_forge_run_against_sglangs_own_parser_and_process_group(recorded_runs, name):
    run = recorded_runs[name]
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    versions = [str(step) for step in range(1, STEPS + 1)]
    assert run.report["engines"]["weight_versions"] == versions
    assert len(run.engines) == 2
    for engine in run.engines.values():
        start = engine["starts"][-1]
        assert start["sglang_parser"] == f"real {real_sglang.SGLANG_VERSION}" and start["unknown"] == []
        calls = engine["calls"]
        pushes = [c for c in calls if c["path"] == PUSH[name]]
        assert [c["body"]["weight_version"] for c in pushes] == versions  # one push per step
        read_back = [c for c in calls if c["path"] == "/model_info"]
        assert len(read_back) == STEPS and all(c["status"] == 200 for c in read_back)
        assert [(c["path"], c["status"]) for c in calls if c["status"] in (404, 405, 422)] == []
        if name == "distributed":
            joins = [c for c in calls if c["path"] == "/init_weights_update_group"]
            assert joins and all(c["body"]["double"]["group"] ==
                                 f"sglang {real_sglang.SGLANG_VERSION} init_custom_process_group" for c in joins)
