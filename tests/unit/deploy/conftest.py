"""Fixtures for the manifest checks: kubectl from the local control plane's binaries, renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_devcluster import ensure_binaries
from dra_devcluster.binaries import ensure_helm
from tests.unit.deploy.helm_render import helm_template, overlay_values
from tests.unit.deploy.render import CRDS_DIR, OVERLAYS, Obj, overlay_dir, render


@pytest.fixture(scope="session")
def kubectl() -> Path:
    # The same kubectl (and kustomize) version as the control plane the integration tests run.
    return ensure_binaries().kubectl


@pytest.fixture(scope="session")
def rendered(kubectl: Path) -> dict[str, list[Obj]]:
    """overlay name -> its rendered objects."""
    return {name: render(overlay_dir(name), kubectl=kubectl) for name in OVERLAYS}


@pytest.fixture(scope="session")
def rendered_crds(kubectl: Path) -> list[Obj]:
    return render(CRDS_DIR, kubectl=kubectl)


@pytest.fixture(scope="session")
def helm() -> Path:
    # Pinned helm, built from its Go module into the cache on first use (dra_devcluster.binaries).
    return ensure_helm()


@pytest.fixture(scope="session")
def helm_rendered(helm: Path) -> dict[str, list[Obj]]:
    """overlay name -> the chart rendered with the values that match that overlay."""
    return {name: helm_template(helm, values=overlay_values(name)) for name in OVERLAYS}
