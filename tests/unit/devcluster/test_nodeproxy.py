"""The node proxy forwards CONNECTs for routed kubelets to loopback, and refuses everything else."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_devcluster.nodeproxy import NodeProxy, egress_selector_config


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(1024).upper())

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[NodeProxy]:
    proxy = NodeProxy(tmp_path / "proxy.sock")
    proxy.start()
    yield proxy
    proxy.stop()


def _request(proxy: NodeProxy, line: str, payload: bytes = b"") -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(str(proxy.path))
        client.sendall(f"{line}\r\nHost: x\r\n\r\n".encode())
        reply = client.recv(1024)
        if payload and reply.startswith(b"HTTP/1.1 200"):
            client.sendall(payload)
            reply += client.recv(1024)
        return reply


def test_a_routed_node_reaches_its_kubelet_on_loopback(proxy: NodeProxy, echo_port: int) -> None:
    proxy.add_route(node="node-1", port=echo_port)
    reply = _request(proxy, f"CONNECT node-1:{echo_port} HTTP/1.1", b"hello")
    assert reply.startswith(b"HTTP/1.1 200")
    assert reply.endswith(b"HELLO")


def test_anything_else_is_refused(proxy: NodeProxy, echo_port: int) -> None:
    proxy.add_route(node="node-1", port=echo_port)
    assert _request(proxy, f"CONNECT node-2:{echo_port} HTTP/1.1").startswith(b"HTTP/1.1 403")
    assert _request(proxy, f"CONNECT node-1:{echo_port + 1} HTTP/1.1").startswith(b"HTTP/1.1 403")
    assert _request(proxy, f"CONNECT 10.0.0.1:{echo_port} HTTP/1.1").startswith(b"HTTP/1.1 403")
    assert _request(proxy, f"GET http://node-1:{echo_port}/ HTTP/1.1").startswith(b"HTTP/1.1 403")
    proxy.remove_routes("node-1")
    assert _request(proxy, f"CONNECT node-1:{echo_port} HTTP/1.1").startswith(b"HTTP/1.1 403")


def test_the_egress_selector_sends_cluster_traffic_to_the_socket(tmp_path: Path) -> None:
    text = egress_selector_config(tmp_path / "proxy.sock")
    assert "name: cluster" in text
    assert "proxyProtocol: HTTPConnect" in text
    assert f"udsName: {tmp_path / 'proxy.sock'}" in text
