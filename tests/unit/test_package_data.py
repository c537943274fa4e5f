"""Every data file of the forge_replay package ships in its wheel (and so in the operator and runtime images).

Found by the first real operator pod after backends/upstream_rules.json was added: pyproject's package-data did
not name it, the image's forge_replay had no such file, and the operator died importing forge_replay.api.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "forge_replay"


def test_every_data_file_of_the_package_is_named_in_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["forge_replay"]
    data = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "the package has data files (py.typed, the flag tables...)"
    missing = [path for path in data if not any(fnmatch.fnmatch(path, glob) for glob in globs)]
    assert not missing, f"not in pyproject's [tool.setuptools.package-data], so not in the wheel: {missing}"
