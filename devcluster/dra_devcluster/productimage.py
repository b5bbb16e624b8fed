"""The product image (``accel-dra:<version>``) built without Docker and without a registry.

Steps, each failing with its name and output tail (:class:`ImageBuildError`):

1. wheels: the runtime dependencies of ``requirements.lock`` (``pip wheel --no-deps``, through
   this machine's pip configuration) and the project's own wheel, built from a copy of the
   tree's sources with the setuptools of the running Python (``--no-build-isolation``);
2. rootfs: ``mmdebstrap --variant=minbase`` of Debian bookworm from this machine's apt sources,
   with only python3, python3-venv and ca-certificates, no docs, man pages or locales; inside it a
   venv at ``/opt/accel-dra`` into which pip installs those wheels offline (``--no-index
   --no-deps``), checked with ``pip check``, after which pip and setuptools leave the venv;
3. layers: the Debian base (everything but the venv) and the application (the venv, and
   ``/etc/passwd``/``/etc/group`` with user and group ``nonroot`` 65532 added), each a
   deterministic tar (:mod:`dra_devcluster.ociarchive`);
4. the OCI archive: user 65532:65532, ``PATH`` starting with the venv, ``CMD ["dra-operator",
   "run"]``, ports 8080 and 8081, and the ``org.opencontainers.image.*`` labels (version from
   pyproject.toml, revision = git HEAD, ``-dirty`` when the image's inputs differ from it).

Reproducibility: ``SOURCE_DATE_EPOCH`` is HEAD's commit time (or the environment's). mmdebstrap
is reproducible with it given the same package versions; modification times are clamped to it;
no bytecode is written (``PYTHONDONTWRITEBYTECODE=1`` in the image, ``__pycache__`` removed).
What can still change between two builds of the same commit: the Debian packages, when the
mirror moved on (security updates), and the base layer with them; nothing else was seen to.

The result is cached under ``$XDG_CACHE_HOME/accel-dra/image/<key>/`` by a hash of everything
that goes into it (lock file, sources, this builder, revision, epoch), so tests reuse it.

Older revisions (:func:`ensure_product_image_of`, for tests that roll from one release to
another): the committed tree of a commit of the same repository, exported with ``git archive``
(the checkout and its ``.git`` stay untouched), built by this builder, not the commit's own;
revision = that commit, epoch = its commit time, and the reference
``accel-dra:<version>-<12 hex of the commit>``, so that it and the current tree's image (same
version) can sit in one containerd. Cached once per commit and builder, keyed by the commit
rather than a hash of the files, so a cached call reads no tree.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from dra_devcluster import ociarchive, prerequisites
from dra_devcluster.binaries import cache_root

log = logging.getLogger(__name__)

IMAGE_REPOSITORY = "accel-dra"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
VENV = "/opt/accel-dra"
USER_ID = 65532
DEFAULT_CMD = ("dra-operator", "run")
# What the image is made of: the package folders and the files pip needs to build the wheel.
SOURCE_FILES = ("pyproject.toml", "README.md", "requirements.lock")
SOURCE_DIRS = ("api", "operator", "node_agent", "devcluster")
# The length of the commit in an older revision's tag: fixed, unlike ``git rev-parse --short``.
SHORT_REVISION = 12
_SKIPPED_NAMES = ("__pycache__", ".mypy_cache", "build")
_DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Left out of the layers: the runtime mounts or provides these (mmdebstrap's /dev holds nodes).
_NOT_IN_LAYERS = ("dev", "proc", "sys", "run", "tmp")
_TAIL = 3000


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message names the step and ends with its output."""


@dataclass(frozen=True)
class ProductImage:
    """A built image: ``name`` as the manifests spell it, ``reference`` as containerd stores it."""

    name: str
    reference: str
    path: Path
    manifest_digest: str
    layer_digests: tuple[str, ...]
    cached: bool


def default_source() -> Path:
    """The checkout this module was installed from (editable installs, as the Makefile makes)."""
    return Path(__file__).resolve().parents[2]


def project_version(source: Path) -> str:
    version: str = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    return version


