"""Build the control plane's Go binaries from the wrapper modules under tests/cluster/go/.

Convention (see docs/cluster.md): every directory ``tests/cluster/go/<module>/`` is a Go module with a
committed go.mod and go.sum and a ``binaries.txt`` whose non-comment lines read

    <binary-name> <go-package> [extra -ldflags ...]

and optionally a ``files.txt`` whose lines read

    <name> <go-module-path> <sub-directory>

which copies a directory out of that module (as pinned by go.mod) into the build, e.g. KubeRay's CRDs.

A module whose folder holds a ``real-node.txt`` marker (kubelet, kube-proxy, CoreDNS, pause) belongs to the
real node of ``up --real-node`` / scripts/e2e: ``build`` leaves it out unless asked with ``real_node=True``
(``python -m tests.cluster build --real-node``), so what scripts/test builds and caches stays the control plane.

Builds land in ``<cache>/go/<module>/<key>/`` where ``<key>`` hashes the module's declaration files, so a
pin change gives a new folder and everything else is reused. ``<cache>/bin`` holds stable symlinks to the
current builds, for people (``export PATH=<cache>/bin:$PATH``) and for tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GO_MODULES_DIR = Path(__file__).resolve().parent / "go"
DECLARATION_FILES = ("go.mod", "go.sum", "binaries.txt", "files.txt")
REAL_NODE_MARKER = "real-node.txt"
BASE_LDFLAGS = "-s -w"


class BuildError(RuntimeError):
    """A binary could not be built (or the Go toolchain is missing)."""


class GoToolchainMissing(BuildError):
    """No usable ``go`` command: binaries that are not already built cannot be built."""


@dataclass(frozen=True)
class BinarySpec:
    """One binary a wrapper module declares in its binaries.txt."""

    name: str
    package: str
    extra_ldflags: str
    module: str


@dataclass(frozen=True)
class FilesSpec:
    """One directory a wrapper module exports from a pinned Go module (files.txt)."""

    name: str
    go_module: str
    subdir: str
    module: str


def cache_root() -> Path:
    """``${FORGE_REPLAY_CACHE:-$HOME/.cache/forge-replay}``."""
    configured = os.environ.get("FORGE_REPLAY_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "forge-replay"


def bin_dir() -> Path:
    """The stable folder of symlinks to the current builds (put it on PATH)."""
    return cache_root() / "bin"


def _declaration_lines(path: Path) -> list[tuple[int, list[str]]]:
    if not path.exists():
        return []
    lines = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.split("#", 1)[0].strip()
        if stripped:
            lines.append((number, shlex.split(stripped)))
    return lines


def parse_binaries(module_dir: Path) -> list[BinarySpec]:
    """Read ``binaries.txt`` of one wrapper module."""
    path = module_dir / "binaries.txt"
    specs = []
    for number, fields in _declaration_lines(path):
        if len(fields) < 2:
            raise BuildError(f"{path}:{number}: expected '<binary-name> <go-package> [ldflags...]', got {fields}")
        specs.append(BinarySpec(fields[0], fields[1], " ".join(fields[2:]), module_dir.name))
    return specs


def parse_files(module_dir: Path) -> list[FilesSpec]:
    """Read the optional ``files.txt`` of one wrapper module."""
    path = module_dir / "files.txt"
    specs = []
    for number, fields in _declaration_lines(path):
        if len(fields) != 3:
            raise BuildError(f"{path}:{number}: expected '<name> <go-module-path> <sub-directory>', got {fields}")
        specs.append(FilesSpec(fields[0], fields[1], fields[2], module_dir.name))
    return specs


def is_real_node_module(module_dir: Path) -> bool:
    """Whether a wrapper module builds a part of the real node (its folder holds ``real-node.txt``)."""
    return (module_dir / REAL_NODE_MARKER).exists()


def module_dirs(root: Path = GO_MODULES_DIR, real_node: bool = False) -> list[Path]:
    """Every wrapper module directory (one with a go.mod and a binaries.txt or files.txt).

    The real node's modules are included only with ``real_node=True``.
    """
    return sorted(
        d for d in root.iterdir()
        if d.is_dir() and (d / "go.mod").exists() and ((d / "binaries.txt").exists() or (d / "files.txt").exists())
        and (real_node or not is_real_node_module(d))
    )


def module_key(module_dir: Path) -> str:
    """Hash of what the build depends on: a new key (and folder) whenever a pin or a source changes.

    That is the declaration files, then every other file of the module's own folder (e.g. a tool's
    main.go or embedded data) except hidden files and Markdown notes.
    """
    digest = hashlib.sha256()
    for name in DECLARATION_FILES:
        path = module_dir / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"<absent>")
        digest.update(b"\0")
    for path in sorted(module_dir.rglob("*")):
        relative = path.relative_to(module_dir)
        if (not path.is_file() or relative.as_posix() in DECLARATION_FILES or path.suffix == ".md"
                or any(part.startswith(".") for part in relative.parts)):
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def module_build_dir(module_dir: Path) -> Path:
    return cache_root() / "go" / module_dir.name / module_key(module_dir)


def _catalogue(real_node: bool = True) -> tuple[dict[str, tuple[Path, BinarySpec]],
                                                 dict[str, tuple[Path, FilesSpec]]]:
    binaries: dict[str, tuple[Path, BinarySpec]] = {}
    files: dict[str, tuple[Path, FilesSpec]] = {}
    for directory in module_dirs(real_node=real_node):
        for spec in parse_binaries(directory):
            if spec.name in binaries or spec.name in files:
                raise BuildError(f"{spec.name!r} is declared twice (again in {directory})")
            binaries[spec.name] = (directory, spec)
        for fspec in parse_files(directory):
            if fspec.name in binaries or fspec.name in files:
                raise BuildError(f"{fspec.name!r} is declared twice (again in {directory})")
            files[fspec.name] = (directory, fspec)
    return binaries, files


def declared_names(real_node: bool = False) -> list[str]:
    """Names of every declared binary and exported file set, in module order (the real node's too if asked)."""
    binaries, files = _catalogue(real_node)
    return list(binaries) + list(files)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoToolchainMissing(
            "The Go toolchain ('go') is not on PATH, so the control-plane binaries cannot be built. "
            "Install Go >= 1.26 (https://go.dev/dl/) and run `python -m tests.cluster build`; "
            f"builds are cached under {cache_root()}."
        )
    return go


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The pins are the committed go.mod/go.sum; never switch toolchains or edit them during a build.
    env.update(CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-mod=readonly -buildvcs=false")
    return env


def _run_go(args: list[str], cwd: Path, what: str) -> str:
    result = subprocess.run([_go(), *args], cwd=cwd, env=_go_env(), capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(
            f"{what} failed in {cwd} (go {' '.join(args)}):\n{result.stderr.strip()[-4000:]}"
        )
    return result.stdout


def _link_into_bin(name: str, target: Path) -> None:
    bin_dir().mkdir(parents=True, exist_ok=True)
    link = bin_dir() / name
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    temporary = link.with_name(f".{name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    temporary.replace(link)


def _build_binary(directory: Path, spec: BinarySpec, target: Path, log) -> float:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial.{os.getpid()}")
    ldflags = f"{BASE_LDFLAGS} {spec.extra_ldflags}".strip()
    _go()  # a missing toolchain is reported before anything claims to be building
    log(f"building {spec.name:<24} ({spec.package} in tests/cluster/go/{spec.module}) ...")
    started = time.monotonic()
    try:
        _run_go(["build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), spec.package], directory,
                f"building {spec.name}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    elapsed = time.monotonic() - started
    log(f"built    {spec.name:<24} in {elapsed:6.1f}s -> {target}")
    return elapsed


def _export_files(directory: Path, spec: FilesSpec, target: Path, log) -> float:
    log(f"copying  {spec.name:<24} ({spec.go_module}/{spec.subdir}) ...")
    started = time.monotonic()
    _run_go(["mod", "download", spec.go_module], directory, f"downloading {spec.go_module}")
    module_root = Path(_run_go(["list", "-m", "-f", "{{.Dir}}", spec.go_module], directory,
                               f"locating {spec.go_module}").strip())
    source = module_root / spec.subdir
    if not source.is_dir():
        raise BuildError(f"{spec.go_module} has no directory {spec.subdir!r} (looked in {source}); fix "
                         f"tests/cluster/go/{spec.module}/files.txt")
    partial = target.with_name(f".{target.name}.partial.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    for path in partial.rglob("*"):  # the module cache is read-only; keep our copy removable
        path.chmod(0o755 if path.is_dir() else 0o644)
    partial.chmod(0o755)
    partial.replace(target)
    elapsed = time.monotonic() - started
    log(f"copied   {spec.name:<24} in {elapsed:6.1f}s -> {target}")
    return elapsed


def _default_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _build_lock(target: Path):
    """Serialise builders of one target across processes (several test sessions may start at once)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _default_log(f"waiting for another process that is building {target.name} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def binary_path(name: str, build: bool = True, log=_default_log) -> Path:
    """Path of the current build of a declared binary (or exported file set), building it if needed.

    Raises GoToolchainMissing when it is not built and Go is absent, BuildError when the build fails,
    KeyError when no wrapper module declares ``name``.
    """
    binaries, files = _catalogue()
    if name in binaries:
        directory, spec = binaries[name]
        target = module_build_dir(directory) / name
        if not target.exists():
            if not build:
                raise BuildError(f"{name} is not built; run `python -m tests.cluster build`")
            with _build_lock(target):
                if not target.exists():  # another process may have built it while we waited
                    _build_binary(directory, spec, target, log)
    elif name in files:
        directory, fspec = files[name]
        target = module_build_dir(directory) / name
        if not target.exists():
            if not build:
                raise BuildError(f"{name} is not exported; run `python -m tests.cluster build`")
            with _build_lock(target):
                if not target.exists():
                    _export_files(directory, fspec, target, log)
        return target  # file sets are not linked into bin/
    else:
        raise KeyError(f"no wrapper module under {GO_MODULES_DIR} declares {name!r}; declared: {declared_names()}")
    _link_into_bin(name, target)
    return target


def missing(real_node: bool = False) -> list[str]:
    """Declared names whose current build is absent (the real node's too if asked)."""
    binaries, files = _catalogue(real_node)
    absent = [n for n, (d, _) in binaries.items() if not (module_build_dir(d) / n).exists()]
    return absent + [n for n, (d, _) in files.items() if not (module_build_dir(d) / n).exists()]


def build_all(names: list[str] | None = None, log=_default_log, real_node: bool = False) -> dict[str, float]:
    """Build every declared binary (or only ``names``) that is missing; returns seconds per built name.

    Without ``names``, the real node's modules are built only with ``real_node=True``.
    """
    wanted = names or declared_names(real_node)
    todo = [n for n in wanted if n in set(missing(real_node=True))]
    timings: dict[str, float] = {}
    if todo:
        _go()  # fail early and clearly when Go is absent
    for index, name in enumerate(todo, start=1):
        started = time.monotonic()
        binary_path(name, log=lambda message: log(f"[{index}/{len(todo)}] {message}"))
        timings[name] = time.monotonic() - started
    for name in wanted:  # refresh the bin/ symlinks (and build anything whose pins changed meanwhile)
        binary_path(name, log=log)
    return timings


def cache_size_bytes(path: Path | None = None) -> int:
    """Bytes used under a folder (defaults to the whole forge-replay cache)."""
    root = path or cache_root()
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()) if root.exists() else 0
