"""The product's images, built locally for the real node: no registry, no Docker engine.

    python -m tests.cluster images              # build what is missing (cached), print names and sizes
    python -m tests.cluster images --rebuild operator

Layers (each cached under ``<cache>/images/``, keyed by what it is built from):

1. ``python-base``: a Debian 12 root filesystem from Debian's packages (mmdebstrap) with python3, pip, bash,
   wget and passwd, added to an empty buildah image. Like the ``python:3.11-slim`` image the operator's
   Dockerfile names, its Python is the image's own (no EXTERNALLY-MANAGED marker) and ``python`` is python3.
2. ``runtime-base-cpu``: python-base plus the runtime's dependencies (torch, ray, transformers...) from PyPI:
   the CPU stand-in for the sglang image the runtime's Dockerfile starts from. Built once per machine (about
   6 GB unpacked: PyPI's torch carries CUDA libraries), again only when those requirement lines change.
3. ``operator`` and ``runtime``: ``images/operator/Dockerfile`` and ``images/runtime/Dockerfile`` as they are,
   with ``PYTHON_IMAGE`` / ``SGLANG_IMAGE`` pointing at the bases above and ``FORGE_REPLAY_EXTRAS=runtime``
   (a CPU build leaves sglang out). Rebuilt when the Dockerfile, pyproject.toml or operator/ change.
4. ``sglang-standin`` (TEST ONLY, scenario 4): the runtime image plus a stand-in ``sglang`` package whose
   ``python -m sglang.launch_server`` runs the sglang test double (tests/e2e/sglang_standin/launch_server.py,
   tests/doubles/), and sglang-router at the dev extra's pin: forge mode's own engine command, health checks,
   router and weight pushes run in pods, with the product's image and code paths unchanged. Rebuilt when the
   runtime image or those files change.
5. ``byo-standin`` (TEST ONLY, scenario 7): a team's trainer image as slime's look: the runtime base (Python,
   torch, Ray; no forge_replay: the job's init container brings it) with the stand-in ``train.py`` of tests/byo
   under ``/root/slime``, running as root. Rebuilt when the runtime base or that file change.

Builds run ``buildah build --network host --isolation chroot`` (nothing is created on the host's network)
with storage under the cache, each in a private mount namespace (no mount stays on the host). pip inside a
build trusts the host's CA bundle through read-only mounts that exist only while a RUN step runs: the
bundle and a pip.conf naming it (``cert``, what ``PIP_CERT`` sets), so neither's content ends up in a layer
(buildah leaves their two mount points as empty files). Images leave buildah as uncompressed OCI archives
that the node's containerd imports (node.RealNode.import_image).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import build

REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "forge-replay.test"
HOST_CA_BUNDLE = Path(os.environ.get("FORGE_REPLAY_BUILD_CA", "/etc/ssl/certs/ca-certificates.crt"))
BUILD_SECRETS_DIR = "/run/forge-replay-build"  # where the CA bundle and pip.conf are mounted during RUN
BASE_PACKAGES = ("python3", "python-is-python3", "python3-pip", "python3-venv", "wget", "ca-certificates", "passwd",
                 "procps")
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
RUNTIME_EXTRAS = "runtime"  # pyproject's extras a CPU runtime image installs (sglang needs CUDA)


class ImageBuildError(RuntimeError):
    """An image could not be built (the message has the tool's output)."""


@dataclass(frozen=True)
class Image:
    """A built image: its local name (``forge-replay.test/<name>:<key>``) and its OCI archive."""

    name: str
    reference: str
    archive: Path


def images_dir() -> Path:
    return build.cache_root() / "images"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _digest(*parts: bytes | str | Path) -> str:
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if part.is_dir() else [part]
            for file in files:
                digest.update(str(file.relative_to(REPO_ROOT) if file.is_relative_to(REPO_ROOT) else file).encode())
                digest.update(file.read_bytes())
        else:
            digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def _buildah(*args: str, timeout: float = 7200, log_path: Path | None = None) -> str:
    # In a private mount namespace with a fresh /run: buildah's storage mounts (its overlay directory, build
    # containers) and its run state end with the command instead of staying mounted on the host.
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"',
            "sh", "buildah", f"--root={images_dir() / 'buildah' / 'storage'}", "--runroot=/run/buildah",
            "--storage-driver=overlay", *args]
    started = time.monotonic()
    if log_path is not None:
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
        if result.returncode != 0:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
            raise ImageBuildError(f"buildah {args[0]} failed ({result.returncode}); log {log_path}:\n{tail}")
        return ""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise ImageBuildError(f"buildah {' '.join(args)} failed ({result.returncode}) after "
                              f"{time.monotonic() - started:.0f}s:\n{result.stderr[-4000:]}")
    return result.stdout