def _run(step: str, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    log.info("image build: %s", step)
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{step}: {exc.filename} not found ({_hint(argv[0])})") from None
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-_TAIL:]
        raise ImageBuildError(f"{step} failed (exit {result.returncode}):\n{output}")
    return result.stdout


def _hint(program: str) -> str:
    return (
        prerequisites.install_command([program]) if program == prerequisites.MMDEBSTRAP.name else "install it"
    )


def _git(source: Path, *args: str) -> str:
    return _run(f"git {' '.join(args)}", ["git", "-C", str(source), *args]).strip()


def source_files(source: Path) -> list[Path]:
    """The files the image is built from, sorted, relative to ``source``."""
    found = [Path(name) for name in SOURCE_FILES]
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(source / top):
            dirnames[:] = sorted(
                d for d in dirnames if d not in _SKIPPED_NAMES and not d.endswith(".egg-info")
            )
            rel = Path(dirpath).relative_to(source)
            found.extend(rel / name for name in filenames if not name.endswith(".pyc"))
    return sorted(found)


@dataclass(frozen=True)
class _Inputs:
    source: Path
    version: str
    # The image's tag: the version, and for an older revision its short commit too.
    tag: str
    revision: str
    epoch: int
    key: str
    # An older revision: ``source`` is the repository, and the build exports the commit from it.
    from_commit: bool = False


def _key(fields: list[object], *, source: Path, files: list[Path]) -> str:
    """The cache key: this builder's code, ``fields``, and the names and contents of ``files``."""
    h = hashlib.sha256()
    for builder in (Path(__file__), Path(ociarchive.__file__)):
        h.update(builder.read_bytes())
    h.update(json.dumps(fields).encode())
    for rel in files:
        h.update(f"\0{rel}\0".encode())
        h.update((source / rel).read_bytes())
    return h.hexdigest()[:20]


def _inputs(source: Path) -> _Inputs:
    files = source_files(source)
    revision = _git(source, "rev-parse", "HEAD")
    if _git(source, "status", "--porcelain", "--", *SOURCE_FILES, *SOURCE_DIRS):
        revision += "-dirty"
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or _git(source, "log", "-1", "--format=%ct", "HEAD"))
    key = _key([revision, epoch, SUITE, PACKAGES, sys.version_info[:2]], source=source, files=files)
    version = project_version(source)
    return _Inputs(
        source=source,
        version=version,
        tag=version,
        revision=revision,
        epoch=epoch,
        key=key,
    )


def resolve_revision(repository: Path, revision: str) -> str:
    """The full commit ``revision`` names in ``repository``; :class:`ImageBuildError` when it has
    no such commit (a shallow clone, or history not fetched)."""
    shallow = _git(repository, "rev-parse", "--is-shallow-repository") == "true"
    found = subprocess.run(
        [
            "git",
            "-C",
            str(repository),
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            f"{revision}^{{commit}}",
        ],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        why, fetch = ("a shallow clone", "git fetch --unshallow") if shallow else ("not fetched", "git fetch")
        raise ImageBuildError(
            f"revision {revision!r} is not a commit of the repository {repository} ({why}): fetch its "
            f"history ({fetch}, or git fetch origin {revision}) and try again"
        )
    return found.stdout.strip()


def _revision_inputs(repository: Path, revision: str) -> _Inputs:
    commit = resolve_revision(repository, revision)
    present = set(_git(repository, "ls-tree", "--name-only", commit).splitlines())
    # Package folders a commit lacks just contribute nothing; these files the build reads.
    missing = [name for name in SOURCE_FILES if name not in present]
    if missing:
        raise ImageBuildError(
            f"revision {commit} has no {', '.join(missing)}, which this builder builds from:"
            " it predates the layout the image is built from"
        )
    pyproject = _git(repository, "show", f"{commit}:pyproject.toml")
    version: str = tomllib.loads(pyproject)["project"]["version"]
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or _git(repository, "log", "-1", "--format=%ct", commit))
    # The commit fixes every source file, so it stands for them in the key: no tree to read.
    key = _key(["commit", commit, epoch, SUITE, PACKAGES, sys.version_info[:2]], source=repository, files=[])
    return _Inputs(
        source=repository,
        version=version,
        tag=f"{version}-{commit[:SHORT_REVISION]}",
        revision=commit,
        epoch=epoch,
        key=key,
        from_commit=True,
    )


