"""The Helm chart's copied files stay the project's: CRDs, alert rules, dashboard, version.

Helm reads only what is inside the chart folder, so the chart carries copies of crds/ and of the
monitoring rule file and dashboard; a copy that drifts from its source fails here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.render import CRDS_DIR, MANIFESTS_DIR, REPO_ROOT

CHART_DIR = REPO_ROOT / "deployments" / "helm" / "accel-dra"
MONITORING_DIR = MANIFESTS_DIR / "monitoring"


def _crd_files() -> list[str]:
    kustomization = yaml.safe_load((CRDS_DIR / "kustomization.yaml").read_text())
    return list(kustomization["resources"])


def test_chart_ships_exactly_the_projects_crds() -> None:
    shipped = sorted(p.name for p in (CHART_DIR / "crds").iterdir())
    assert shipped == sorted(_crd_files()), "the chart's crds/ must hold what crds/kustomization.yaml lists"


@pytest.mark.parametrize("name", _crd_files())
def test_chart_crd_is_identical_to_the_projects(name: str) -> None:
    assert (CHART_DIR / "crds" / name).read_bytes() == (CRDS_DIR / name).read_bytes(), (
        f"deployments/helm/accel-dra/crds/{name} differs from crds/{name}: copy it again"
    )


@pytest.mark.parametrize(
    ("copy", "source"),
    [
        ("files/accel-dra.rules.yaml", MONITORING_DIR / "rules" / "accel-dra.rules.yaml"),
        ("files/accel-dra-devices.json", MONITORING_DIR / "dashboards" / "accel-dra-devices.json"),
    ],
)
def test_chart_monitoring_files_are_identical_to_the_manifests(copy: str, source: Path) -> None:
    assert (CHART_DIR / copy).read_bytes() == source.read_bytes(), (
        f"deployments/helm/accel-dra/{copy} differs from {source.relative_to(REPO_ROOT)}: copy it again"
    )


def test_chart_version_is_the_projects_version() -> None:
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["version"] == version
    assert chart["appVersion"] == version
