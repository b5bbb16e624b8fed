"""Finding control-plane binaries: asset directories first, then the cache, else a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_devcluster import binaries
from dra_devcluster.binaries import BINARY_NAMES, BinariesUnavailable, ensure_binaries


def _fake_binaries(directory: Path, names: tuple[str, ...] = BINARY_NAMES) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(binaries.ASSETS_ENV, raising=False)
    monkeypatch.delenv(binaries.ENVTEST_ASSETS_ENV, raising=False)
    monkeypatch.setenv(binaries.CACHE_ENV, str(tmp_path / "cache"))


def test_asset_directory_wins_over_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_binaries(tmp_path / "assets")
    _fake_binaries(binaries.cache_dir() / "bin")
    monkeypatch.setenv(binaries.ASSETS_ENV, str(tmp_path / "assets"))
    found = ensure_binaries(allow_build=False)
    assert found.kube_apiserver == tmp_path / "assets" / "kube-apiserver"
    assert found.kubectl == tmp_path / "assets" / "kubectl"


def test_envtest_assets_are_completed_from_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # envtest ships etcd, kube-apiserver and kubectl only.
    _fake_binaries(tmp_path / "envtest", ("etcd", "kube-apiserver", "kubectl"))
    _fake_binaries(binaries.cache_dir() / "bin", ("kube-controller-manager", "kube-scheduler"))
    monkeypatch.setenv(binaries.ENVTEST_ASSETS_ENV, str(tmp_path / "envtest"))
    found = ensure_binaries(allow_build=False)
    assert found.etcd == tmp_path / "envtest" / "etcd"
    assert found.kube_scheduler == binaries.cache_dir() / "bin" / "kube-scheduler"


def test_missing_binaries_without_go_name_both_ways_to_provide_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BinariesUnavailable) as err:
        ensure_binaries()
    message = str(err.value)
    assert "no `go` on PATH" in message
    assert binaries.ASSETS_ENV in message
    assert binaries.ENVTEST_ASSETS_ENV in message
    assert "kube-scheduler" in message


def test_not_executable_files_are_not_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_binaries(tmp_path / "assets")
    (tmp_path / "assets" / "etcd").chmod(0o644)
    monkeypatch.setenv(binaries.ASSETS_ENV, str(tmp_path / "assets"))
    with pytest.raises(BinariesUnavailable, match="etcd"):
        ensure_binaries(allow_build=False)
