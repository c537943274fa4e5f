"""`forge-replay render FILE`: multi-document YAML for review, validate's messages for bad specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from forge_replay.commands.render import render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_render_examples_prints_every_object() -> None:
    assert EXAMPLES, "examples/ is empty"
    for example in EXAMPLES:
        result = CliRunner().invoke(render, [str(example), "--namespace", "team-a", "--runtime-image", "img:1"])
        assert result.exit_code == 0, result.output
        docs = [d for d in yaml.safe_load_all(result.output) if d]
        kinds = [d["kind"] for d in docs]
        assert kinds[-1] == "RayJob" and kinds[:2] == ["ConfigMap", "ConfigMap"]
        assert all(d["metadata"]["namespace"] == "team-a" for d in docs)
        assert all("ownerReferences" not in d["metadata"] for d in docs)
        config = yaml.safe_load(docs[0]["data"]["config.yaml"])  # a literal block, readable in diffs
        assert config["job"]["metadata"]["name"] == docs[-1]["metadata"]["name"]
        assert "config.yaml: |" in result.output


def test_render_invalid_spec_prints_what_validate_prints(tmp_path) -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    doc["spec"]["replay"]["numRollouts"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(render, [str(bad)])
    assert result.exit_code == 1
    validate = subprocess.run([sys.executable, "-m", "forge_replay.cli", "validate", str(bad)],
                              capture_output=True, text=True)
    assert validate.returncode == 1
    assert result.output.strip() == validate.stdout.strip()


def test_render_unreadable_file_exits_2(tmp_path) -> None:
    result = CliRunner().invoke(render, [str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert "missing.yaml" in result.output


def test_render_of_the_two_examples_on_one_claim_shows_different_results_folders() -> None:
    folders = {}
    for name in ("debug-replay.yaml", "forge-memtest-h200.yaml"):
        result = CliRunner().invoke(render, [str(REPO / "examples" / name), "--namespace", "team-a"])
        assert result.exit_code == 0, result.output
        docs = [d for d in yaml.safe_load_all(result.output) if d]
        config = yaml.safe_load(docs[0]["data"]["config.yaml"])
        assert config["job"]["spec"]["results"]["claimName"] == "forge-results"  # one claim for both
        folders[name] = config["resultsDir"]
    assert len(set(folders.values())) == 2, folders
    assert all(f.startswith("/mnt/forge-replay/results/team-a/") for f in folders.values())
