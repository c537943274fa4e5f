"""The builtin trainer's conversion of VLM samples (issue 14): it trains their tokens and counts the samples whose
multimodal inputs it ignored, which the run says once and the report counts (tests/unit/test_report.py)."""

from __future__ import annotations

from forge_replay.dumps import load
from forge_replay.dumps.convert import Conversion
from tests.doubles import upstream_types as up


def test_the_builtin_conversion_trains_a_vlm_samples_tokens_and_counts_its_images(tmp_path):
    path = tmp_path / "rollout_0.pt"
    with up.upstream_modules():
        dicts = up.vlm_sample_dicts(4)
        up.vlm_dump(path, 0, dicts)
    data = Conversion()(load(path).samples)
    assert data.tokens == [d["tokens"] for d in dicts] and data.multimodal_ignored == 4
    text_only = load(path).samples
    for sample in text_only[:3]:  # a VLM dump's text-only samples: an empty multimodal dict counts as none
        sample.multimodal_inputs = {"images": None, "videos": None}
        sample.multimodal_train_inputs = None
    assert Conversion()(text_only).multimodal_ignored == 1
