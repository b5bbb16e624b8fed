"""Deterministic OCI image layout archives from directory trees, without a container engine.

A layer is a tar of a directory tree written in sorted order with numeric owners only (no names
from this machine's passwd), modification times clamped to a fixed epoch, hard links kept as
links, and device nodes, sockets and fifos left out (the runtime provides ``/dev``). It is
gzip-compressed with a zero timestamp and no file name, so the same tree gives the same digest.
The archive itself (``oci-layout``, ``index.json``, ``blobs/sha256/...``) is what
``ctr images import`` and ``skopeo copy oci-archive:...`` read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """A compressed layer blob on disk: ``digest`` of the blob, ``diff_id`` of the plain tar."""

    path: Path
    digest: str
    diff_id: str
    size: int


@dataclass(frozen=True)
class TreeEntry:
    """One path of a layer: ``rel`` inside the image (no leading slash), taken from ``source``
    on disk, or the bytes ``content`` (a regular file, mode 0644, owned by root)."""

    rel: str
    source: Path | None = None
    content: bytes | None = None


def walk(root: Path, *, include: Sequence[str] = ("",), exclude: Sequence[str] = ()) -> Iterator[TreeEntry]:
    """Every path under ``root`` whose relative path is one of ``include`` or below it, and
    neither one of ``exclude`` nor below it, parents before children, siblings sorted by name
    (the order a layer must have to be the same twice)."""

    def wanted(rel: str) -> bool:
        inside = any(not top or rel == top or rel.startswith(top + "/") for top in include)
        above = any(top.startswith(rel + "/") for top in include if top)
        dropped = any(rel == ex or rel.startswith(ex + "/") for ex in exclude)
        return (inside or above) and not dropped

    def visit(directory: Path, prefix: str) -> Iterator[TreeEntry]:
        for name in sorted(os.listdir(directory)):
            rel = f"{prefix}{name}"
            if not wanted(rel):
                continue
            path = directory / name
            yield TreeEntry(rel=rel, source=path)
            if path.is_dir() and not path.is_symlink():
                yield from visit(path, rel + "/")

    yield from visit(root, "")


def _tarinfo(tar: tarfile.TarFile, entry: TreeEntry, *, mtime: int) -> tarfile.TarInfo | None:
    if entry.content is not None:
        info = tarfile.TarInfo(entry.rel)
        info.size, info.mode, info.mtime = len(entry.content), 0o644, mtime
        return info
    assert entry.source is not None
    mode = entry.source.lstat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        return None
    # gettarinfo records hard links to inodes already written as links (tar.inodes).
    info = tar.gettarinfo(str(entry.source), arcname=entry.rel)
    info.uname = info.gname = ""
    info.mtime = min(int(info.mtime), mtime)
    return info


def write_layer(entries: Iterator[TreeEntry], *, into: Path, mtime: int) -> Layer:
    """Write the entries as one gzip-compressed layer blob in directory ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    plain = into / "layer.tar.partial"
    with tarfile.open(plain, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = _tarinfo(tar, entry, mtime=mtime)
            if info is None:
                continue
            if entry.content is not None:
                tar.addfile(info, io.BytesIO(entry.content))
            elif info.isreg():
                with open(entry.source or "", "rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    diff_id = _sha256(plain)
    packed = into / "layer.tar.gz.partial"
    # No name and a zero timestamp in the gzip header: the blob depends on the tar alone.
    with (
        open(plain, "rb") as src,
        open(packed, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as out,
    ):
        shutil.copyfileobj(src, out, _CHUNK)
    plain.unlink()
    digest = _sha256(packed)
    final = into / f"{digest.removeprefix('sha256:')}.tar.gz"
    packed.rename(final)
    return Layer(path=final, digest=digest, diff_id=diff_id, size=final.stat().st_size)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(_CHUNK), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(
    *,
    path: Path,
    name: str,
    config: Mapping[str, Any],
    layers: Sequence[Layer],
    platform: Mapping[str, str],
) -> str:
    """Write an OCI layout archive of one image and return its manifest digest. ``config`` is the
    image configuration without ``rootfs`` (added here from the layers). ``name`` is the full
    reference containerd gives the image on import (``docker.io/library/accel-dra:0.1.0``)."""
    full_config = {**config, "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}}
    config_blob = _json(full_config)
    config_digest = "sha256:" + hashlib.sha256(config_blob).hexdigest()
    config_desc = {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config_blob)}
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config_desc,
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": x.digest, "size": x.size} for x in layers],
    }
    manifest_blob = _json(manifest)
    manifest_digest = "sha256:" + hashlib.sha256(manifest_blob).hexdigest()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": manifest_digest,
                "size": len(manifest_blob),
                "platform": dict(platform),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    small = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json(index),
        f"blobs/sha256/{config_digest.removeprefix('sha256:')}": config_blob,
        f"blobs/sha256/{manifest_digest.removeprefix('sha256:')}": manifest_blob,
    }
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for rel, data in small.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        for layer in layers:
            info = tarfile.TarInfo(f"blobs/sha256/{layer.digest.removeprefix('sha256:')}")
            info.size, info.mode, info.mtime = layer.size, 0o644, 0
            with open(layer.path, "rb") as blob:
                tar.addfile(info, blob)
    partial.rename(path)
    return manifest_digest


def read_image_archive(path: Path) -> dict[str, Any]:
    """The index, manifest and config of a one-image archive (for checks and reports)."""
    with tarfile.open(path) as tar:

        def blob(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None, f"{name} missing from {path}"
            return json.loads(member.read())

        index = blob("index.json")
        (descriptor,) = index["manifests"]
        manifest = blob(f"blobs/sha256/{descriptor['digest'].removeprefix('sha256:')}")
        config = blob(f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}")
    return {"index": index, "manifest": manifest, "config": config}
