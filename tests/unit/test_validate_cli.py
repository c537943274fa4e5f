"""`forge-replay validate` exit codes and output, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.spec_factory import debug_job, forge_job

ROOT = Path(__file__).resolve().parents[2]


def run(*args, stdin=None):
    proc = subprocess.run([sys.executable, "-m", "forge_replay.cli", *args], input=stdin,
                          capture_output=True, text=True, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def write(tmp_path, name, *docs):
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_examples_validate():
    code, out = run("validate", *sorted(str(p) for p in (ROOT / "examples").glob("*.yaml")))
    assert code == 0, out


def test_invalid_job_exits_1_with_file_and_field(tmp_path):
    doc = forge_job(spec__rollout={"numGpus": 8, "numGpusPerEngine": 3})
    path = write(tmp_path, "bad.yaml", doc)
    code, out = run("validate", path)
    assert code == 1
    assert f"{path}: spec.rollout.numGpusPerEngine: must divide spec.rollout.numGpus" in out


def test_multi_document_files_name_the_document(tmp_path):
    path = write(tmp_path, "multi.yaml", forge_job(), debug_job(spec__replay__numRollouts=0))
    code, out = run("validate", path)
    assert code == 1
    assert f"{path}[0]: ok" in out and f"{path}[1]: spec.replay.numRollouts:" in out


def test_unreadable_not_yaml_and_other_kinds_exit_2(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    assert run("validate", missing)[0] == 2
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    code, out = run("validate", str(broken))
    assert code == 2 and "not valid YAML" in out
    other = write(tmp_path, "cm.yaml", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    code, out = run("validate", other)
    assert code == 2 and "not a ForgeReplayJob" in out
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert run("validate", str(empty))[0] == 2


def test_unusable_file_wins_over_invalid(tmp_path):
    bad = write(tmp_path, "bad.yaml", forge_job(spec__rollout=None))
    code, _ = run("validate", bad, str(tmp_path / "missing.yaml"))
    assert code == 2


def test_stdin(tmp_path):
    code, out = run("validate", "-", stdin=yaml.safe_dump(debug_job()))
    assert code == 0 and "-: ok" in out


def test_crd_command_prints_the_committed_crd():
    code, out = run("crd")
    assert code == 0
    assert out == (ROOT / "crds" / "forgereplayjobs.forgereplay.io.yaml").read_text()


def test_help_for_every_command():
    for command in ("validate", "crd"):
        code, out = run(command, "--help")
        assert code == 0 and "Usage:" in out


def test_every_problem_of_a_job_at_once(tmp_path):
    # A field error (numRollouts) used to hide the cross-field rules (pydantic runs them only on valid fields);
    # the API server lists its CEL rules' messages next to the schema's.
    doc = forge_job(spec__replay__numRollouts=0, spec__replay__dumps__path="/abs/rollout_{rollout_id}.pt",
                    spec__rollout={"numGpus": 8, "numGpusPerEngine": 3}, spec__trainer__nodes=0)
    path = write(tmp_path, "bad.yaml", doc)
    code, out = run("validate", path)
    assert code == 1
    for field in ("spec.replay.numRollouts", "spec.trainer.nodes", "spec.replay.dumps.path",
                  "spec.rollout.numGpusPerEngine: must divide"):
        assert f"{path}: {field}" in out, out


def test_a_rule_over_an_invalid_field_is_not_judged(tmp_path):
    # numGpusPerEngine is invalid itself: the divide rule cannot be judged and says nothing.
    doc = forge_job(spec__rollout={"numGpus": 8, "numGpusPerEngine": "3"})
    path = write(tmp_path, "bad.yaml", doc)
    code, out = run("validate", path)
    assert code == 1
    assert "spec.rollout.numGpusPerEngine: input should be a valid integer" in out
    assert "must divide" not in out and len(out.strip().splitlines()) == 1, out


def test_other_kinds_next_to_a_job_are_skipped_with_a_note(tmp_path):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    path = write(tmp_path, "gitops.yaml", cm, debug_job())
    code, out = run("validate", path)
    assert code == 0, out
    assert f"{path}[0]: skipped (kind ConfigMap, not a ForgeReplayJob)" in out and f"{path}[1]: ok" in out
    path = write(tmp_path, "gitops-bad.yaml", cm, debug_job(spec__replay__numRollouts=0))
    assert run("validate", path)[0] == 1
    code, out = run("validate", "-", stdin=yaml.safe_dump_all([cm, cm]))
    assert code == 2 and "not a ForgeReplayJob" in out
