"""The API client looks up its proxy once, not on every request (see dra_api.kube)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_api.kube import make_api_client

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


@pytest.mark.parametrize(
    ("env", "proxy", "proxy_auth"),
    [
        ({}, None, None),
        ({"HTTPS_PROXY": "http://proxy.example:3128"}, "http://proxy.example:3128", None),
        ({"HTTPS_PROXY": "http://alice:secret@proxy.example:3128"}, "http://proxy.example:3128", "Basic "),
        ({"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "10.0.0.1"}, None, None),
        ({"HTTP_PROXY": "http://proxy.example:3128"}, None, None),  # the API server is https
    ],
)
async def test_the_proxy_is_looked_up_once_and_the_session_no_longer_reads_the_environment(
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    proxy: str | None,
    proxy_auth: str | None,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    api = await make_api_client(kubeconfig=kubeconfig)
    try:
        rest = api.rest_client
        assert rest.proxy == proxy
        headers = rest.proxy_headers or {}
        if proxy_auth is None:
            assert "Proxy-Authorization" not in headers
        else:
            assert headers["Proxy-Authorization"].startswith(proxy_auth)
        # aiohttp would otherwise hop to a thread twice per request (netrc, proxy variables).
        assert rest.pool_manager.trust_env is False
    finally:
        await api.close()
