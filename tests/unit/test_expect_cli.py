"""`forge-replay report compare|baseline` (issue 17) on report files written here."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.cli import main

ENV = {"seed": 7, "torch": "2.9.0", "transformers": "4.57.0", "forge_replay": "0.1.0", "device": "cpu",
       "world_size": 1, "deterministic": {"use_deterministic_algorithms": True, "warn_only": True},
       "threads": {"torch_intra_op": 2, "torch_inter_op": 2, "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None}}
IDENTITY = {"job": "release", "mode": "debug", "dumps_path": "r/rollout_{rollout_id}.pt",
            "model": {"config_sha256": "ab" * 32}, "trainer": {"learning_rate": 1e-6, "seed": 7}}


def report(losses, grad_norms=None, **top):
    grad_norms = grad_norms or [1.0] * len(losses)
    doc = {"job": "release", "mode": "debug", "started_at": "2026-11-30T22:00:00Z", "partial": False,
           "completed": len(losses), "planned": len(losses), "error": None, "environment": ENV, "identity": IDENTITY,
           "rollouts": [{"rollout_id": i, "loss": x, "grad_norm": g}
                        for i, (x, g) in enumerate(zip(losses, grad_norms))]}
    doc.update(top)
    return doc


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return str(path)


def invoke(*args):
    return CliRunner().invoke(main, ["report", *args])


def test_compare_equal_reports_exits_0(tmp_path):
    a = write(tmp_path, "a.json", report([0.5, 0.25, 0.125]))
    result = invoke("compare", a, a)
    assert result.exit_code == 0, result.output
    assert "within rtol 1e-05 / atol 1e-08 on all 3 rollouts" in result.output
    assert "warning" not in result.output


def test_compare_names_the_first_rollout_and_metric_that_differ(tmp_path):
    a = write(tmp_path, "a.json", report([0.5, 0.25, 0.125], [1.0, 2.0, 3.0]))
    b = write(tmp_path, "b.json", report([0.5, 0.25 * 1.01, 0.125], [1.0, 2.0, 3.5]))
    result = invoke("compare", a, b, "--rtol", "1e-6")
    assert result.exit_code == 3, result.output
    assert "baseline.loss: rollout 1: loss" in result.output
    only_grad = invoke("compare", a, b, "--metrics", "grad_norm")
    assert only_grad.exit_code == 3 and "rollout 2: grad_norm" in only_grad.output
    loose = invoke("compare", a, b, "--metrics", "loss", "--rtol", "0.02")
    assert loose.exit_code == 0, loose.output


def test_compare_warns_on_another_environment_and_a_missing_rollout_fails(tmp_path):
    a = write(tmp_path, "a.json", report([0.5, 0.25, 0.125]))
    b = write(tmp_path, "b.json", report([0.5, 0.25], environment={**ENV, "torch": "2.8.0"}))
    result = invoke("compare", a, b)
    assert result.exit_code == 3
    assert "warning: torch: '2.9.0' here, '2.8.0' in the baseline" in result.output
    assert "no entry for rollout 2" in result.output
    shorter = invoke("compare", b, a)  # B replayed more than A: the extra rollout is named, not compared
    assert "also holds rollouts [2]" in shorter.output


@pytest.mark.parametrize("args, fragment", [
    (["--metrics", "los"], "not a per-rollout metric"),
    (["--rtol", "-1"], "--rtol -1.0: Input should be greater than or equal to 0"),
])
def test_compare_refuses_bad_options(tmp_path, args, fragment):
    a = write(tmp_path, "a.json", report([0.5]))
    result = invoke("compare", a, a, *args)
    assert result.exit_code == 2 and fragment in result.output


def test_compare_an_unreadable_report_exits_2(tmp_path):
    a = write(tmp_path, "a.json", report([0.5]))
    (tmp_path / "bad.json").write_text("{")
    assert invoke("compare", a, str(tmp_path / "bad.json")).exit_code == 2
    assert invoke("compare", a, str(tmp_path / "absent.json")).exit_code == 2


def test_baseline_prints_a_configmap_that_compares_as_the_report_does(tmp_path):
    a = write(tmp_path, "a.json", report([0.5, 0.25]))
    result = invoke("baseline", a, "--name", "release-1-3-baseline", "--namespace", "ml")
    assert result.exit_code == 0, result.output
    cm = yaml.safe_load(result.output)
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "release-1-3-baseline",
                                                                                 "ml")
    assert "report.json: |" in result.output  # a readable block in Git, not one escaped line
    b = tmp_path / "b.json"
    b.write_text(cm["data"]["report.json"])
    same = invoke("compare", a, str(b), "--rtol", "0", "--atol", "0")
    assert same.exit_code == 0 and "warning" not in same.output, same.output
    assert json.loads(b.read_text())["identity"] == IDENTITY and json.loads(b.read_text())["environment"] == ENV


@pytest.mark.parametrize("doc, name, fragment", [
    (report([0.5], partial=True, completed=0), "b", "did not finish"),
    (report([0.5], error="RuntimeError: boom"), "b", "RuntimeError: boom"),
    (report([0.5], stopped_early="peak memory over"), "b", "peak memory over"),
    (report([]), "b", "no rollout was trained"),
    (report([0.5]), "Bad_Name", "DNS-1123"),
    (report([0.123456789 + i * 1e-12 for i in range(60000)]), "b", "more than a ConfigMap holds"),
])
def test_baseline_refuses(tmp_path, doc, name, fragment):
    result = invoke("baseline", write(tmp_path, "r.json", doc), "--name", name)
    assert result.exit_code == 2 and fragment in result.output, result.output
