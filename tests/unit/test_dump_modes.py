"""`dumps verify` says when other users cannot read a dump (issue 18): runtime pods run as their own uid and read
dumps another uid wrote to a shared claim."""

from __future__ import annotations

import os

from click.testing import CliRunner

from forge_replay.cli import main
from forge_replay.dumps.synth import write_synth_dumps


def verify(root):
    return CliRunner().invoke(main, ["dumps", "verify", "--root", str(root), "--path", "sub/r_{rollout_id}.pt",
                                     "--num-rollouts", "3", "--json"])


def test_verify_names_dumps_and_folders_other_users_cannot_read(tmp_path):
    import json

    write_synth_dumps(str(tmp_path / "sub" / "r_{rollout_id}.pt"), 3, 1, 2, 4, 4)
    for path in [tmp_path, *tmp_path.rglob("*")]:  # the root, a claim's mount point, is on the way too
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert json.loads(verify(tmp_path).output)["notes"] == []

    os.chmod(tmp_path / "sub" / "r_1.pt", 0o600)  # what mkstemp wrote before the writers took the umask
    result = verify(tmp_path)
    assert result.exit_code == 0, result.output  # a note: the same uid (this verify) reads them
    notes = json.loads(result.output)["notes"]
    closed = f"1 dump(s) not readable by other users: {tmp_path / 'sub' / 'r_1.pt'} (0600);"
    assert len(notes) == 1 and closed in notes[0] and "cannot enter" not in notes[0] and "chmod o+r" in notes[0]

    os.chmod(tmp_path / "sub", 0o750)
    notes = json.loads(verify(tmp_path).output)["notes"]
    assert f"1 folder(s) other users cannot enter: {tmp_path / 'sub'} (0750)" in notes[0]
