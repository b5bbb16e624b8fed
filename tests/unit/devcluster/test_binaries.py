"""Finding control-plane binaries: asset directories first, then the cache, else a clear error; a
binary from an asset directory of another release than the chosen one is refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_devcluster import binaries
from dra_devcluster.binaries import (
    BINARY_NAMES,
    CONTAINERD_VERSION,
    HELM_VERSION,
    BinariesUnavailable,
    BinaryVersionMismatch,
    ensure_binaries,
    ensure_helm,
    ensure_node_binaries,
)
from dra_devcluster.versions import resolve


def _version_output(name: str, *, kubernetes: str, etcd: str) -> str:
    """What the real binary prints when asked for its version, as the cached builds print it."""
    if name == "etcd":
        return f"etcd Version: {etcd.lstrip('v')}\nGit SHA: Not provided\nGo Version: go1.26.8"
    if name == "kubectl":
        return (
            f'{{"clientVersion": {{"major": "1", "gitVersion": "{kubernetes}"}}, "kustomizeVersion": "v5"}}'
        )
    if name in ("containerd", "ctr"):
        return f"{name} github.com/containerd/containerd/v2 {CONTAINERD_VERSION} "
    if name == "containerd-shim-runc-v2":
        return f"containerd-shim-runc-v2:\n  Version:  {CONTAINERD_VERSION}\n  Revision: "
    if name == "helm":
        return f"{HELM_VERSION}+g0123abc"
    return f"Kubernetes {kubernetes}"


def _fake_binaries(
    directory: Path,
    names: tuple[str, ...] = BINARY_NAMES,
    *,
    kubernetes: str | None = None,
    etcd: str | None = None,
) -> None:
    """Scripts that answer the version question as the binaries of ``kubernetes`` (default: the
    chosen release) would."""
    chosen = resolve()
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        said = _version_output(name, kubernetes=kubernetes or chosen.version, etcd=etcd or chosen.etcd)
        path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{said}\nEOF\n")
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


def test_asset_binaries_of_the_chosen_release_are_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # etcd of another patch of the pinned minor is fine (envtest's archives carry their own).
    pinned = resolve().etcd
    _fake_binaries(tmp_path / "assets", etcd=pinned.rsplit(".", 1)[0] + ".99")
    monkeypatch.setenv(binaries.ASSETS_ENV, str(tmp_path / "assets"))
    found = ensure_binaries(allow_build=False)
    assert found.kube_apiserver == tmp_path / "assets" / "kube-apiserver"


@pytest.mark.parametrize("name", BINARY_NAMES)
def test_an_asset_binary_of_another_release_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    chosen = resolve()
    _fake_binaries(tmp_path / "envtest")
    _fake_binaries(tmp_path / "envtest", (name,), kubernetes="v1.30.0", etcd="v3.4.0")
    monkeypatch.setenv(binaries.ENVTEST_ASSETS_ENV, str(tmp_path / "envtest"))
    with pytest.raises(BinaryVersionMismatch) as err:
        ensure_binaries(allow_build=False)
    message = str(err.value)
    assert "\n" not in message
    if name == "etcd":
        said = f"3.4.0, not {_etcd_minor(chosen.etcd)} (the etcd of Kubernetes {chosen.version})"
    else:
        said = f"v1.30.0, not {chosen.version} (Kubernetes {chosen.version} was chosen)"
    env = binaries.ENVTEST_ASSETS_ENV
    assert message.startswith(
        f"{tmp_path / 'envtest' / name} (from ${env}) is version {said}: point {env} at "
    ), message


def _etcd_minor(version: str) -> str:
    return ".".join(version.lstrip("v").split(".")[:2]) + ".x"


def test_a_binary_that_cannot_say_its_version_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_binaries(tmp_path / "assets")
    (tmp_path / "assets" / "kube-scheduler").write_text("#!/bin/sh\necho unknown flag >&2\nexit 2\n")
    monkeypatch.setenv(binaries.ASSETS_ENV, str(tmp_path / "assets"))
    with pytest.raises(
        BinaryVersionMismatch, match=r"cannot tell the version of .*kube-scheduler.* exited 2"
    ):
        ensure_binaries(allow_build=False)


def test_node_binaries_and_helm_from_the_assets_are_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assets = tmp_path / "assets"
    node = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
    _fake_binaries(assets, (*node, "helm"))
    monkeypatch.setenv(binaries.ASSETS_ENV, str(assets))
    assert (
        ensure_node_binaries(allow_build=False).containerd_shim_runc_v2 == assets / "containerd-shim-runc-v2"
    )
    assert ensure_helm(allow_build=False) == assets / "helm"
    # A kubelet of another release, or a helm of another version, stops the run.
    _fake_binaries(assets, ("kubelet",), kubernetes="v1.30.0")
    with pytest.raises(
        BinaryVersionMismatch, match=r"kubelet \(from \$DRA_CONTROL_PLANE_ASSETS\) is version v1\.30\.0"
    ):
        ensure_node_binaries(allow_build=False)
    (assets / "helm").write_text("#!/bin/sh\necho v3.1.0+gabc\n")
    with pytest.raises(
        BinaryVersionMismatch, match=r"is version v3\.1\.0, not v3\.22\.0 \(the pinned helm\)"
    ):
        ensure_helm(allow_build=False)
