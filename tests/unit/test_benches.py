"""The benches refuse bad options up front, naming the option (argparse's exit 2), never with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    ("bench_dump_load.py", ["--workdir", "{missing}"], "argument --workdir: no such folder"),
    ("bench_dump_load.py", ["--workdir", "{file}"], "argument --workdir: not a folder"),
    ("bench_dump_load.py", ["--repeats", "0"], "argument --repeats: must be an integer >= 1 (got '0')"),
    ("bench_dump_load.py", ["--json", "{missing}/out.json"], "argument --json: no such folder"),
    ("bench_packed_attention.py", ["--tokens", "4", "--samples", "8"], "--tokens must be at least --samples"),
    ("bench_trainer.py", ["--rollouts", "-1"], "argument --rollouts: must be an integer >= 1"),
    ("bench_weight_sync.py", ["--paths", "disk,tensor"], "argument --paths: expected a comma-separated list"),
    ("gpu_memory_peak.py", ["--out", "{file}/results"], "argument --out: cannot create"),
    ("gpu_check.py", ["--steps", "zero"], "argument --steps: must be an integer >= 1 (got 'zero')"),
    ("bench_operator.py", ["--burst", "0"], "argument --burst: must be an integer >= 1"),
    ("bench_sweep.py", ["--micro-batch", "512,256"], "argument --micro-batch: expected strictly increasing integers"),
    ("bench_sweep.py", ["--stretch", "128"], "argument --stretch: every value must be >= --prompt-len"),
]


@pytest.mark.parametrize("script,args,message", CASES, ids=[f"{c[0]}{' '.join(c[1])}" for c in CASES])
def test_bad_option_is_named(tmp_path, script, args, message):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = [a.format(missing=tmp_path / "missing", file=a_file) for a in args]
    done = subprocess.run([sys.executable, str(ROOT / "benches" / script), *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