def _build_mounts() -> list[str]:
    """--volume flags: the host CA bundle and a pip.conf trusting it, read-only, during RUN steps only."""
    secrets = images_dir() / "build-secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    pip_conf = secrets / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {BUILD_SECRETS_DIR}/ca.crt\ndisable-pip-version-check = true\n")
    if not HOST_CA_BUNDLE.exists():
        raise ImageBuildError(f"no CA bundle at {HOST_CA_BUNDLE} (set FORGE_REPLAY_BUILD_CA)")
    return [f"--volume={HOST_CA_BUNDLE}:{BUILD_SECRETS_DIR}/ca.crt:ro",
            f"--volume={pip_conf}:/etc/pip.conf:ro"]


def _export(reference: str, archive: Path, log_path: Path) -> None:
    partial = archive.with_name(f".{archive.name}.partial")
    partial.unlink(missing_ok=True)
    _buildah("push", "--disable-compression", reference, f"oci-archive:{partial}:{reference}", log_path=log_path)
    partial.replace(archive)


def _have(reference: str) -> bool:
    out = _buildah("images", "--format", "{{.Name}}:{{.Tag}}")
    return reference in out.split()


def python_base(log_path: Path) -> str:
    """Debian 12 + python3 + pip (mmdebstrap), imported into buildah; returns its reference."""
    key = _digest(DEBIAN_SUITE, DEBIAN_MIRROR, " ".join(BASE_PACKAGES))
    reference = f"{REGISTRY}/python-base:{key}"
    if _have(reference):
        return reference
    tarball = images_dir() / f"python-base-{key}.tar"
    if not tarball.exists():
        _log(f"building the Debian base root filesystem ({', '.join(BASE_PACKAGES)}) with mmdebstrap ...")
        partial = tarball.with_name(f".{tarball.name}.partial.tar")
        # The image's Python is its own (as in python:3.11-slim): pip installs without PEP 668's refusal.
        hook = "rm -f $1/usr/lib/python3*/EXTERNALLY-MANAGED; rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*"
        with open(log_path, "ab") as log:
            result = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "mmdebstrap", "--mode=root", "--variant=apt",
                 f"--include={','.join(BASE_PACKAGES)}", f"--customize-hook={hook}", DEBIAN_SUITE, str(partial),
                 DEBIAN_MIRROR], stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise ImageBuildError(f"mmdebstrap failed ({result.returncode}); log {log_path}")
        partial.replace(tarball)
    container = _buildah("from", "scratch").strip()
    try:
        _buildah("add", container, str(tarball), "/")
        _buildah("config", "--cmd", "python3", "--env", "LANG=C.UTF-8", container)
        _buildah("commit", "--quiet", container, reference)
    finally:
        _buildah("rm", container)
    return reference


def runtime_requirements() -> list[str]:
    """pyproject's base dependencies and those of RUNTIME_EXTRAS: what the CPU runtime base installs."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return list(project["dependencies"]) + [d for extra in RUNTIME_EXTRAS.split(",") for d in extras[extra]]


def runtime_base(log_path: Path) -> str:
    """python-base + the runtime's dependencies from PyPI: the CPU stand-in for the sglang image.

    Keyed by the requirement lines themselves, so that an unrelated change to pyproject.toml (a dev tool, a
    pytest option) does not rebuild 6 GB of torch and ray."""
    base = python_base(log_path)
    requirements = "\n".join(runtime_requirements()) + "\n"
    key = _digest(base, requirements)
    reference = f"{REGISTRY}/runtime-base-cpu:{key}"
    if _have(reference):
        return reference
    _log("building the CPU runtime base (torch, ray, transformers from PyPI; about 15 minutes, once) ...")
    context = images_dir() / "runtime-base-context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    (context / "requirements.txt").write_text(requirements)
    (context / "Containerfile").write_text(
        f"FROM {base}\n"
        "COPY requirements.txt /tmp/requirements.txt\n"
        "RUN python3 -m pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt\n")
    _buildah("build", "--network=host", "--isolation=chroot", *_build_mounts(), "--layers=false",
             f"--tag={reference}", f"--file={context / 'Containerfile'}", str(context), log_path=log_path)
    return reference


def product_image(name: str, log_path: Path, rebuild: bool = False) -> Image:
    """images/<name>/Dockerfile built as it is, on the local CPU bases; cached by its inputs."""
    dockerfile = REPO_ROOT / "images" / name / "Dockerfile"
    if name == "operator":
        base = python_base(log_path)
        build_args = [f"--build-arg=PYTHON_IMAGE={base}"]
    elif name == "runtime":
        base = runtime_base(log_path)
        build_args = [f"--build-arg=SGLANG_IMAGE={base}", f"--build-arg=FORGE_REPLAY_EXTRAS={RUNTIME_EXTRAS}"]
    else:
        raise ImageBuildError(f"no images/{name}/Dockerfile")
    key = _digest(base, dockerfile, REPO_ROOT / "pyproject.toml", REPO_ROOT / "README.md", REPO_ROOT / "operator")
    reference = f"{REGISTRY}/{name}:{key}"
    archive = images_dir() / f"{name}-{key}.tar"
    if archive.exists() and not rebuild:
        return Image(name, reference, archive)
    if rebuild or not _have(reference):
        started = time.monotonic()
        _log(f"building {reference} from images/{name}/Dockerfile ...")
        _buildah("build", "--network=host", "--isolation=chroot", *_build_mounts(), "--layers=false",
                 *build_args, f"--tag={reference}", f"--file={dockerfile}", str(REPO_ROOT), log_path=log_path)
        _log(f"built {reference} in {time.monotonic() - started:.0f}s")
    _export(reference, archive, log_path)
    _prune(name, reference, archive)
    return Image(name, reference, archive)


STANDIN_DIR = "/opt/forge-replay-test"


def sglang_router_requirement() -> str:
    """The sglang-router pin of pyproject's dev extra (what the tests run the router with)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return next(d for d in project["optional-dependencies"]["dev"] if d.startswith("sglang-router"))


