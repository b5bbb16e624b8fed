"""A missing Prometheus binary fails the monitoring tests with the package to install; never a skip."""

from __future__ import annotations

import pytest

from .tools import require


def test_missing_binary_fails_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"install the Debian package 'prometheus'"):
        require("promtool")
