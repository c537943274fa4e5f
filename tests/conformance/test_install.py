"""One sglang version for the whole project, installed without touching torch, and the data read from it."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from forge_replay.api.engine_args import option_table, server_args
from tests.doubles import real_sglang

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
IMPORTED = ("sglang.srt.server_args", "sglang.srt.managers.io_struct", "sglang.srt.entrypoints.http_server",
            "sglang.srt.utils")
"""The sglang modules the conformance tests and the double use (requirements.txt must make each importable)."""


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_the_pinned_version_is_installed_and_named_alike_everywhere():
    pinned = real_sglang.SGLANG_VERSION
    assert real_sglang.VERSION == pinned, "install it: pip install --no-deps -r tests/conformance/requirements.txt"
    assert requirement_pins()["sglang"] == pinned
    dockerfile = (REPO / "images" / "runtime" / "Dockerfile").read_text()
    assert re.search(rf"^ARG SGLANG_IMAGE=lmsysorg/sglang:v{re.escape(pinned)}-", dockerfile, re.M)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'^sglang = \["sglang>=0\.5\.19,<={re.escape(pinned)}"', pyproject, re.M)
    assert server_args()[0] == pinned, "regenerate the data: scripts/sglang-server-args"


def test_committed_server_argument_names_equal_the_installed_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert server_args()[1] == option_table(parser), "regenerate the data: scripts/sglang-server-args"


def test_every_package_sglang_loads_is_pinned_or_comes_with_forge_replay_dev():
    """requirements.txt is complete: a fresh machine (``.[dev]`` then this file, --no-deps) imports the same."""
    code = f"""
import importlib, sys, warnings
warnings.simplefilter("ignore")
from importlib import metadata
for name in {IMPORTED!r}:
    importlib.import_module(name)
dists = metadata.packages_distributions()
print("\\n".join(sorted({{d for m in list(sys.modules) for d in dists.get(m.split(".")[0], [])}})))
"""
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    closure, todo = set(), [("forge-replay", frozenset({"dev"}))]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in closure:
            continue
        closure.add((canonicalize_name(name), extras))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((requirement.name, frozenset(requirement.extras)))
    provided = {name for name, _ in closure} | {canonicalize_name(n) for n in requirement_pins()}
    # Loaded when present, never needed (optional imports inside try/except): measured by hiding each one.
    optional = {"colorama", "outcome", "rfc3339-validator", "trio"}
    missing = {canonicalize_name(d) for d in loaded.stdout.split()} - provided - optional
    assert not missing, f"add to tests/conformance/requirements.txt (pinned): {sorted(missing)}"
