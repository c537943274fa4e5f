"""Single-layer OCI image archives written from local files (no registry, no image builder).

The real node needs two tiny images that are only a static binary or two: its pod sandbox (``pause``, built
from tests/cluster/go/pause) and a test image with a shell (busybox from Debian's ``busybox-static``). An
archive is an OCI image layout in a tar (``oci-layout``, ``index.json``, ``blobs/sha256/...``), the format
``ctr images import`` reads; the image name is the ``io.containerd.image.name`` annotation of the index.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def _tar_bytes(entries: dict[str, tuple[bytes, int]], symlinks: dict[str, str]) -> bytes:
    """A reproducible tar of ``path -> (content, mode)`` files and ``path -> target`` symlinks, with parents."""
    buffer = io.BytesIO()
    directories = sorted({str(Path(p).parent) for p in [*entries, *symlinks]} - {"."})
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        made: set[str] = set()
        for directory in directories:
            parts = Path(directory).parts
            for depth in range(1, len(parts) + 1):
                path = "/".join(parts[:depth])
                if path not in made:
                    info = tarfile.TarInfo(path)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
                    made.add(path)
        for path, (content, mode) in sorted(entries.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), mode
            archive.addfile(info, io.BytesIO(content))
        for path, target in sorted(symlinks.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            archive.addfile(info)
    return buffer.getvalue()


def _blob(archive: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode = len(data), 0o644
    archive.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def write_image(target: Path, name: str, files: dict[str, Path], entrypoint: list[str],
                symlinks: dict[str, str] | None = None, cmd: list[str] | None = None,
                user: str = "") -> Path:
    """Write an OCI archive of one layer holding ``files`` (image path -> local file, kept executable).

    ``name`` is the full reference (e.g. ``forge-replay.test/pause:local``); returns ``target``.
    """
    entries = {path.lstrip("/"): (source.read_bytes(), 0o755) for path, source in files.items()}
    layer_tar = _tar_bytes(entries, {p.lstrip("/"): t for p, t in (symlinks or {}).items()})
    layer = gzip.compress(layer_tar, mtime=0)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd or [], "User": user,
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_tar).hexdigest()}"]},
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    with tarfile.open(partial, mode="w") as archive:
        config_bytes = json.dumps(config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _blob(archive, config_bytes), "size": len(config_bytes)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": _blob(archive, layer), "size": len(layer)}],
        }
        manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
        index = {"schemaVersion": 2, "manifests": [{
            "mediaType": MEDIA_MANIFEST, "digest": _blob(archive, manifest_bytes), "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
        }]}
        for filename, content in (("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
                                  ("index.json", json.dumps(index, sort_keys=True).encode())):
            info = tarfile.TarInfo(filename)
            info.size, info.mode = len(content), 0o644
            archive.addfile(info, io.BytesIO(content))
    partial.replace(target)
    return target
