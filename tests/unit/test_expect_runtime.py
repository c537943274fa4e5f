"""The runtime's side of the verdict (issue 17): deterministic settings, the environment record, the baseline
refused before Ray, the exit decision and the verdict table."""

from __future__ import annotations

import json

import pytest

from forge_replay.api import parse_job
from forge_replay.runtime.environment import environment, make_deterministic
from forge_replay.runtime.report import RunReport
from forge_replay.verdict.identity import ENVIRONMENT_KEYS
from forge_replay.verdict.run import baseline_problem, render_verdict, unmet
from tests.unit.spec_factory import debug_job


@pytest.fixture
def restore_determinism():
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_debug_mode_turns_torchs_deterministic_settings_on_and_says_so(restore_determinism):
    import torch

    torch.use_deterministic_algorithms(False)
    on = make_deterministic(use_gpu=False)
    assert torch.are_deterministic_algorithms_enabled()
    assert on == {"use_deterministic_algorithms": True, "warn_only": True}  # no CUDA settings claimed on CPU


def test_the_environment_holds_what_compare_checks():
    env = environment(7, "cpu", 2, {"use_deterministic_algorithms": True}, {"torch_intra_op": 2})
    assert tuple(env) == ENVIRONMENT_KEYS
    assert (env["seed"], env["device"], env["world_size"]) == (7, "cpu", 2) and env["torch"]


def spec(expect=None):
    return parse_job(debug_job(spec__expect=expect) if expect else debug_job()).spec


BASELINE = {"baseline": {"configMapName": "release-baseline"}}


def test_a_baseline_is_checked_before_ray(tmp_path):
    good = tmp_path / "report.json"
    good.write_text(json.dumps({"job": "j", "partial": False, "rollouts": [{"rollout_id": 0, "loss": 0.5}]}))
    assert baseline_problem(None, spec()) is None
    assert baseline_problem(str(good), spec(BASELINE)) is None
    assert "no spec.expect.baseline" in baseline_problem(str(good), spec())
    assert "ConfigMap release-baseline: pass --baseline FILE" in baseline_problem(None, spec(BASELINE))
    assert "cannot be read" in baseline_problem(str(tmp_path / "absent.json"), spec(BASELINE))


def report_with(*checks):
    report = RunReport(job="j", mode="debug", world_size=1, device="cpu", num_params=1, started_at="now")
    report.expectations = list(checks)
    return report


def test_unmet_names_the_first_failure():
    ok = {"name": "maxFallbacks", "passed": True, "message": "0 <= 0"}
    miss = {"name": "baseline.loss", "passed": False, "message": "rollout 2: loss 0.51 vs baseline 0.5"}
    assert unmet(report_with(ok)) is None and unmet(report_with()) is None
    assert unmet(report_with(ok, miss)) == "1 of 2 expectation(s) not met; first: baseline.loss: rollout 2: loss " \
                                            "0.51 vs baseline 0.5"


def test_the_verdict_table_shows_each_check():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(render_verdict([
        {"name": "maxPeakMemoryGiB", "passed": False, "observed": 0.8, "limit": 0.01, "message": "0.8 > 0.01"},
        {"name": "baseline.loss", "passed": True, "observed": 0.5, "limit": 0.5, "message": "within"},
    ]))
    text = console.export_text()
    assert "1 of 2 NOT met" in text and "FAILED: 0.8 > 0.01" in text and "passed" in text


def test_the_in_cluster_runtime_stops_before_ray_on_a_baseline_it_cannot_read(tmp_path):
    """A baseline on a PVC (which the operator cannot read ahead) that is missing: exit 3 before Ray, the failed
    baseline checks recorded with the result the operator reads."""
    from forge_replay.api.runtime_config import RuntimeConfig
    from forge_replay.runtime.__main__ import main

    doc = debug_job(metadata={"name": "gate", "namespace": "ml"},
                    spec__expect={"baseline": {"claimName": "results", "path": "r1/report.json"}})
    config = RuntimeConfig(job=parse_job(doc), dumps_root=str(tmp_path), results_dir=str(tmp_path / "out"),
                           model_root=None, baseline_path=str(tmp_path / "absent" / "report.json"))
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert main(["--config", str(tmp_path / "config.yaml"), "--no-progress"]) == 3
    result = json.loads((tmp_path / "out" / "progress.json").read_text())["result"]
    assert result["phase"] == "Failed" and "cannot be read" in result["message"]
    assert [(e["name"], e["passed"]) for e in result["expectations"]] == [("baseline.loss", False),
                                                                          ("baseline.grad_norm", False)]
