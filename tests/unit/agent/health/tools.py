"""The Prometheus binaries the monitoring tests run; missing ones fail the test, naming the package."""

from __future__ import annotations

import shutil

import pytest

PACKAGE = "prometheus"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"{binary} is not installed: install the Debian package '{PACKAGE}' "
            f"(apt-get install -y {PACKAGE}), which provides /usr/bin/prometheus and /usr/bin/promtool",
            pytrace=False,
        )
    return path
