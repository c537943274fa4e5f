"""The runtime config file round-trips exactly, None included (no results dir, no model volume)."""

from __future__ import annotations

import pytest
import yaml

from forge_replay.api import SpecInvalid, parse_job
from forge_replay.api.runtime_config import RuntimeConfig
from tests.unit.spec_factory import debug_job


@pytest.mark.parametrize("results_dir,model_root", [(None, None), ("/r", "/m")])
def test_round_trip(tmp_path, results_dir, model_root):
    config = RuntimeConfig(job=parse_job(debug_job()), results_dir=results_dir, model_root=model_root,
                           engine_command=None, progress_configmap="memtest-progress")
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert RuntimeConfig.from_file(path) == config


def test_errors_name_the_field(tmp_path):
    path = tmp_path / "config.yaml"
    doc = debug_job(spec__replay__numRollouts=0)
    path.write_text(yaml.safe_dump({"job": doc}))
    with pytest.raises(SpecInvalid) as info:
        RuntimeConfig.from_file(path)
    assert [p.path for p in info.value.problems] == ["job.spec.replay.numRollouts"]
    missing = tmp_path / "missing.yaml"
    with pytest.raises(SpecInvalid, match="cannot read runtime config"):
        RuntimeConfig.from_file(missing)
