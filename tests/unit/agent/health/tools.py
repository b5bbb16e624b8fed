"""The Prometheus binaries the monitoring tests run; missing ones fail the test, naming the package."""

from __future__ import annotations

import shutil

import pytest

from dra_devcluster.prerequisites import PROMETHEUS, install_command

PACKAGE = PROMETHEUS.name


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"{binary} is not installed: install the Debian package '{PACKAGE}' "
            f"({install_command([PACKAGE])}), which provides /usr/bin/prometheus and /usr/bin/promtool",
            pytrace=False,
        )
    return path