def sglang_standin_image(log_path: Path, rebuild: bool = False) -> Image:
    """TEST ONLY: the runtime image with ``python -m sglang.launch_server`` running the sglang test double and
    sglang-router installed (pip keeps every package of the runtime image at its version); cached by its inputs."""
    runtime = product_image("runtime", log_path)
    doubles = REPO_ROOT / "tests" / "doubles"
    launcher = REPO_ROOT / "tests" / "e2e" / "sglang_standin" / "launch_server.py"
    router = sglang_router_requirement()
    key = _digest(runtime.reference, doubles, launcher, router)
    reference = f"{REGISTRY}/sglang-standin:{key}"
    archive = images_dir() / f"sglang-standin-{key}.tar"
    if archive.exists() and not rebuild:
        return Image("sglang-standin", reference, archive)
    if not _have(runtime.reference):  # the runtime's archive was cached, buildah's copy not
        _buildah("pull", f"oci-archive:{runtime.archive}", log_path=log_path)
    context = images_dir() / "sglang-standin-context"
    shutil.rmtree(context, ignore_errors=True)
    (context / "doubles").mkdir(parents=True)
    for file in doubles.glob("*.py"):
        shutil.copy(file, context / "doubles" / file.name)
    shutil.copy(launcher, context / "launch_server.py")
    (context / "Containerfile").write_text(
        f"FROM {runtime.reference}\n"
        "USER 0:0\n"
        f"COPY doubles/ {STANDIN_DIR}/doubles/\n"
        f"COPY launch_server.py {STANDIN_DIR}/launch_server.py\n"
        "RUN site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') \\\n"
        "    && mkdir -p $site/sglang \\\n"
        "    && echo '\"\"\"TEST ONLY stand-in for sglang (tests/cluster/images.py): no engine.\"\"\"' \\\n"
        "       > $site/sglang/__init__.py \\\n"
        f"    && cp {STANDIN_DIR}/launch_server.py $site/sglang/launch_server.py \\\n"
        "    && python3 -m pip list --format=freeze > /tmp/constraints.txt \\\n"
        f"    && python3 -m pip install --no-cache-dir --constraint /tmp/constraints.txt '{router}' \\\n"
        "    && rm /tmp/constraints.txt \\\n"
        "    && python3 -c 'import sglang_router, importlib.util; assert importlib.util.find_spec(\"sglang\")'\n"
        "USER 10001:10001\n")
    started = time.monotonic()
    _log(f"building {reference} (TEST ONLY: the sglang stand-in over {runtime.reference}) ...")
    _buildah("build", "--network=host", "--isolation=chroot", *_build_mounts(), "--layers=false",
             f"--tag={reference}", f"--file={context / 'Containerfile'}", str(context), log_path=log_path)
    _log(f"built {reference} in {time.monotonic() - started:.0f}s")
    _export(reference, archive, log_path)
    _prune("sglang-standin", reference, archive)
    return Image("sglang-standin", reference, archive)


BYO_WORKING_DIR = "/root/slime"


