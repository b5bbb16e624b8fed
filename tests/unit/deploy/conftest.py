"""Fixtures for the manifest checks: kubectl from the local control plane's binaries, renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_devcluster import ensure_binaries
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