def ensure_product_image(*, source: Path | None = None, rebuild: bool = False) -> ProductImage:
    """The image of the checkout ``source``: from the cache when its inputs are unchanged."""
    return _ensure(_inputs(source or default_source()), rebuild=rebuild)


def ensure_product_image_of(
    revision: str, *, source: Path | None = None, rebuild: bool = False
) -> ProductImage:
    """The image of the committed tree at ``revision`` (a commit of the repository ``source``, the
    checkout this module comes from by default), built by this builder: from the cache when built
    before. :class:`ImageBuildError` when the repository lacks the commit."""
    return _ensure(_revision_inputs(source or default_source(), revision), rebuild=rebuild)


def _image_path(inputs: _Inputs) -> Path:
    return cache_root() / "image" / inputs.key / f"{IMAGE_REPOSITORY}-{inputs.tag}.oci.tar"


def _ensure(inputs: _Inputs, *, rebuild: bool) -> ProductImage:
    path = _image_path(inputs)
    if path.is_file() and not rebuild:
        return _describe(path, inputs=inputs, cached=True)
    started = time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="accel-dra-image-") as tmp:
        work = Path(tmp)
        if inputs.from_commit:
            inputs = replace(inputs, source=_export(inputs.source, inputs.revision, into=work / "tree"))
        _build(inputs=inputs, work=work, path=path)
    log.info("image %s built in %.0f s: %s", path.name, time.monotonic() - started, path)
    return _describe(path, inputs=inputs, cached=False)


def _export(repository: Path, commit: str, *, into: Path) -> Path:
    """The commit's sources as files under ``into`` (``git archive``: no worktree to clean up)."""
    present = set(_git(repository, "ls-tree", "--name-only", commit).splitlines())
    paths = [name for name in (*SOURCE_FILES, *SOURCE_DIRS) if name in present]
    archive = into.with_name(into.name + ".tar")
    _run(
        f"git archive {commit[:SHORT_REVISION]}",
        [
            "git",
            "-C",
            str(repository),
            "archive",
            "--format=tar",
            f"--output={archive}",
            commit,
            "--",
            *paths,
        ],
    )
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def _describe(path: Path, *, inputs: _Inputs, cached: bool) -> ProductImage:
    parts = ociarchive.read_image_archive(path)
    (descriptor,) = parts["index"]["manifests"]
    return ProductImage(
        name=f"{IMAGE_REPOSITORY}:{inputs.tag}",
        reference=descriptor["annotations"]["io.containerd.image.name"],
        path=path,
        manifest_digest=descriptor["digest"],
        layer_digests=tuple(layer["digest"] for layer in parts["manifest"]["layers"]),
        cached=cached,
    )


def _build(*, inputs: _Inputs, work: Path, path: Path) -> None:
    wheels = work / "wheels"
    _wheels(inputs=inputs, work=work, wheels=wheels)
    rootfs = work / "rootfs"
    _rootfs(inputs=inputs, wheels=wheels, rootfs=rootfs)
    base = ociarchive.write_layer(
        ociarchive.walk(rootfs, exclude=(VENV.lstrip("/"), *_NOT_IN_LAYERS)),
        into=work / "layers",
        mtime=inputs.epoch,
    )
    passwd, group = _with_user(rootfs)
    app_entries = [
        ociarchive.TreeEntry(rel="etc", source=rootfs / "etc"),
        ociarchive.TreeEntry(rel="etc/group", content=group),
        ociarchive.TreeEntry(rel="etc/passwd", content=passwd),
        *ociarchive.walk(rootfs, include=(VENV.lstrip("/"),)),
    ]
    app = ociarchive.write_layer(iter(app_entries), into=work / "layers", mtime=inputs.epoch)
    arch = _run("dpkg --print-architecture", ["dpkg", "--print-architecture"]).strip()
    ociarchive.write_image_archive(
        path=path,
        name=f"docker.io/library/{IMAGE_REPOSITORY}:{inputs.tag}",
        config=image_config(inputs=inputs, arch=arch),
        layers=[base, app],
        platform={"architecture": arch, "os": "linux"},
    )


