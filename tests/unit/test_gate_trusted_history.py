"""Trusted history on the results claim (issue 35 item 4): spec.expect.baseline.history, `report history` and
`report untrust`, over hand-made run folders laid out as on the claim (<namespace>/<job>/<run>/report.json)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from forge_replay.api import parse_job
from forge_replay.api.names import SpecInvalid
from forge_replay.verdict.history import UNTRUSTED_FILE, read_runs, references, started_at, untrust_marker
from forge_replay.verdict.run import verdict
from forge_replay.verdict.shadow import enforced
from tests.unit.spec_factory import debug_job
from tests.unit.test_gate_history import run
from tests.unit.test_verdict_gate import ENV, IDENTITY, invoke

LR = {**IDENTITY, "trainer": {**IDENTITY["trainer"], "learning_rate": 1e-5}}
FAILED = [{"name": "maxPeakMemoryGiB", "passed": False, "message": "80 > 78"}]
GC_ON = {**ENV, "sglang": "0.5.22", "trainer": {"gradient_checkpointing": True, "micro_batch_tokens": 4096}}
GC_OFF = {**GC_ON, "trainer": {"gradient_checkpointing": False, "micro_batch_tokens": 4096}}
MARK = untrust_marker("alice", "2026-12-09T10:00:00Z", "node gpu-17 had ECC errors")

# (folder under the root, report, untrusted.json or None): folder names do not follow the start times
RUNS = [
    ("default/release/a1", run(2, (75.0, 74.0), env=GC_ON), None),
    ("default/release/b2", run(4, (76.0, 74.5), env=GC_ON), None),
    ("default/nightly/c3", run(5, (77.0, 73.0), env=GC_ON, job="nightly"), None),  # another name, one identity
    ("default/release/d4", run(6, (90.0, 74.0), env=GC_ON, expectations=FAILED), None),  # failed: stored, untrusted
    ("default/release/e5", run(7, (76.0, 74.0), env=GC_ON), MARK),  # untrusted by hand
    ("default/other/f6", run(8, (50.0, 50.0), identity=LR), None),  # another identity
    ("flat-run", run(1, (76.0, 74.0), env=GC_ON), None),  # the oldest, laid out flat
    ("default/release/g7", run(20, (76.0, 74.0), env=GC_ON), None),  # started after the judged run (day 10)
]


def lay_out(root: Path, runs=RUNS) -> Path:
    for folder, doc, marker in runs:
        (root / folder).mkdir(parents=True)
        (root / folder / "report.json").write_text(json.dumps(doc))
        if marker:
            (root / folder / UNTRUSTED_FILE).write_text(json.dumps(marker))
    return root


def job(last=5, enforce=True, bands=({"metric": "peak_reserved_gib", "rtol": 0.02},), results="release-results"):
    expect = {"enforce": enforce, "baseline": {"history": {"last": last}, "metrics": ["loss"], "bands": list(bands)}}
    return parse_job(debug_job(metadata={"name": "release"}, spec__expect=expect,
                               spec__results={"claimName": results} if results else {}))


@pytest.fixture
def root(tmp_path):
    return lay_out(tmp_path / "results")


# ------------------------------------------------------------------------------------------ which runs are chosen

CHOICES = [
    # (last, before (day), chosen folders oldest first)
    (2, 10, ["default/release/b2", "default/nightly/c3"]),  # the last 2 by start time, not by folder name
    (10, 10, ["flat-run", "default/release/a1", "default/release/b2", "default/nightly/c3"]),
    (10, 3, ["flat-run", "default/release/a1"]),  # only runs that started before the judged one
    (10, None, ["flat-run", "default/release/a1", "default/release/b2", "default/nightly/c3", "default/release/g7"]),
]


@pytest.mark.parametrize("last, before, chosen", CHOICES)
def test_the_last_n_trusted_runs_of_the_identity_by_time(root, last, before, chosen):
    runs = read_runs(root)
    when = started_at({"started_at": f"2026-12-{before:02d}T10:00:00Z"}) if before else None
    refs = references(runs, IDENTITY, last, when)
    assert [r.folder for r in refs.chosen] == chosen
    assert (refs.untrusted, refs.other_identity) == (2, 1)  # d4 and e5 skipped; f6 of another identity


def test_failed_and_marked_runs_are_listed_never_trusted(root):
    (root / "default/release/broken").mkdir()
    (root / "default/release/broken/report.json").write_text("{not json")
    why = {r.folder: (r.trusted, r.why) for r in read_runs(root)}
    assert why["default/release/d4"] == (False, "its own expectations failed (maxPeakMemoryGiB)")
    assert why["default/release/e5"] == (False, "marked untrusted by alice at 2026-12-09T10:00:00Z: node gpu-17 had "
                                                "ECC errors")
    assert why["default/release/broken"][0] is False and "not JSON" in why["default/release/broken"][1]
    assert why["default/release/a1"] == (True, "met its 1 expectation(s)")
    assert len(why) == len(RUNS) + 1


# ------------------------------------------------------------------------------------------ the verdict


def judge(root, doc, spec_job=None, own=None):
    checks, _ = verdict(doc, (spec_job or job()).spec, None, str(root), own)
    return {c.name: c for c in checks}


def test_a_run_within_the_band_of_its_history_passes_and_names_its_references(root):
    checks = judge(root, run(10, (76.5, 74.0), env=GC_ON))
    assert all(c.passed for c in checks.values()), checks
    history = checks["baseline.history"]
    assert (history.observed, history.limit) == (4, 5)
    assert history.message.startswith("compared with the last 4 of 4 trusted run(s) of this identity under ")
    assert "default/nightly/c3 (2026-12-05T10:00:00Z), default/release/b2" in history.message  # newest first
    assert "left out: 2 untrusted, 1 of another identity, 1 started later" in history.message
    assert "within the band of 4 trusted run(s)" in checks["baseline.peak_reserved_gib.band"].message


def test_gradient_checkpointing_off_is_refused_naming_that_setting(root):
    gc_off = {**IDENTITY, "trainer": {**IDENTITY["trainer"], "gradient_checkpointing": False}}
    band = judge(root, run(10, (82.0, 74.0), env=GC_OFF, identity=gc_off))["baseline.peak_reserved_gib.band"]
    assert not band.passed
    assert "over the band of 4 trusted runs" in band.message
    assert "trainer.gradient_checkpointing True -> False" in band.message


def test_the_first_run_starts_the_history_and_its_own_folder_is_never_a_reference(tmp_path):
    root = lay_out(tmp_path / "results", [("default/release/own", run(10, (99.0, 99.0)), None),
                                          ("default/other/x", run(1, identity=LR), None)])
    checks = judge(root, run(10, (99.0, 99.0)), own=root / "default/release/own")
    assert list(checks) == ["finiteMetrics", "baseline.history"]  # nothing compared, nothing failed
    assert checks["baseline.history"].passed and "this run starts the history" in checks["baseline.history"].message
    assert "1 of another identity" in checks["baseline.history"].message


def test_a_history_that_cannot_be_read_fails_the_baseline_checks(tmp_path):
    checks = judge(tmp_path / "nowhere", run(10))
    assert not checks["baseline.history"].passed and "cannot be read" in checks["baseline.history"].message
    assert not checks["baseline.loss"].passed and not checks["baseline.peak_reserved_gib.band"].passed
    no_root, _ = verdict(run(10), job().spec, None, None)
    assert not next(c for c in no_root if c.name == "baseline.loss").passed


def test_shadow_records_a_history_miss_without_failing_then_enforce_fails(root):
    regressed = run(10, (82.0, 74.0), env=GC_OFF)
    for enforce in (False, True):
        spec = job(enforce=enforce).spec
        assert not judge(root, regressed, job(enforce=enforce))["baseline.peak_reserved_gib.band"].passed
        assert enforced(spec.expect) is enforce


# ------------------------------------------------------------------------------------------ API, operator, local


@pytest.mark.parametrize("baseline, results, path, fragment", [
    ({"history": {"last": 3}, "configMapName": "b"}, "r", "spec.expect.baseline",
     "(configMapName and history are set)"),
    ({"history": {"last": 3}}, None, "spec.expect.baseline.history", "needs spec.results.claimName"),
    ({"history": {"last": 0}}, "r", "spec.expect.baseline.history.last", ""),
    ({"history": {"last": 101}}, "r", "spec.expect.baseline.history.last", ""),
])
def test_a_malformed_history_names_the_field(baseline, results, path, fragment):
    with pytest.raises(SpecInvalid) as err:
        parse_job(debug_job(spec__expect={"baseline": baseline},
                            spec__results={"claimName": results} if results else {}))
    assert any(p.path == path and fragment in p.message for p in err.value.problems), err.value.problems


def test_the_operator_gives_the_runtime_the_claims_root_and_creates_nothing_that_holds_results():
    from forge_replay.api import paths
    from forge_replay.controller.render import render, runtime_config
    from forge_replay.controller.settings import OperatorSettings

    frj = job()
    frj.metadata.namespace, frj.metadata.uid = "default", "1a2b3c4d-0000-0000-0000-000000000000"
    config = runtime_config(frj, OperatorSettings())
    assert config.history_root == paths.RESULTS_MOUNT and config.baseline_path is None
    assert config.results_dir == f"{paths.RESULTS_MOUNT}/default/release/1a2b3c4d"
    assert "historyRoot: /mnt/forge-replay/results" in config.to_yaml()
    objects = render(frj, OperatorSettings())
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]  # the claim (the history) is the user's
    assert "historyRoot" not in runtime_config(parse_job(debug_job()), OperatorSettings()).to_yaml()


def test_a_local_run_of_a_history_job_gets_a_folder_of_its_own(tmp_path, monkeypatch):
    from forge_replay.runtime.run_inputs import RunInputs, default_results_dir, history_root

    monkeypatch.chdir(tmp_path)
    frj = job()
    first = default_results_dir("release", frj.spec)
    assert re.fullmatch(r"results/release/run-\d{8}T\d{6}Z", first)
    Path(first).mkdir(parents=True)
    assert default_results_dir("release", frj.spec) == first + "-2"  # never a folder that exists
    assert default_results_dir("release", parse_job(debug_job()).spec) == "results/release"
    inputs = RunInputs(file="f", job=frj, dumps_root="d", results_dir="results/release/run-3", model_root=None)
    assert history_root(inputs) == str(tmp_path / "results" / "release")


# ------------------------------------------------------------------------------------------ the CLI


def test_report_history_and_untrust(root):
    listed = invoke("history", str(root))
    assert listed.exit_code == 0, listed.output
    text = " ".join(listed.output.split())
    assert "8 run(s), 6 trusted, 2 not" in text
    assert "its own expectations failed" in text and "marked untrusted by alice" in text
    report = root / "default/release/b2/report.json"
    before = report.read_bytes()
    marked = invoke("untrust", str(report), "--why", "driver 570 leaked memory", "--by", "bob")
    assert marked.exit_code == 0, marked.output
    assert report.read_bytes() == before  # report.json is never changed
    marker = json.loads((root / "default/release/b2" / UNTRUSTED_FILE).read_text())
    assert marker["by"] == "bob" and marker["why"] == "driver 570 leaked memory" and started_at(
        {"started_at": marker["at"]})
    assert " ".join(invoke("history", str(root)).output.split()).count("5 trusted, 3 not") == 1
    refs = references(read_runs(root), IDENTITY, 5, started_at({"started_at": "2026-12-10T10:00:00Z"}))
    assert "default/release/b2" not in [r.folder for r in refs.chosen]


@pytest.mark.parametrize("args, fragment", [
    (["untrust", "{root}/default", "--why", "x"], "not a run folder (it holds no report.json)"),
    (["untrust", "{root}/default/release/a1", "--why", " "], "--why"),
    (["history", "{root}/missing"], "cannot be read"),
])
def test_report_history_and_untrust_refuse_by_name(root, args, fragment):
    result = invoke(*[a.format(root=root) for a in args])
    assert result.exit_code == 2 and fragment in result.output, result.output


# ------------------------------------------------------------------------------------------ the walkthrough


def walkthrough() -> tuple[dict, list[str]]:
    """docs/gitops.md's "Trusted history on the results claim": its job spec and its commands, as written."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "gitops.md").read_text()
    section = doc[doc.index("#### Trusted history on the results claim"):]
    section = section[:section.index("\n### ")]
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))["spec"]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return spec, [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_history_walkthrough_runs_as_written(tmp_path, monkeypatch):
    """The history flow of docs/gitops.md on hand-made run folders: list, untrust, list, a baseline of trusted runs;
    then the doc's job in shadow (a regression recorded, not enforced) and enforced (the same regression fails)."""
    from forge_replay.cli import main
    from click.testing import CliRunner

    spec, commands = walkthrough()
    assert [c.split()[:3] for c in commands] == [["forge-replay", "report", "history"],
                                                 ["forge-replay", "report", "untrust"],
                                                 ["forge-replay", "report", "history"],
                                                 ["forge-replay", "report", "baseline"]]
    named = sorted({m for c in commands for m in re.findall(r"results/(default/[\w-]+/\w+)", c)})
    days = iter(range(1, 10))
    lay_out(tmp_path / "results", [(folder, run(next(days), (76.0 + i / 2, 74.0), env=GC_ON, job="release-memtest"),
                                    None) for i, folder in enumerate(named)])
    monkeypatch.chdir(tmp_path)
    outputs = []
    for command in commands:
        words = shlex.split(command)
        out = words[words.index(">") + 1] if ">" in words else None
        words = words[:words.index(">")] if out else words
        result = CliRunner().invoke(main, words[1:])
        assert result.exit_code == 0, (command, result.output)
        outputs.append(" ".join(result.output.split()))
        if out:
            Path(out).write_text(result.stdout)
    assert "3 trusted, 0 not" in outputs[0] and "2 trusted, 1 not" in outputs[2]
    assert yaml.safe_load(Path("history.yaml").read_text())["metadata"]["name"] == "release-history"

    doc = debug_job(metadata={"name": "release-memtest"})
    doc["spec"].update(spec)  # the doc's results and expect on a job of the one identity
    assert spec["expect"]["enforce"] is False  # shadow first
    regressed = run(10, (82.0, 74.0), env=GC_OFF, job="release-memtest")
    for enforce in (False, True):
        doc["spec"]["expect"]["enforce"] = enforce
        frj = parse_job(doc)
        checks, _ = verdict(regressed, frj.spec, None, "results", None)
        history = next(c for c in checks if c.name == "baseline.history")
        assert history.passed and "compared with the last 2 of 2 trusted run(s)" in history.message  # one untrusted
        peak = next(c for c in checks if c.name == "baseline.peak_reserved_gib.peakPerRank")
        assert not peak.passed and "trainer.gradient_checkpointing True -> False" in peak.message
        assert enforced(frj.spec.expect) is enforce  # shadow: recorded, the job succeeds; enforced: it fails
