"""How pods on a real node's own network reach the API server: the local cluster has no kube-proxy
and the API server listens on loopback only, so each node gets an :class:`ApiRelay` that listens on
the node bridge's gateway address (the pods' default gateway) and copies every connection, TLS and
all, to the API server. Identity and authorization are unchanged: the API server sees the pod's
own bearer token. The server certificate does not name the gateway address, so pods address it by
a name it does carry (``kubernetes.default.svc``, through ``hostAliases``).

The bridge and its address appear only when the node's first pod-network sandbox is set up, so the
listening socket is bound with ``IP_FREEBIND``: it takes the address before the address exists.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

from dra_devcluster.nodeproxy import accept_in_threads, relay_both_ways

log = logging.getLogger(__name__)

# linux/in.h; the socket module does not export it.
_IP_FREEBIND = 15


class ApiRelay:
    """A TCP relay from ``listen`` to ``upstream``, in daemon threads of the cluster's process."""

    def __init__(self, *, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listen = listen
        self.upstream = upstream
        self._server: socket.socket | None = None

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        server.bind(self.listen)
        server.listen(64)
        self._server = server
        threading.Thread(
            target=accept_in_threads,
            args=(server, self._serve),
            kwargs={"alive": lambda: self._server is server},
            name="api-relay",
            daemon=True,
        ).start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError as exc:
                log.warning(
                    "API relay %s: cannot reach the API server at %s: %s", self.listen, self.upstream, exc
                )
                return
            with upstream:
                relay_both_ways(client, upstream)
