"""The supported Kubernetes versions: choosing one, and what the cluster does differently on each.

The gate facts in :mod:`dra_devcluster.versions` were read in each release's
``pkg/features/kube_features.go``; these tests hold the cluster's choices to those facts, and each
version's Go wrapper module to the table.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from dra_devcluster import binaries, versions
from dra_devcluster.cluster import LocalCluster, _check_kubelet_skew
from dra_devcluster.versions import (
    DEFAULT,
    SUPPORTED,
    UPCOMING,
    VERSION_ENV,
    KubernetesVersion,
    UnsupportedVersion,
    resolve,
)
from dra_operator.allocator.gates import RELEASE_DEFAULTS, kubernetes_minor

GOMOD = Path(versions.__file__).parent / "gomod"
REPO_ROOT = Path(__file__).resolve().parents[3]
IDS = [v.minor for v in SUPPORTED]
# The gate tables: the supported releases' and those read in a development branch.
TABLES = SUPPORTED + UPCOMING
TABLE_IDS = [v.minor for v in TABLES]


def test_the_supported_versions_and_the_default() -> None:
    assert [v.version for v in SUPPORTED] == ["v1.34.12", "v1.35.8", "v1.36.3", "v1.37.2"]
    assert [v.etcd for v in SUPPORTED] == ["v3.6.4", "v3.6.5", "v3.6.8", "v3.7.0"]
    # The default moves to 1.37 only after the whole suite has run on it.
    assert DEFAULT.version == "v1.37.2"


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("1.34", "v1.34.12"),
        ("v1.34", "v1.34.12"),
        ("1.34.x", "v1.34.12"),
        ("v1.35.x", "v1.35.8"),
        ("1.35.8", "v1.35.8"),
        ("v1.37.2", "v1.37.2"),
        (" 1.37 ", "v1.37.2"),
    ],
)
def test_a_request_names_its_entry(requested: str, expected: str) -> None:
    assert resolve(requested, environ={}).version == expected


def test_the_argument_wins_over_the_environment_which_wins_over_the_default() -> None:
    assert resolve("1.34", environ={VERSION_ENV: "1.37"}).version == "v1.34.12"
    assert resolve(None, environ={VERSION_ENV: "1.37"}).version == "v1.37.2"
    assert resolve("", environ={VERSION_ENV: "v1.35.x"}).version == "v1.35.8"
    assert resolve(None, environ={}) is DEFAULT
    assert resolve(None, environ={VERSION_ENV: "  "}) is DEFAULT


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VERSION_ENV, "1.34")
    assert resolve().version == "v1.34.12"
    monkeypatch.delenv(VERSION_ENV)
    assert resolve() is DEFAULT


@pytest.mark.parametrize(
    "requested", ["1.33", "1.38", "v1.34.11", "1.36.4", "latest", "1", "1.36.3.1", "v2.36"]
)
def test_an_unsupported_version_is_an_error_listing_the_supported_ones(requested: str) -> None:
    with pytest.raises(UnsupportedVersion) as err:
        resolve(requested, environ={})
    message = str(err.value)
    assert repr(requested) in message
    assert "v1.34.12, v1.35.8, v1.36.3, v1.37.2 (default)" in message
    assert VERSION_ENV not in message  # it came from the argument


def test_an_unsupported_version_from_the_environment_says_where_it_came_from() -> None:
    with pytest.raises(UnsupportedVersion, match=rf"^{VERSION_ENV}='1.30' is not a supported"):
        resolve(None, environ={VERSION_ENV: "1.30"})


# ---- feature gates -------------------------------------------------------------------------------


@pytest.mark.parametrize("kubernetes", TABLES, ids=TABLE_IDS)
def test_every_named_gate_exists_in_its_version_and_is_not_locked(kubernetes: KubernetesVersion) -> None:
    for name in kubernetes.feature_gates:
        gate = kubernetes.upstream_gates.get(name)
        assert gate is not None, f"{kubernetes}: {name} does not exist; the component would refuse it"
        assert not gate.locked, f"{kubernetes}: {name} is locked; naming it is an error or a warning"
        assert gate.stage == "beta", f"{kubernetes}: {name} is {gate.stage}"


@pytest.mark.parametrize("kubernetes", TABLES, ids=TABLE_IDS)
def test_every_beta_gate_is_on_unless_a_reason_is_given(kubernetes: KubernetesVersion) -> None:
    beta = {name for name, gate in kubernetes.upstream_gates.items() if gate.stage == "beta"}
    assert set(kubernetes.gates_left_at_default) <= beta
    assert set(kubernetes.feature_gates) == beta - set(kubernetes.gates_left_at_default)
    assert all(kubernetes.feature_gates.values())


@pytest.mark.parametrize("kubernetes", TABLES, ids=TABLE_IDS)
def test_every_gate_a_named_gate_needs_is_on(kubernetes: KubernetesVersion) -> None:
    for name in kubernetes.feature_gates:
        for needed in kubernetes.gate_dependencies.get(name, ()):
            assert kubernetes.gate_enabled(needed), f"{kubernetes}: {name} needs {needed}, which is off"
    # Why DRAWorkloadResourceClaims stays at its default: GenericWorkload is not a DRA gate, and off.
    if "DRAWorkloadResourceClaims" in kubernetes.gate_dependencies:
        assert not kubernetes.gate_enabled("GenericWorkload")
        assert "DRAWorkloadResourceClaims" not in kubernetes.feature_gates


def test_on_1_37_no_ga_locked_gate_is_named() -> None:
    v1_37 = resolve("1.37", environ={})
    for name in (
        "DRAExtendedResource",
        "DRAPrioritizedList",
        "DRAResourceClaimDeviceStatus",
        "DRAAdminAccess",
    ):
        assert v1_37.upstream_gates[name].locked
        assert name not in v1_37.feature_gates
        assert v1_37.gate_enabled(name)
    # GA in 1.37, not locked, on by default: not named either, and on.
    assert "DRADeviceTaintRules" not in v1_37.feature_gates
    assert v1_37.gate_enabled("DRADeviceTaintRules")
    assert set(v1_37.gates_left_at_default) == {"DRAWorkloadResourceClaims", "DRAFractionalCapacityRange"}


def test_1_36_names_the_gates_the_cluster_always_named() -> None:
    """The set before versions were selectable; a 1.36 cluster is unchanged by them."""
    assert dict(resolve("1.36", environ={}).feature_gates) == dict.fromkeys(
        [
            "DRAConsumableCapacity",
            "DRADeviceBindingConditions",
            "DRADeviceTaintRules",
            "DRADeviceTaints",
            "DRAExtendedResource",
            "DRAPartitionableDevices",
            "DRAResourceClaimDeviceStatus",
            "DRAResourceClaimGranularStatusAuthorization",
            "DRASchedulerFilterTimeout",
            "ResourceHealthStatus",
            "ResourceHealthStatusMessage",
        ],
        True,
    )


@pytest.mark.parametrize("minor", ["1.34", "1.35"])
def test_before_1_36_gates_that_came_later_are_not_named(minor: str) -> None:
    kubernetes = resolve(minor, environ={})
    for name in ("DRAResourceClaimGranularStatusAuthorization", "ResourceHealthStatusMessage"):
        assert name not in kubernetes.upstream_gates
        assert not kubernetes.gate_enabled(name)
    # Alpha there: left off, as upstream has them.
    for name in ("DRAConsumableCapacity", "DRADeviceTaints", "DRAExtendedResource", "ResourceHealthStatus"):
        assert kubernetes.upstream_gates[name].stage == "alpha"
        assert not kubernetes.gate_enabled(name)
    assert set(kubernetes.feature_gates) == {
        "DRAAdminAccess",
        "DRAPrioritizedList",
        "DRAResourceClaimDeviceStatus",
        "DRASchedulerFilterTimeout",
    }


def test_gate_facts_cite_a_line() -> None:
    for kubernetes in TABLES:
        lines = [gate.line for gate in kubernetes.upstream_gates.values()]
        assert all(line > 0 for line in lines), kubernetes
        assert len(set(lines)) == len(lines), kubernetes


def test_1_38_development_branch_is_recorded_not_supported() -> None:
    """Read in k8s.io/kubernetes@v1.38.0-beta.0; the cluster cannot run it before its release."""
    (v1_38,) = UPCOMING
    assert (v1_38.version, v1_38.minor, v1_38.etcd) == ("v1.38.0-beta.0", "1.38", "v3.7.3")
    assert v1_38 not in SUPPORTED
    assert not (GOMOD / v1_38.module).exists()
    with pytest.raises(UnsupportedVersion):
        resolve("1.38", environ={})
    gates = v1_38.upstream_gates
    assert "DynamicResourceAllocation" not in gates  # removed in 1.38
    # GA in 1.38 and on; locked ones are never named, unlocked GA ones neither.
    for name in (
        "DRADeviceBindingConditions",
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRADeviceTaintRules",
    ):
        assert gates[name].stage == "ga"
        assert gates[name].locked
    for name in ("DRAConsumableCapacity", "DRAFractionalCapacityRange"):
        assert gates[name].stage == "ga"
        assert not gates[name].locked
        assert v1_38.gate_enabled(name)
    # Still alpha: off.
    for name in ("DRADerivedAttributes", "DRAListTypeAttributes", "DRADeviceCompatibilityGroups"):
        assert gates[name].stage == "alpha"
        assert not v1_38.gate_enabled(name)
    assert set(v1_38.feature_gates) == {
        "DRAResourceClaimGranularStatusAuthorization",
        "DRASchedulerFilterTimeout",
        "ResourceHealthStatus",
        "ResourceHealthStatusMessage",
    }


@pytest.mark.parametrize("kubernetes", TABLES, ids=TABLE_IDS)
def test_the_operator_allocates_with_each_releases_defaults(kubernetes: KubernetesVersion) -> None:
    """The operator's allocation gates per release (dra_operator.allocator.gates) are these tables'
    upstream defaults: what kube-scheduler of that release allocates with, untouched."""
    minor = kubernetes_minor(kubernetes.version)
    assert minor is not None
    defaults = RELEASE_DEFAULTS[minor]
    for name, on in defaults.to_mapping().items():
        gate = kubernetes.upstream_gates.get(name)
        assert on == (gate is not None and gate.default), f"{kubernetes}: {name}"


# ---- kube-controller-manager -----------------------------------------------------------------------

_CLOUD = {"cloud-node-lifecycle-controller", "service-lb-controller", "node-route-controller"}
_NODE = {"node-lifecycle-controller", "node-ipam-controller", "persistentvolume-attach-detach-controller"}


@pytest.mark.parametrize("kubernetes", TABLES, ids=TABLE_IDS)
def test_disabled_controllers_are_those_the_version_registers(kubernetes: KubernetesVersion) -> None:
    # 1.37 no longer registers the cloud-provider controllers and refuses --controllers naming them.
    expected = _NODE if kubernetes.minor >= "1.37" else _NODE | _CLOUD
    assert set(kubernetes.disabled_controllers) == expected
    assert len(kubernetes.disabled_controllers) == len(expected)


# ---- Go wrapper modules ------------------------------------------------------------------------------


def _require(go_mod: str, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)(?:\s*//.*)?$", go_mod, re.MULTILINE)
    assert match is not None, f"go.mod does not require {module}"
    return match.group(1)


def _replacements(go_mod: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(k8s\.io/\S+) => k8s\.io/\S+ (v\S+)$", go_mod, re.MULTILINE))


@pytest.mark.parametrize("kubernetes", SUPPORTED, ids=IDS)
def test_each_version_has_its_module_with_every_file_a_build_copies(kubernetes: KubernetesVersion) -> None:
    assert kubernetes.module == f"k8s-{kubernetes.minor}"
    source = binaries.module_source(binaries.KUBERNETES_MODULE, kubernetes=kubernetes)
    for rel in binaries.module_files(binaries.KUBERNETES_MODULE):
        assert (source / rel).is_file(), f"{kubernetes.module}/{rel} is missing"
        assert (GOMOD / kubernetes.module / rel).is_file()


@pytest.mark.parametrize("kubernetes", SUPPORTED, ids=IDS)
def test_each_go_mod_pins_the_tables_kubernetes_and_etcd(kubernetes: KubernetesVersion) -> None:
    go_mod = (GOMOD / kubernetes.module / "go.mod").read_text()
    assert _require(go_mod, "k8s.io/kubernetes") == kubernetes.version
    assert _require(go_mod, "go.etcd.io/etcd/server/v3") == kubernetes.etcd
    # The staging modules are replaced by the release's own (v0.<minor>.<patch> for v1.<minor>.<patch>).
    staging = "v0." + kubernetes.version.removeprefix("v1.")
    replacements = _replacements(go_mod)
    assert {"k8s.io/api", "k8s.io/apiserver", "k8s.io/kubelet", "k8s.io/dynamic-resource-allocation"} <= set(
        replacements
    )
    assert set(replacements.values()) == {staging}, replacements
    # go.sum holds the pinned release, so a build with -mod=readonly finds it.
    go_sum = (GOMOD / kubernetes.module / "go.sum").read_text()
    assert f"k8s.io/kubernetes {kubernetes.version} h1:" in go_sum
    assert f"go.etcd.io/etcd/server/v3 {kubernetes.etcd} h1:" in go_sum


def test_no_module_folder_without_a_version() -> None:
    folders = {path.name for path in GOMOD.iterdir() if path.name.startswith("k8s-")}
    assert folders == {v.module for v in SUPPORTED}
    # The module of old (one version for all) is gone; each version's folder stands alone.
    assert not (GOMOD / "go.mod").exists()


def test_the_build_stamps_the_chosen_version() -> None:
    flags = binaries.kubernetes_ldflags(resolve("1.34", environ={}))
    assert "k8s.io/component-base/version.gitVersion=v1.34.12" in flags
    assert "k8s.io/component-base/version.gitMajor=1 " in flags
    assert "k8s.io/component-base/version.gitMinor=34 " in flags


def test_cache_folders_are_keyed_by_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(binaries.CACHE_ENV, str(tmp_path))
    v1_36, v1_37 = resolve("1.36", environ={}), resolve("1.37", environ={})
    # 1.36's keep the names they had, so existing caches are reused.
    assert binaries.cache_dir(v1_36) == tmp_path / "accel-dra/control-plane/kubernetes-v1.36.3-etcd-v3.6.8"
    assert binaries.cache_dir(v1_37) == tmp_path / "accel-dra/control-plane/kubernetes-v1.37.2-etcd-v3.7.0"
    assert (
        binaries.node_cache_dir(v1_37).name == f"kubernetes-v1.37.2-containerd-{binaries.CONTAINERD_VERSION}"
    )
    monkeypatch.setenv(VERSION_ENV, "1.37")
    assert binaries.cache_dir() == binaries.cache_dir(v1_37)


# ---- the cluster carries its version ----------------------------------------------------------------


def test_a_cluster_follows_the_environment_and_runs_its_versions_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(VERSION_ENV, "1.37")
    cluster = LocalCluster(workdir=tmp_path)
    assert cluster.kubernetes.version == "v1.37.2"
    assert cluster.gates == cluster.kubernetes.feature_gates
    assert "DRAExtendedResource" not in cluster._gates_flag()
    assert cluster._controllers_flag() == (
        "--controllers=*,-node-lifecycle-controller,-node-ipam-controller,"
        "-persistentvolume-attach-detach-controller"
    )
    v1_34 = LocalCluster(workdir=tmp_path, kubernetes=resolve("1.34", environ={}))
    assert "-service-lb-controller" in v1_34._controllers_flag()
    assert "ResourceHealthStatus" not in v1_34._gates_flag()


def test_gates_given_to_a_cluster_replace_the_versions(tmp_path: Path) -> None:
    cluster = LocalCluster(workdir=tmp_path, kubernetes=DEFAULT, feature_gates={"DRADeviceTaints": False})
    assert cluster._gates_flag() == "--feature-gates=DRADeviceTaints=false"


def test_the_package_ships_every_versions_module() -> None:
    """pyproject.toml's package data: an installed (not editable) package builds from these."""
    package_data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    patterns = package_data["dra_devcluster"]
    for kubernetes in SUPPORTED:
        for rel in binaries.module_files(binaries.KUBERNETES_MODULE):
            path = f"gomod/{kubernetes.module}/{rel}"
            assert any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns), path


def test_a_kubelet_joins_only_within_the_version_skew() -> None:
    newest = resolve("1.37", environ={})
    _check_kubelet_skew(kubelet=resolve("1.34", environ={}), control_plane=newest)
    _check_kubelet_skew(kubelet=newest, control_plane=newest)
    with pytest.raises(ValueError, match=r"a kubelet v1\.37\.\d+ cannot join a control plane of v1\.34"):
        _check_kubelet_skew(kubelet=newest, control_plane=resolve("1.34", environ={}))
