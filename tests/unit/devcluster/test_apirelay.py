"""The API relay copies a connection both ways to its upstream, and takes its address before the
address exists (the node's bridge gets it only with the first pod-network sandbox)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from dra_devcluster.apirelay import ApiRelay
from dra_devcluster.cluster import free_port


@pytest.fixture
def upper_port() -> Iterator[int]:
    """A server that answers each connection with what it got, upper-cased, once the client's side ends."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                received = b""
                while chunk := conn.recv(65536):
                    received += chunk
                conn.sendall(received.upper())

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_connection_is_copied_both_ways_until_each_side_ends(upper_port: int) -> None:
    relay = ApiRelay(listen=("127.0.0.1", free_port()), upstream=("127.0.0.1", upper_port))
    relay.start()
    try:
        payload = b"x" * 300_000  # more than one buffer
        with socket.create_connection(relay.listen, timeout=5) as client:
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)  # the half-close reaches the upstream
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        assert reply == payload.upper()
    finally:
        relay.stop()


def test_it_listens_on_an_address_no_interface_has_yet(upper_port: int) -> None:
    relay = ApiRelay(listen=("10.244.250.1", free_port()), upstream=("127.0.0.1", upper_port))
    relay.start()  # IP_FREEBIND: no "Cannot assign requested address"
    relay.stop()


def test_an_unreachable_upstream_closes_the_connection() -> None:
    relay = ApiRelay(listen=("127.0.0.1", free_port()), upstream=("127.0.0.1", free_port()))
    relay.start()
    try:
        with socket.create_connection(relay.listen, timeout=5) as client:
            assert client.recv(1) == b""
    finally:
        relay.stop()
