"""The house's rules, read from the code as it is: floors, circles, string import targets and sizes.

`scripts/test` runs import-linter's contract (pyproject.toml, [tool.importlinter]) over the import statements; this
file checks what the contract cannot see or does not say: imports named in strings (the CLI's lazy command table,
the packages' lazy export tables, `python -m` lines and hook names) point down the same floors, no modules import
each other in a circle of any length (inside a floor too), and no module or function outgrows its limit.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "forge_replay"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100
DOTTED = re.compile(r"\bforge_replay(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _floors() -> list[list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[name.strip() for name in re.split(r"[|:]", layer)] for layer in contract["layers"]]


FLOORS = _floors()


def _floor(module: str) -> tuple[int, str] | None:
    """(height, the floor's package) of ``module``: 0 is the top floor."""
    for height, names in enumerate(FLOORS):
        for name in names:
            if module == name or module.startswith(name + "."):
                return height, name
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("forge_replay", include_external_packages=False)


def test_every_module_is_on_a_floor():
    homeless = [m for m in SOURCES if m != "forge_replay" and _floor(m) is None]
    assert not homeless, f"modules on no floor of pyproject's [tool.importlinter] layers: {homeless}"


def test_no_modules_import_each_other_in_a_circle(graph):
    # Tarjan's strongly connected components over the module graph (function-level imports included).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert not circles, f"modules that import each other (directly or round a circle): {circles}"


def _string_targets(path: Path) -> list[tuple[int, str]]:
    """(line, dotted forge_replay name) for each string constant of ``path`` that names a module of the package;
    docstrings are prose, not import targets."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and (body := node.body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for match in DOTTED.finditer(node.value):
                name = match.group(0)
                while name not in SOURCES and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in SOURCES and name != "forge_replay":
                    found.append((node.lineno, name))
    return found


def test_string_import_targets_point_down():
    upward = []
    for module, path in SOURCES.items():
        here = _floor(module)
        if here is None:
            continue
        for line, target in _string_targets(path):
            there = _floor(target)
            if there is None:
                continue
            if there[0] < here[0] or (there[0] == here[0] and there[1] != here[1]):
                upward.append(f"{path.relative_to(REPO)}:{line} names {target} ({there[1]} is not below {here[1]})")
    assert not upward, "string import targets that point up or across a floor:\n" + "\n".join(upward)


def test_no_module_over_its_limit():
    long = {str(p.relative_to(REPO)): n for p in SOURCES.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by what a reader looks for): {long}"


def test_no_function_over_its_limit():
    long = []
    for path in SOURCES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named phases): {long}"


def test_benches_use_only_the_package_public_names():
    private = []
    for path in sorted((REPO / "benches").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forge_replay"):
                private += [f"{path.name}:{node.lineno} {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_")]
    assert not private, f"benches import private names of forge_replay: {private}"
