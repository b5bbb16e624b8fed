from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from dra_operator.client.login import (
    FALLBACK_SERVER,
    in_cluster_server,
    kubeconfig_login,
    service_account_login,
)


def service_account(tmp_path: Path, *, token: str = "tok-1\n") -> Path:
    (tmp_path / "token").write_text(token)
    (tmp_path / "namespace").write_text("accel-dra\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def test_the_server_is_the_one_the_pod_environment_names() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://10.96.0.1:443"
    # A host-network pod on a node whose API server listens elsewhere.
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(env) == "https://127.0.0.1:6443"


def test_an_ipv6_service_address_is_bracketed() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://[fd00:10:96::1]:443"


@pytest.mark.parametrize(
    "env", [{}, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT": "443"}]
)
def test_without_both_variables_the_service_name_is_used(env: dict[str, str]) -> None:
    assert in_cluster_server(env) == FALLBACK_SERVER


def test_the_service_account_gives_token_namespace_and_ca(tmp_path: Path) -> None:
    directory = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = service_account_login(env, directory=directory)
    assert info is not None
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "tok-1"
    assert info.scheme == "Bearer"
    assert info.default_namespace == "accel-dra"
    assert info.ca_path == str(directory / "ca.crt")


def test_a_rotated_token_is_read_at_the_next_login(tmp_path: Path) -> None:
    directory = service_account(tmp_path)
    first = service_account_login({}, directory=directory)
    (directory / "token").write_text("tok-2")
    second = service_account_login({}, directory=directory)
    assert first is not None
    assert second is not None
    assert (first.token, second.token) == ("tok-1", "tok-2")


def test_outside_a_pod_there_is_no_service_account_login(tmp_path: Path) -> None:
    assert service_account_login({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, directory=tmp_path) is None


def test_a_kubeconfig_gives_its_current_context(tmp_path: Path) -> None:
    ca = base64.b64encode(b"CA PEM").decode()
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "b",
                "contexts": [
                    {"name": "a", "context": {"cluster": "one", "user": "u"}},
                    {"name": "b", "context": {"cluster": "two", "user": "u", "namespace": "ns"}},
                ],
                "clusters": [
                    {"name": "one", "cluster": {"server": "https://one:6443"}},
                    {
                        "name": "two",
                        "cluster": {"server": "https://two:6443", "certificate-authority-data": ca},
                    },
                ],
                "users": [{"name": "u", "user": {"token": "abc"}}],
            }
        )
    )
    info = kubeconfig_login(str(path))
    assert (info.server, info.ca_data, info.token, info.scheme, info.default_namespace) == (
        "https://two:6443",
        "CA PEM",
        "abc",
        "Bearer",
        "ns",
    )
