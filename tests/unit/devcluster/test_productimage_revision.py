"""The product image of an older commit: its own tag, cache key and revision label, the commit's
tree (not the checkout's) as the source, and a clear error when the clone lacks the commit.

The expensive steps (pip wheels, mmdebstrap) are replaced by stand-ins; the rest of the build runs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dra_devcluster import binaries, ociarchive, productimage
from dra_devcluster.productimage import ImageBuildError, ensure_product_image, ensure_product_image_of

PYPROJECT = '[project]\nname = "accel-dra"\nversion = "{version}"\n'


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(binaries.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.invalid")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "--quiet")
    return path


def _sources(version: str, marker: str) -> dict[str, str]:
    return {
        "pyproject.toml": PYPROJECT.format(version=version),
        "README.md": "readme\n",
        "requirements.lock": "",
        "operator/dra_operator/__init__.py": f"MARKER = {marker!r}\n",
    }


def test_each_revision_has_its_own_tag_key_and_label(repo: Path) -> None:
    old = _commit(repo, _sources("0.1.0", "old"), "old")
    new = _commit(repo, _sources("0.1.0", "new"), "new")
    of_old = productimage._revision_inputs(repo, old)
    of_new = productimage._revision_inputs(repo, new)
    current = productimage._inputs(repo)

    assert of_old.tag == f"0.1.0-{old[:12]}"
    assert of_new.tag == f"0.1.0-{new[:12]}"
    # The checkout's own image keeps the plain version as its tag.
    assert current.tag == "0.1.0"
    assert len({of_old.key, of_new.key, current.key}) == 3
    assert len({productimage._image_path(i) for i in (of_old, of_new, current)}) == 3
    # A short sha names the same commit, so the same cached image.
    assert productimage._revision_inputs(repo, old[:7]) == of_old
    labels = productimage.image_config(inputs=of_old, arch="amd64")["config"]
    assert isinstance(labels, dict)
    assert labels["Labels"]["org.opencontainers.image.revision"] == old


def test_missing_revision_says_to_fetch_the_history(repo: Path) -> None:
    _commit(repo, _sources("0.1.0", "old"), "old")
    with pytest.raises(ImageBuildError, match=r"is not a commit of the repository .* fetch its history"):
        ensure_product_image_of("0123456789abcdef0123456789abcdef01234567", source=repo)


def test_shallow_clone_is_named_as_the_reason(repo: Path, tmp_path: Path) -> None:
    old = _commit(repo, _sources("0.1.0", "old"), "old")
    _commit(repo, _sources("0.1.0", "new"), "new")
    clone = tmp_path / "clone"
    clone_argv = ["git", "clone", "--quiet", "--depth=1", f"file://{repo}", str(clone)]
    subprocess.run(clone_argv, check=True, capture_output=True)
    expected = r"\(a shallow clone\): fetch its history \(git fetch --unshallow"
    with pytest.raises(ImageBuildError, match=expected):
        ensure_product_image_of(old, source=clone)


def test_revision_without_the_builders_files_is_refused(repo: Path) -> None:
    sources = _sources("0.0.9", "ancient")
    del sources["requirements.lock"]
    ancient = _commit(repo, sources, "ancient")
    with pytest.raises(ImageBuildError, match=r"has no requirements\.lock"):
        ensure_product_image_of(ancient, source=repo)


def test_build_uses_the_commits_tree_and_is_cached(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _commit(repo, _sources("0.0.9", "old"), "old")
    _commit(repo, {**_sources("0.1.0", "new"), "api/dra_api/__init__.py": ""}, "new")
    (repo / "operator/dra_operator/__init__.py").write_text("MARKER = 'uncommitted'\n")
    seen: list[tuple[Path, str, list[Path]]] = []

    def wheels(*, inputs: productimage._Inputs, work: Path, wheels: Path) -> None:
        marker = (inputs.source / "operator/dra_operator/__init__.py").read_text()
        seen.append((inputs.source, marker, productimage.source_files(inputs.source)))

    def rootfs(*, inputs: productimage._Inputs, wheels: Path, rootfs: Path) -> None:
        (rootfs / "etc").mkdir(parents=True)
        (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (rootfs / "etc/group").write_text("root:x:0:\n")
        (rootfs / "opt/accel-dra/bin").mkdir(parents=True)
        (rootfs / "opt/accel-dra/bin/dra-operator").write_text("")

    monkeypatch.setattr(productimage, "_wheels", wheels)
    monkeypatch.setattr(productimage, "_rootfs", rootfs)

    image = ensure_product_image_of(old, source=repo)
    assert not image.cached
    assert image.name == f"accel-dra:0.0.9-{old[:12]}"
    assert image.reference == f"docker.io/library/accel-dra:0.0.9-{old[:12]}"
    ((tree, marker, files),) = seen
    assert tree != repo
    assert not tree.exists(), "the exported tree outlives the build"
    assert marker == "MARKER = 'old'\n"
    # The old commit has no api/ folder: it just contributes nothing.
    assert [str(f) for f in files] == [
        "README.md",
        "operator/dra_operator/__init__.py",
        "pyproject.toml",
        "requirements.lock",
    ]
    config = ociarchive.read_image_archive(image.path)["config"]["config"]
    assert config["Labels"]["org.opencontainers.image.revision"] == old
    assert config["Labels"]["org.opencontainers.image.version"] == "0.0.9"

    again = ensure_product_image_of(old, source=repo)
    assert again.cached
    assert (again.path, again.manifest_digest) == (image.path, image.manifest_digest)
    assert len(seen) == 1
    # The checkout's own image (dirty, version 0.1.0) is another image beside it.
    current = ensure_product_image(source=repo)
    assert current.name == "accel-dra:0.1.0"
    assert current.path != image.path