def _wheels(*, inputs: _Inputs, work: Path, wheels: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(
        "pip wheel of requirements.lock",
        [
            *pip,
            "wheel",
            "--quiet",
            "--no-deps",
            "-r",
            str(inputs.source / "requirements.lock"),
            "-w",
            str(wheels),
        ],
    )
    # A copy of exactly the hashed sources, so stray build/ or egg-info folders never get in.
    tree = work / "src"
    for rel in source_files(inputs.source):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(inputs.source / rel, tree / rel)
    _run(
        "pip wheel of the project",
        [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(tree)],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(inputs.epoch)},
    )


def apt_sources() -> list[str]:
    """This machine's apt source files (mmdebstrap pastes each into the image's sources)."""
    found = [Path("/etc/apt/sources.list")] if Path("/etc/apt/sources.list").is_file() else []
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    return [
        str(p)
        for p in found
        if any(line.strip() and not line.startswith("#") for line in p.read_text().splitlines())
    ]


def _rootfs(*, inputs: _Inputs, wheels: Path, rootfs: Path) -> None:
    # The chroot gets a clean environment: this machine's PIP_* settings point at its own paths.
    install = " && ".join(
        (
            f"python3 -m venv {VENV}",
            f"{VENV}/bin/pip install --quiet --no-index --no-deps --no-cache-dir --no-compile"
            " /tmp/wheels/*.whl",
            f"{VENV}/bin/pip check",
            f"{VENV}/bin/pip uninstall --quiet --yes pip setuptools",
        )
    )
    chroot = f'chroot "$1" env -i PATH={_PATH} PYTHONDONTWRITEBYTECODE=1 HOME=/root sh -ec "{install}"'
    cleanup = (
        'rm -rf "$1/tmp/wheels" "$1/etc/resolv.conf" "$1/etc/hostname" "$1/root/.cache"'
        ' "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old'
        ' && find "$1" -xdev -name __pycache__ -prune -exec rm -rf {} +'
    )
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in _DPKG_EXCLUDES),
        f"--customize-hook=copy-in {wheels} /tmp",
        f"--customize-hook={chroot}",
        f"--customize-hook={cleanup}",
        SUITE,
        str(rootfs),
        *apt_sources(),
    ]
    _run("mmdebstrap (Debian base, venv)", argv, env={**os.environ, "SOURCE_DATE_EPOCH": str(inputs.epoch)})


def _with_user(rootfs: Path) -> tuple[bytes, bytes]:
    """/etc/passwd and /etc/group with ``nonroot`` (65532) added, as the Dockerfile's useradd does,
    written directly: useradd would also stamp /etc/shadow with today's date."""
    passwd = (rootfs / "etc/passwd").read_bytes()
    group = (rootfs / "etc/group").read_bytes()
    passwd += f"nonroot:x:{USER_ID}:{USER_ID}:nonroot:/nonexistent:/usr/sbin/nologin\n".encode()
    group += f"nonroot:x:{USER_ID}:\n".encode()
    return passwd, group


def image_config(*, inputs: _Inputs, arch: str) -> dict[str, object]:
    created = datetime.datetime.fromtimestamp(inputs.epoch, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "org.opencontainers.image.title": IMAGE_REPOSITORY,
        "org.opencontainers.image.version": inputs.version,
        "org.opencontainers.image.revision": inputs.revision,
        # No org.opencontainers.image.source: the project has no public URL, and a clone's
        # remote.origin.url is often a local folder, which says nothing to whoever runs the image.
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.base.name": f"debian:{SUITE} (mmdebstrap minbase)",
    }
    return {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {
            "User": f"{USER_ID}:{USER_ID}",
            "Env": [f"PATH={_PATH}", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
            "Cmd": list(DEFAULT_CMD),
            "WorkingDir": "/",
            "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}},
            "Labels": labels,
        },
        "history": [
            {
                "created": created,
                "created_by": f"mmdebstrap --variant=minbase {SUITE} ({' '.join(PACKAGES)})",
            },
            {"created": created, "created_by": f"venv {VENV}: requirements.lock and the accel-dra wheel"},
        ],
    }
