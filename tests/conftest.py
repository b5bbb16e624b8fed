"""Fixtures shared by all test suites.

``local_cluster`` starts one real control plane per test session (built or found binaries; see
``dra_devcluster``) of the Kubernetes version ``DRA_KUBERNETES_VERSION`` names (1.34, 1.37.2, ...),
else the default one; the report's header says which. It never skips: if the binaries cannot be
provided, the tests that need it fail with the reason. When a test that used it fails, the tails of
the components' logs are attached to the test report and the full logs stay in the session's
temporary directory.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from dra_devcluster import LocalCluster, UnsupportedVersion, resolve_kubernetes_version
from dra_devcluster.versions import VERSION_ENV
from tests import mps_cgroup

# A skipped or xfailed test fails the run (see tests/no_skips.py); pytester tests that rule.
pytest_plugins = ("pytester", "tests.no_skips")

_CLUSTER_KEY = pytest.StashKey[LocalCluster]()


def pytest_report_header(config: pytest.Config) -> str:
    try:
        kubernetes = resolve_kubernetes_version()
    except UnsupportedVersion as err:  # the tests that need a cluster fail with it
        return f"kubernetes: {err}"
    return f"kubernetes: {kubernetes.version}, etcd {kubernetes.etcd} (${VERSION_ENV} chooses)"


@pytest.fixture(scope="session", autouse=True)
def _mps_cgroup_parent() -> Iterator[None]:
    """The cgroup the tests' MPS daemons go under is removed when the session ends."""
    yield
    mps_cgroup.remove_parent()


@pytest.fixture(scope="session")
def local_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        workdir=tmp_path_factory.mktemp("cluster"), kubernetes=resolve_kubernetes_version()
    )
    cluster.start()
    request.config.stash[_CLUSTER_KEY] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cluster = item.config.stash.get(_CLUSTER_KEY, None)
    if cluster is not None and report.failed and "local_cluster" in getattr(item, "fixturenames", ()):
        for path in cluster.log_files():
            report.sections.append((f"{path.stem} log (tail; full log: {path})", cluster.log_tail(path.stem)))
    return report


# Property-based tests draw the same examples on every run (no flakiness from random draws, nothing
# written to a database beside the repository) and are never timed.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("project", derandomize=True, database=None, deadline=None)
_hypothesis_settings.load_profile("project")
