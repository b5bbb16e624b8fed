"""Render the Helm chart with the pinned helm (built from its Go module, see dra_devcluster.binaries)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from dra_devcluster.versions import resolve
from tests.unit.deploy.render import NAMESPACE, REPO_ROOT, Obj

CHART_DIR = REPO_ROOT / "deployments" / "helm" / "accel-dra"
RELEASE = "accel-dra"


def overlay_values(overlay: str) -> dict[str, Any]:
    """The chart values that give manifests/overlays/<overlay>'s objects."""
    return {"backend": overlay}


def set_flags(values: dict[str, Any], prefix: str = "") -> list[str]:
    """--set-json flags for a values mapping (exact types, no string guessing)."""
    return [f"--set-json={prefix}{key}={json.dumps(value)}" for key, value in values.items()]


def helm_template(
    helm: Path, *, values: dict[str, Any], namespace: str = NAMESPACE, release: str = RELEASE
) -> list[Obj]:
    """`helm template` of the chart as a list of objects (with the CRDs); raises with helm's message."""
    command = [str(helm), "template", release, str(CHART_DIR), "--namespace", namespace, "--include-crds",
               "--kube-version", resolve().version.removeprefix("v"), *set_flags(values)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise AssertionError(f"helm template failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