def byo_standin_image(log_path: Path, rebuild: bool = False) -> Image:
    """TEST ONLY: a stand-in for a team's slime image: the CPU runtime base (Ray and torch as in our runtime image,
    forge_replay not installed) with tests/byo/train.py at ``BYO_WORKING_DIR``, as root; cached by its inputs."""
    base = runtime_base(log_path)
    script = REPO_ROOT / "tests" / "byo" / "train.py"
    key = _digest(base, script)
    reference = f"{REGISTRY}/byo-standin:{key}"
    archive = images_dir() / f"byo-standin-{key}.tar"
    if archive.exists() and not rebuild:
        return Image("byo-standin", reference, archive)
    context = images_dir() / "byo-standin-context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    shutil.copy(script, context / "train.py")
    (context / "Containerfile").write_text(
        f"FROM {base}\n"
        f"COPY train.py {BYO_WORKING_DIR}/train.py\n"
        "RUN python3 -c 'import ray, torch' && ! python3 -c 'import forge_replay' 2>/dev/null\n"
        f"WORKDIR {BYO_WORKING_DIR}\n")
    started = time.monotonic()
    _log(f"building {reference} (TEST ONLY: a stand-in slime image over {base}) ...")
    _buildah("build", "--network=host", "--isolation=chroot", "--layers=false", f"--tag={reference}",
             f"--file={context / 'Containerfile'}", str(context), log_path=log_path)
    _log(f"built {reference} in {time.monotonic() - started:.0f}s")
    _export(reference, archive, log_path)
    _prune("byo-standin", reference, archive)
    return Image("byo-standin", reference, archive)


def operator_next_image(log_path: Path, rebuild: bool = False) -> Image:
    """TEST ONLY: a second version of the operator image, for `helm upgrade` mid-run (e2e scenario 10): the operator
    image with another version label and a marker in its environment (``FORGE_REPLAY_IMAGE_GENERATION=next``), so
    it is another image (another ID) running the same code; cached by its inputs."""
    operator = product_image("operator", log_path)
    key = _digest(operator.reference, "next")
    reference = f"{REGISTRY}/operator-next:{key}"
    archive = images_dir() / f"operator-next-{key}.tar"
    if archive.exists() and not rebuild:
        return Image("operator-next", reference, archive)
    if not _have(operator.reference):  # the operator's archive was cached, buildah's copy not
        _buildah("pull", f"oci-archive:{operator.archive}", log_path=log_path)
    context = images_dir() / "operator-next-context"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    (context / "Containerfile").write_text(
        f"FROM {operator.reference}\n"
        "LABEL org.opencontainers.image.version=\"next\"\n"
        "ENV FORGE_REPLAY_IMAGE_GENERATION=next\n")
    _buildah("build", "--network=host", "--isolation=chroot", "--layers=false", f"--tag={reference}",
             f"--file={context / 'Containerfile'}", str(context), log_path=log_path)
    _export(reference, archive, log_path)
    _prune("operator-next", reference, archive)
    return Image("operator-next", reference, archive)


def _prune(name: str, reference: str, archive: Path) -> None:
    """Drop the older builds of an image (archives of GBs and buildah's copies): only the current one is used."""
    for old in images_dir().glob(f"{name}-*.tar"):
        if old != archive:
            old.unlink()
    repository = reference.rsplit(":", 1)[0]
    for other in _buildah("images", "--format", "{{.Name}}:{{.Tag}}").split():
        if other.rsplit(":", 1)[0] == repository and other != reference:
            _buildah("rmi", other)


def build_images(names: tuple[str, ...] = ("operator", "runtime"), rebuild: tuple[str, ...] = ()) -> list[Image]:
    """Build (or find cached) the product images; returns them with their archives."""
    if shutil.which("buildah") is None or shutil.which("mmdebstrap") is None:
        raise ImageBuildError("building images needs Debian's buildah and mmdebstrap "
                              "(apt-get install buildah mmdebstrap uidmap fuse-overlayfs)")
    images_dir().mkdir(parents=True, exist_ok=True)
    log_path = images_dir() / "build.log"
    test_only = {"sglang-standin": sglang_standin_image, "byo-standin": byo_standin_image,
                 "operator-next": operator_next_image}
    return [test_only[name](log_path, rebuild=name in rebuild) if name in test_only
            else product_image(name, log_path, rebuild=name in rebuild) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.images", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", default=["operator", "runtime"])
    parser.add_argument("--rebuild", action="append", default=[], help="rebuild this image even if cached")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        built = build_images(tuple(args.names), tuple(args.rebuild))
    except ImageBuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for image in built:
        print(f"{image.reference:<48} {image.archive.stat().st_size / 1024**3:6.2f} GiB  {image.archive}")
    print(f"total {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
