"""`forge-replay run` with spec.expect on CPU (issue 17's done-when): a debug replay reproduces itself bit for bit,
so the same job checked against the first run's report passes at rtol 1e-6; a baseline 1% off at one rollout and a
memory budget of 0.01 GiB exit 3, the budget stopping the run after its first step with the report kept."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from click.testing import CliRunner  # noqa: E402

from forge_replay.api import parse_job  # noqa: E402
from forge_replay.verdict.checks import check_report, first_failure  # noqa: E402
from forge_replay.commands.run import run as run_command  # noqa: E402
from tests.integration.test_runtime import job_doc, write_dump, write_job_file  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def run_cli(tmp_path, doc, out, *extra):
    (tmp_path / out).mkdir()
    path = write_job_file(tmp_path / out, doc)
    result = CliRunner().invoke(run_command, [path, "--dumps-root", str(tmp_path / "dumps"), "--results",
                                              str(tmp_path / out / "results"), "--no-progress", *extra])
    report = tmp_path / out / "results" / "report.json"
    return result, (json.loads(report.read_text()) if report.exists() else None)


def test_a_debug_replay_passes_against_its_own_report_and_fails_a_changed_one(tmp_path):
    write_dump(tmp_path / "dumps" / "rollout_0.pt", 0)
    write_dump(tmp_path / "dumps" / "rollout_1.pt", 1, seed=1)
    write_dump(tmp_path / "dumps" / "rollout_2.pt", 2, seed=2)
    doc = job_doc("expect", "rollout_{rollout_id}.pt", 3, lr=1e-2)
    doc["spec"]["expect"] = {"maxFallbacks": 0, "minTokensPerSecond": 0}
    first, first_report = run_cli(tmp_path, doc, "first")
    assert first.exit_code == 0, first.output
    env = first_report["environment"]
    assert env["seed"] == 7 and env["device"] == "cpu" and env["world_size"] == 1 and env["torch"]
    assert env["deterministic"]["use_deterministic_algorithms"] is True
    assert [c["name"] for c in first_report["expectations"]] == ["finiteMetrics", "maxFallbacks", "minTokensPerSecond"]
    assert env["threads"]["torch_intra_op"] >= 1 and "OMP_NUM_THREADS" in env["threads"]  # measured in the rank
    assert first_report["identity"]["mode"] == "debug" and first_report["identity"]["job"] == "expect"
    baseline = tmp_path / "first" / "results" / "report.json"

    doc["spec"]["expect"]["baseline"] = {"configMapName": "release-baseline", "metrics": ["loss", "grad_norm"],
                                         "rtol": 1e-6, "atol": 0.0}
    again, again_report = run_cli(tmp_path, doc, "again", "--baseline", str(baseline))
    assert again.exit_code == 0, again.output
    assert all(c["passed"] for c in again_report["expectations"]), again_report["expectations"]
    assert [c["name"] for c in again_report["expectations"]][-2:] == ["baseline.loss", "baseline.grad_norm"]
    assert "expectations: all met" in again.output
    # bit for bit, not merely within rtol
    for metric in ("loss", "grad_norm"):
        assert [r[metric] for r in again_report["rollouts"]] == [r[metric] for r in first_report["rollouts"]]

    # a baseline 1% off at rollout 2: the same verdict functions the run uses name the rollout and the metric
    off = json.loads(baseline.read_text())
    off["rollouts"][2]["loss"] *= 1.01
    miss = first_failure(check_report(again_report, parse_job(doc).spec.expect, off))
    assert (miss.name, miss.rollout, miss.metric) == ("baseline.loss", 2, "loss")

    # one more run: a baseline 1% off at rollout 0 and a memory budget no run meets -> exit 3 after one step
    off["rollouts"][2]["loss"] /= 1.01
    off["rollouts"][0]["loss"] *= 1.01
    (tmp_path / "off.json").write_text(json.dumps(off))
    doc["spec"]["expect"]["maxPeakMemoryGiB"] = 0.01
    over, over_report = run_cli(tmp_path, doc, "over", "--baseline", str(tmp_path / "off.json"))
    assert over.exit_code == 3, over.output
    assert "first: maxPeakMemoryGiB" in over.output and "baseline.loss" in over.output
    assert over_report["completed"] == 1 and over_report["partial"] is True
    assert "over spec.expect.maxPeakMemoryGiB" in over_report["stopped_early"]
    failed = {c["name"]: c for c in over_report["expectations"] if not c["passed"]}
    assert set(failed) == {"maxPeakMemoryGiB", "baseline.loss"}
    assert failed["maxPeakMemoryGiB"]["observed"] > 0.01 and failed["baseline.loss"]["rollout"] == 0
    assert failed["baseline.loss"]["message"].startswith("rollout 0: loss ")


def test_a_run_whose_losses_went_nan_fails_any_expectation(tmp_path):
    """Issue 25: the smoke job with learningRate 1e30 (grad norm NaN from rollout 1, loss NaN after) and
    expectations it otherwise meets exits 3 naming finiteMetrics; report.json stays strict JSON."""
    import yaml

    doc = yaml.safe_load(open("examples/smoke-cpu.yaml"))
    doc["spec"]["trainer"]["learningRate"] = 1e30
    doc["spec"]["replay"]["numRollouts"] = 3
    doc["spec"]["expect"] = {"maxFallbacks": 0, "maxPeakMemoryGiB": 8, "minTokensPerSecond": 1}
    result, report = run_cli(tmp_path, doc, "nan", "--synth-missing")
    assert result.exit_code == 3, result.output
    assert "first: finiteMetrics: rollout 1: grad_norm is nan" in result.output
    text = (tmp_path / "nan" / "results" / "report.json").read_text()
    json.loads(text, parse_constant=lambda token: pytest.fail(f"report.json holds {token}"))
    assert report["summary"]["all_finite"] is False and report["rollouts"][1]["non_finite"] == {"grad_norm": "nan"}
    assert [c["name"] for c in report["expectations"] if not c["passed"]] == ["finiteMetrics"]


def walkthrough_commands() -> list[str]:
    """The commands of docs/gitops.md's "Record a baseline, then gate on it", as written."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gitops.md").read_text()
    section = doc[doc.index("### Record a baseline, then gate on it"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_gitops_walkthrough_runs_as_written(tmp_path, monkeypatch):
    """Issue 25: every command of the walkthrough, in a fresh folder holding examples/; the baseline it prints is
    a ConfigMap that validate skips next to the gate, and the gate passes against it bit for bit."""
    import shlex
    import shutil
    from pathlib import Path

    import yaml

    from forge_replay.cli import main

    commands = walkthrough_commands()
    assert [c.split()[:2] for c in commands] == [["forge-replay", "run"], ["forge-replay", "report"],
                                                 ["forge-replay", "validate"], ["forge-replay", "run"],
                                                 ["forge-replay", "report"]]
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command)
        out = None
        if ">" in words:
            words, out = words[:words.index(">")], words[words.index(">") + 1]
        result = CliRunner().invoke(main, words[1:] + (["--no-progress"] if words[1] == "run" else []))
        assert result.exit_code == 0, (command, result.output)
        if out:
            Path(out).write_text(result.stdout)
    configmap = yaml.safe_load(Path("baseline.yaml").read_text())
    assert configmap["metadata"]["name"] == "release-gate-baseline"
    gate = yaml.safe_load(Path("examples/release-gate.yaml").read_text())
    assert gate["spec"]["expect"]["baseline"]["configMapName"] == configmap["metadata"]["name"]
    verdict = json.loads(Path("results/gate-2/report.json").read_text())["expectations"]
    assert [c["name"] for c in verdict] == ["finiteMetrics", "maxFallbacks", "baseline.loss", "baseline.grad_norm"]
    assert all(c["passed"] for c in verdict)
    # one file holding the gate and its baseline, as a GitOps folder does: run skips the ConfigMap
    both = Path("gate.yaml")
    both.write_text(Path("baseline.yaml").read_text() + "---\n" + Path("examples/release-gate.yaml").read_text())
    from forge_replay.runtime.run_inputs import load_one_job

    assert load_one_job(str(both)).metadata.name == "release-gate"
