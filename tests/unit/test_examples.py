"""The examples' comments say what the runtime does with them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from forge_replay.api import eval_path
from forge_replay.dumps.evals import eval_rollout_ids

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def test_eval_interval_comments_name_the_eval_dumps_read():
    # slime evaluates after rollout N when (N + 1) % evalInterval == 0 and reads eval_N
    # (THUDM/slime train.py, slime/utils/misc.py should_run_periodic_action at 624b824a).
    checked = 0
    for example in EXAMPLES:
        text = example.read_text()
        for doc in yaml.safe_load_all(text):
            replay = (doc or {}).get("spec", {}).get("replay", {})
            if not replay.get("evalInterval"):
                continue
            ids = eval_rollout_ids(replay.get("startRolloutId", 0), replay["numRollouts"], replay["evalInterval"])
            files = [eval_path(replay["dumps"]["path"], n) for n in ids]
            comment = re.search(r"evalInterval:.*#(.*)", text).group(1)
            named = re.findall(r"eval_(\d+)", comment)
            assert named and {int(n) for n in named} <= set(ids), (example.name, comment, files)
            assert files[0] in comment, (example.name, comment, files)
            checked += 1
    assert checked, "no example sets evalInterval"


def test_eval_interval_follows_slime():
    assert eval_rollout_ids(0, 8, 4) == [3, 7]
