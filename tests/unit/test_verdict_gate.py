"""A release gate that cannot pass a broken run (issue 25): one definition of a usable report used by every
caller, non-finite values fail, strict JSON, options and specs that check nothing are refused, baselines carry
an identity and fit a client-side apply."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from forge_replay.api import parse_job
from forge_replay.cli import main
from forge_replay.runtime.report import RunReport, combine_rank_results, summarize, write_json
from forge_replay.verdict.baseline import (
    ANNOTATIONS_LIMIT, applied_size, baseline_configmap, baseline_content, configmap_problem,
)
from forge_replay.verdict.checks import check_report, first_failure
from forge_replay.verdict.identity import identity_differences, identity_of
from forge_replay.verdict.reports import parse_report, unusable_reason
from forge_replay.verdict.run import baseline_problem
from tests.unit.spec_factory import debug_job
from tests.unit.test_report import batch, rank_result

ENV = {"seed": 7, "torch": "2.9.0", "transformers": "4.57.0", "forge_replay": "0.1.0", "device": "cpu",
       "world_size": 1, "deterministic": {"use_deterministic_algorithms": True, "warn_only": True},
       "threads": {"torch_intra_op": 2, "torch_inter_op": 2, "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None}}
JOB = parse_job(debug_job(metadata={"name": "release"}, spec__expect={"maxFallbacks": 0}))
IDENTITY = identity_of("release", JOB.spec)


def good(losses=(0.5, 0.25, 0.125), **top):
    doc = {"job": "release", "mode": "debug", "started_at": "2026-12-01T10:00:00Z", "partial": False,
           "completed": len(losses), "planned": len(losses), "error": None, "interrupted": None,
           "stopped_early": None, "identity": IDENTITY, "environment": ENV,
           "expectations": [{"name": "maxFallbacks", "passed": True, "message": "0 <= 0"}],
           "summary": {"rollouts": len(losses), "all_finite": True, "fallbacks": 0, "tokens_per_second": 10.0},
           "rollouts": [{"rollout_id": i, "loss": x, "grad_norm": 1.0 + i, "fallback_used": False}
                        for i, x in enumerate(losses)]}
    doc.update(top)
    return doc


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=1))  # allow_nan: the bare NaN / Infinity of reports before issue 25
    return str(path)


def invoke(*args):
    return CliRunner().invoke(main, ["report", *args])


def nan_rollout(doc):
    doc["rollouts"][1]["loss"] = math.nan
    return doc


UNUSABLE = [
    ("killed", good(partial=True, completed=2, error="interrupted by SIGTERM", interrupted="SIGTERM"),
     "interrupted by SIGTERM"),
    ("partial", good(partial=True, completed=2), "2 of 3 rollouts"),
    ("stopped-early", good(stopped_early="peak memory 9 GiB at rollout 0 is over"), "stopped early"),
    ("error", good(error="ReplayError: rollout 2: boom"), "rollout 2: boom"),
    ("nan", nan_rollout(good()), "rollout 1 loss is nan"),
    ("inf", good(losses=(0.5, math.inf, 0.1)), "rollout 1 loss is inf"),
    ("null-flagged", good(rollouts=[{"rollout_id": 0, "loss": None, "grad_norm": None,
                                     "non_finite": {"loss": "nan", "grad_norm": "nan"}}]), "loss is nan"),
    ("own-expectations-failed", good(expectations=[{"name": "maxPeakMemoryGiB", "passed": False}]),
     "its own expectations failed (maxPeakMemoryGiB)"),
    ("no-job", good(job=None), "names no job"),
    ("nothing-trained", good(losses=()), "no rollout was trained"),
]


@pytest.mark.parametrize("case, doc, why", UNUSABLE, ids=[u[0] for u in UNUSABLE])
def test_one_definition_of_a_usable_report_for_every_caller(tmp_path, case, doc, why):
    """report compare (either side: exit 2 naming why), report baseline, run --baseline and the operator's
    ConfigMap check all refuse the same reports for the same reason."""
    bad, fine = write(tmp_path, "bad.json", doc), write(tmp_path, "good.json", good())
    assert unusable_reason(parse_report(open(bad).read(), bad)) is not None
    for a, b, side in ((bad, fine, "A"), (fine, bad, "B")):
        result = invoke("compare", a, b)
        assert result.exit_code == 2 and f"{side}: {bad}: not usable" in result.output and why in result.output, \
            result.output
    refused = invoke("baseline", bad, "--name", "b")
    assert refused.exit_code == 2 and why in refused.output, refused.output
    spec = parse_job(debug_job(spec__expect={"baseline": {"configMapName": "b"}})).spec
    assert why in baseline_problem(bad, spec)  # forge-replay run --baseline, before Ray
    configmap = {"data": {"report.json": open(bad).read()}}
    assert why in configmap_problem(configmap, "ml", "b")  # the operator, before it creates anything
    assert invoke("compare", fine, fine).exit_code == 0
    assert configmap_problem({"data": {"report.json": open(fine).read()}}, "ml", "b") is None


def test_the_runs_verdict_refuses_an_unusable_baseline_it_is_handed():
    spec = parse_job(debug_job(spec__expect={"baseline": {"configMapName": "b"}})).spec
    checks = check_report(good(), spec.expect, good(partial=True, completed=1))
    assert [c.name for c in checks if not c.passed] == ["baseline.loss", "baseline.grad_norm"]
    assert "baseline cannot be used: the baseline report: the run did not finish" in checks[1].message


# ------------------------------------------------------------------------------------------ non-finite


def nan_report(tmp_path):
    """What the smoke job with learningRate 1e30 produces: grad_norm NaN from rollout 1, loss NaN from 2."""
    report = RunReport(job="nan", mode="debug", world_size=1, device="cpu", num_params=1, started_at="now",
                       partial=False, completed=3, planned=3)
    for step in range(3):
        ranks = [rank_result(0, -3.0 if step < 2 else math.nan, 30, 1.0)]
        ranks[0]["grad_norm"] = 0.5 if step == 0 else math.nan
        report.rollouts.append(combine_rank_results(step, batch(step), ranks, 0.01, 1.0))
    report.summary = summarize(report.rollouts, [], 1.0)
    return report


@pytest.mark.parametrize("expect", [{"maxFallbacks": 0}, {"maxPeakMemoryGiB": 8}, {"minTokensPerSecond": 1}])
def test_any_expectation_fails_a_run_whose_numbers_went_non_finite(tmp_path, expect):
    report = nan_report(tmp_path).to_dict()
    checks = check_report(report, parse_job(debug_job(spec__expect=expect)).spec.expect)
    miss = first_failure(checks)
    assert (miss.name, miss.rollout, miss.metric) == ("finiteMetrics", 1, "grad_norm"), checks
    assert "rollout 1: grad_norm is nan" in miss.message and "rollouts [1, 2]" in miss.message
    assert all(c.passed for c in checks if c.name != "finiteMetrics")  # the rest still says what it saw


def _refuse(token):
    raise ValueError(f"non-standard JSON token {token}")


def test_report_json_is_strict_json_with_the_non_finite_values_flagged(tmp_path):
    write_json(nan_report(tmp_path), tmp_path)
    text = (tmp_path / "report.json").read_text()
    doc = json.loads(text, parse_constant=_refuse)  # what Go's encoding/json and jq accept
    assert [r["non_finite"] for r in doc["rollouts"]] == [{}, {"grad_norm": "nan"},
                                                          {"loss": "nan", "grad_norm": "nan"}]
    assert [r["loss"] is None for r in doc["rollouts"]] == [False, False, True]
    assert doc["summary"]["all_finite"] is False and doc["summary"]["non_finite_rollout_ids"] == [1, 2]
    assert doc["summary"]["last_loss"] is None
    if shutil.which("jq"):
        out = subprocess.run(["jq", "-c", "[.rollouts[].non_finite | keys]", str(tmp_path / "report.json")],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == [[], ["grad_norm"], ["grad_norm", "loss"]]
    assert "not usable" in invoke("compare", str(tmp_path / "report.json"), str(tmp_path / "report.json")).output


def test_two_inf_reports_do_not_match(tmp_path):
    inf = write(tmp_path, "inf.json", good(losses=(0.5, math.inf)))
    assert invoke("compare", inf, inf).exit_code == 2


# ------------------------------------------------------------------------------------------ options


@pytest.mark.parametrize("args, fragment", [
    (["--rtol", "nan"], "--rtol nan: Input should be a finite number"),
    (["--atol", "inf"], "--atol inf: Input should be a finite number"),
    (["--atol", "-1e-9"], "--atol -1e-09: Input should be greater than or equal to 0"),
    (["--metrics", ""], "names no metric"),
    (["--metrics", ","], "names no metric"),
    (["--metrics", "loss,los"], "--metrics 'los': not a per-rollout metric"),
])
def test_compare_refuses_tolerances_and_metrics_that_check_nothing(tmp_path, args, fragment):
    a = write(tmp_path, "a.json", good())
    result = invoke("compare", a, a, *args)
    assert result.exit_code == 2 and fragment in result.output, result.output


def test_a_negated_loss_is_never_within_the_tolerances(tmp_path):
    a = write(tmp_path, "a.json", good())
    b = write(tmp_path, "b.json", good(losses=(-0.5, -0.25, -0.125)))
    assert invoke("compare", a, b, "--atol", "1e300").exit_code == 0  # a finite tolerance says what it says
    assert invoke("compare", a, b, "--atol", "inf").exit_code == 2


# ------------------------------------------------------------------------------------------ report baseline


@pytest.mark.parametrize("args, fragment", [
    (["--name", "b", "--namespace", "Bad_NS"], "--namespace 'Bad_NS': not a namespace name"),
    (["--name", "b", "--namespace", "n" * 64], "not a namespace name"),
    (["--name", "Bad_Name"], "--name 'Bad_Name': not a ConfigMap name"),
])
def test_baseline_refuses_names_the_api_server_refuses(tmp_path, args, fragment):
    result = invoke("baseline", write(tmp_path, "r.json", good()), *args)
    assert result.exit_code == 2 and fragment in result.output, result.output


def test_baseline_refuses_a_rollout_id_of_true(tmp_path):
    doc = good()
    doc["rollouts"][0]["rollout_id"] = True
    result = invoke("baseline", write(tmp_path, "r.json", doc), "--name", "b")
    assert result.exit_code == 2 and "rollouts[0]: rollout_id True is not an integer" in result.output


# ------------------------------------------------------------------------------------------ identity


def test_identity_names_the_job_mode_dumps_model_and_number_changing_settings():
    assert IDENTITY["job"] == "release" and IDENTITY["mode"] == "debug"
    assert IDENTITY["dumps_path"] == JOB.spec.replay.dumps.path
    assert len(IDENTITY["model"]["config_sha256"]) == 64
    assert {"learning_rate", "clip_eps", "clip_eps_high", "dtype", "micro_batch_tokens", "seed"} <= \
        set(IDENTITY["trainer"])
    other = parse_job(debug_job(spec__model={"claimName": "models", "path": "Qwen3-0.6B"})).spec
    assert identity_of("x", other)["model"] == {"claim_name": "models", "path": "Qwen3-0.6B"}
    changed = parse_job(debug_job(spec__model__config={**JOB.spec.model.config, "hidden_size": 96})).spec
    assert identity_of("release", changed)["model"] != IDENTITY["model"]


def test_compare_warns_on_another_job_or_setting_and_fails_on_another_mode_or_model(tmp_path):
    a = write(tmp_path, "a.json", good())
    lr = {**IDENTITY, "job": "release-2", "trainer": {**IDENTITY["trainer"], "learning_rate": 1e-5}}
    warned = invoke("compare", a, write(tmp_path, "b.json", good(identity=lr)))
    assert warned.exit_code == 0
    assert "warning: job: 'release' here, 'release-2' in the baseline" in warned.output
    assert "warning: trainer.learning_rate: 1e-06 here, 1e-05 in the baseline" in warned.output
    forge = write(tmp_path, "c.json", good(identity={**IDENTITY, "mode": "forge", "model": {"path": "x"}}))
    failed = invoke("compare", a, forge)
    assert failed.exit_code == 3 and "not runs of one job: mode: 'debug' here, 'forge' in the baseline" in \
        failed.output and "model:" in failed.output
    allowed = invoke("compare", a, forge, "--allow-different")
    assert allowed.exit_code == 0 and "warning: mode:" in allowed.output


def test_the_verdict_fails_on_another_mode_unless_the_spec_allows_it():
    forge = good(identity={**IDENTITY, "mode": "forge"})
    for allow, failed in ((False, ["baseline.identity"]), (True, [])):
        spec = parse_job(debug_job(spec__expect={"baseline": {"configMapName": "b", "allowDifferent": allow}})).spec
        checks = check_report(good(), spec.expect, forge)
        assert [c.name for c in checks if not c.passed] == failed
    blocking, warnings = identity_differences(good(), forge)
    assert blocking == ["mode: 'debug' here, 'forge' in the baseline"] and warnings == []


# ------------------------------------------------------------------------------------------ determinism


def test_compare_warns_on_other_thread_settings_and_prints_every_digit(tmp_path):
    threads = {**ENV, "threads": {**ENV["threads"], "OMP_NUM_THREADS": "1", "torch_intra_op": 1}}
    a = write(tmp_path, "a.json", good())
    near = good(environment=threads)
    near["rollouts"][2]["grad_norm"] = 3.0 + 3.7e-9  # OMP 1 vs 2 at rollout 3 (issue 25)
    result = CliRunner().invoke(main, ["report", "compare", a, write(tmp_path, "b.json", near), "--metrics",
                                       "grad_norm", "--rtol", "0", "--atol", "0"], terminal_width=200)
    assert result.exit_code == 3
    assert "warning: threads: {" in result.output and "'OMP_NUM_THREADS': None" in result.output
    assert "3.0000000037" in result.output and "1.23e-09" in result.output  # both values apart, and relative


# ------------------------------------------------------------------------------------------ GitOps size


def long_report(rollouts=1000):
    """A 1000-rollout report as a run writes it: every per-rollout field, memory per rank, a full summary."""
    import random

    draw = random.Random(25).random  # floats with all 17 significant digits, as a run's are
    doc = good(losses=[draw() for _ in range(rollouts)])
    for r in doc["rollouts"]:
        r.update(tokens=65536, loss_tokens=32768.0, num_samples=256, micro_batches=8, step_seconds=12.345678,
                 data_wait_seconds=0.0123, dump_path=f"run-42/rollout_{r['rollout_id']}.pt", clip_fraction=draw(),
                 grad_norm=draw() * 10, reward_mean=draw(), masked_out_samples=0, multimodal_ignored_samples=0,
                 non_finite={},
                 rollout_id_mismatch=None, weight_sync_seconds=None,
                 memory=[{"rank": k, "device": "cuda:0", "peak_allocated_gib": 71.123456, "peak_reserved_gib": 75.5,
                          "peak_rss_gib": 3.2, "rss_reset": True} for k in range(8)])
    return doc


def test_a_1000_rollout_baseline_fits_client_side_apply(tmp_path):
    from forge_replay.api.spec_parts import ROLLOUT_METRICS

    doc = long_report()
    assert len(json.dumps(doc)) > 2 * ANNOTATIONS_LIMIT  # the whole report would not fit
    configmap = baseline_configmap(baseline_content(doc, ROLLOUT_METRICS), "release-baseline", "ml")
    assert applied_size(configmap) < ANNOTATIONS_LIMIT - 4096
    result = invoke("baseline", write(tmp_path, "r.json", doc), "--name", "release-baseline")
    assert result.exit_code == 0 and "warning" not in result.output
    baseline = tmp_path / "baseline.json"
    baseline.write_text(yaml.safe_load(result.output)["data"]["report.json"])
    same = invoke("compare", str(tmp_path / "r.json"), str(baseline), "--rtol", "0", "--atol", "0",
                  "--metrics", ",".join(ROLLOUT_METRICS))
    assert same.exit_code == 0 and "on all 1000 rollouts" in same.output


def test_the_runs_verdict_warns_on_another_environment_or_setting(tmp_path):
    """What `run` and the in-cluster runtime record in report.json's warnings next to a passing verdict."""
    from forge_replay.verdict.run import verdict

    threads = {**ENV["threads"], "OMP_NUM_THREADS": "1"}
    lr = {**IDENTITY, "trainer": {**IDENTITY["trainer"], "learning_rate": 1e-5}}
    path = write(tmp_path, "b.json", good(identity=lr, environment={**ENV, "threads": threads}))
    spec = parse_job(debug_job(spec__expect={"baseline": {"configMapName": "b"}})).spec
    checks, warnings = verdict(good(), spec, path)
    assert all(c.passed for c in checks)
    assert [w.split(": ")[1] for w in warnings] == ["trainer.learning_rate", "threads"]
    assert all(w.startswith(f"baseline {path}: ") for w in warnings)


def test_run_refuses_a_baseline_of_another_mode_before_it_trains(tmp_path):
    forge = write(tmp_path, "forge.json", good(identity={**IDENTITY, "mode": "forge"}))

    def spec(allow):
        return parse_job(debug_job(spec__expect={"baseline": {"configMapName": "b", "allowDifferent": allow}})).spec

    assert "is of another job: mode: 'debug' here, 'forge' in the baseline" in baseline_problem(forge, spec(False))
    assert baseline_problem(forge, spec(True)) is None
    configmap = {"data": {"report.json": open(forge).read()}}  # the operator, before it creates anything
    assert "is of another job: mode:" in configmap_problem(configmap, "ml", "b", spec(False))
    assert configmap_problem(configmap, "ml", "b", spec(True)) is None
