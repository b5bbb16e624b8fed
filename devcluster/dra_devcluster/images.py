"""Container images built on this machine, so that real nodes need no registry.

Each image is one layer holding Debian's static busybox (package ``busybox-static``) and links for
the applets workloads use, written as an OCI image layout archive that ``ctr images import`` takes:

- the workload image (:data:`WORKLOAD_IMAGE`): what the examples and tests run (``sh``, ``env``,
  ``ls``, ``sleep``, ..., and a ``bash`` that hands its script to ``sh``);
- the sandbox image (:data:`SANDBOX_IMAGE`): the pod's "pause" process, pinned in containerd's config;
- the vector-add stand-in (:data:`VECTOR_ADD_IMAGE`): for pods written with no command of their own,
  as the device plugin guide's ``example-vector-add`` is; by default it lists the GPUs it was given
  (``nvidia-smi -L``, answered on a simulated node by the stand-in its CDI spec mounts) and prints
  ``Test PASSED``, where the real sample would add two vectors on the GPU.

The archives are deterministic (fixed timestamps and owners), so their digests only change with
busybox itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from dra_devcluster import prerequisites

WORKLOAD_IMAGE = "registry.local/accel-dra/busybox:1"
SANDBOX_IMAGE = "registry.local/accel-dra/pause:1"
VECTOR_ADD_IMAGE = "registry.local/accel-dra/example-vector-add:1"
_APPLETS = (
    "sh", "env", "printenv", "ls", "cat", "echo", "sleep", "grep", "head", "tail", "true", "false",
    "test", "id", "hostname", "ps", "date", "mkdir", "touch", "wc", "sort", "tr", "cut",
)  # fmt: skip
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageUnavailable(RuntimeError):
    """The images cannot be built here (busybox-static is not installed)."""


@dataclass(frozen=True)
class ImageArchive:
    name: str
    path: Path


def busybox() -> Path:
    found = prerequisites.locate(prerequisites.BUSYBOX)
    if found is None:
        install = prerequisites.install_command([prerequisites.BUSYBOX.name])
        raise ImageUnavailable(f"building the local images needs a static busybox: {install}")
    return Path(found)


def _layer(binary: bytes) -> bytes:
    """An uncompressed tar layer: /bin/busybox and a link per applet."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755, 0
            tar.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(binary), 0o755, 0
        tar.addfile(info, io.BytesIO(binary))
        for applet in _APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, 0
            tar.addfile(link)
        for name, text in (("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", b"root:x:0:\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(text), 0o644, 0
            tar.addfile(info, io.BytesIO(text))
        # The examples run `bash -c ...`; busybox has no bash applet, its sh runs those scripts.
        script = b'#!/bin/sh\nexec /bin/sh "$@"\n'
        info = tarfile.TarInfo("bin/bash")
        info.size, info.mode, info.mtime = len(script), 0o755, 0
        tar.addfile(info, io.BytesIO(script))
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def write_archive(*, name: str, entrypoint: list[str], cmd: list[str], into: Path) -> ImageArchive:
    """Write the OCI layout archive of image ``name`` into directory ``into``."""
    layer = _layer(busybox().read_bytes())
    blobs: dict[str, bytes] = {}
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [f"PATH={_PATH}"], "Entrypoint": entrypoint or None, "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **_blob(blobs, json.dumps(config, sort_keys=True).encode()),
    }
    manifest = {"schemaVersion": 2, "mediaType": _MANIFEST, "config": config_desc, "layers": [layer_desc]}
    manifest_desc = {"mediaType": _MANIFEST, **_blob(blobs, json.dumps(manifest, sort_keys=True).encode())}
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}, sort_keys=True).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()},
    }
    into.mkdir(parents=True, exist_ok=True)
    path = into / (name.rsplit("/", 1)[1].replace(":", "-") + ".oci.tar")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return ImageArchive(name=name, path=path)


def build_images(into: Path) -> list[ImageArchive]:
    """The workload, vector-add stand-in and sandbox images, as archives in ``into``."""
    return [
        write_archive(name=WORKLOAD_IMAGE, entrypoint=[], cmd=["sh"], into=into),
        write_archive(
            name=VECTOR_ADD_IMAGE,
            entrypoint=[],
            cmd=["sh", "-c", "nvidia-smi -L && echo Test PASSED"],
            into=into,
        ),
        # PID 1 of the sandbox only has to stay; kubelet stops it with SIGKILL.
        write_archive(name=SANDBOX_IMAGE, entrypoint=["/bin/sleep", "2147483647"], cmd=[], into=into),
    ]
