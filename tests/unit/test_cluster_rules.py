"""Cluster-only rules: forge mode needs a shared results volume when engines are in other pods."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.cluster_rules import cluster_problems, parse_job_for_cluster
from tests.unit.spec_factory import debug_job, forge_job


@pytest.mark.parametrize(
    "doc,refused",
    [
        (forge_job(), True),  # engines in their own pods, no results claim
        (forge_job(spec__results={"claimName": "shared"}), False),
        (forge_job(spec__rollout={"numGpus": 8, "numGpusPerEngine": 2, "colocate": True}), False),
        (forge_job(spec__rollout={"numGpus": 8, "numGpusPerEngine": 2, "colocate": True},
                   spec__trainer={"nodes": 2, "gpusPerNode": 8}), True),
        (debug_job(), False),
    ],
)
def test_forge_needs_a_shared_volume_when_engines_are_elsewhere(doc, refused):
    problems = cluster_problems(parse_job(doc).spec)
    assert bool(problems) == refused
    if refused:
        assert problems[0].path == "spec.results.claimName"
        with pytest.raises(SpecInvalid):
            parse_job_for_cluster(doc)
    else:
        assert parse_job_for_cluster(doc).metadata.name == "memtest"


def test_validate_notes_it_and_render_refuses_it(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(forge_job()))
    validate = subprocess.run([sys.executable, "-m", "forge_replay.cli", "validate", str(path)],
                              capture_output=True, text=True)
    assert validate.returncode == 0
    assert "note: in a cluster the operator refuses this spec: spec.results.claimName:" in validate.stdout
    render = subprocess.run([sys.executable, "-m", "forge_replay.cli", "render", str(path)],
                            capture_output=True, text=True)
    assert render.returncode == 1 and f"{path}: spec.results.claimName: required" in render.stderr
