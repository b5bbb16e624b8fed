"""The operator's keep-alive HTTP/1.1 connections (:mod:`dra_operator.client.http11`) against a
scripted raw socket server: the framing and connection handling that the API server cannot be made
to show on cue (a keep-alive connection closed under a request, a reply that never comes, a broken
peer). What they send to the real API server is exercised by every operator test on the local
control plane."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dra_operator.client.errors import transient
from dra_operator.client.http11 import ConnectionPool, Dropped, pool_for, ssl_context_for

# One scripted answer: given the request's head and body, the bytes to send back (None: close the
# connection without a word) and whether to keep the connection open afterwards.
Script = Callable[[bytes, bytes], Awaitable[tuple[bytes | None, bool]]]


class Server:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer, keep = await self.script(head, body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(script: Script, *, timeout_s: float = 5.0) -> AsyncIterator[tuple[Server, ConnectionPool]]:
    server = Server(script)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    pool = ConnectionPool(
        host="127.0.0.1",
        port=port,
        authority=f"127.0.0.1:{port}",
        ssl_context=None,
        server_hostname=None,
        timeout_s=timeout_s,
    )
    try:
        yield server, pool
    finally:
        await pool.close()
        listener.close()
        await listener.wait_closed()


def sized(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def echo(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
    return sized(body), True


async def request(pool: ConnectionPool, body: bytes = b'{"a":1}') -> bytes:
    reply = await pool.request("PATCH", "/x", headers={"Content-Type": "application/json"}, body=body)
    assert reply.status == 200
    return reply.body


async def test_requests_reuse_one_connection_and_send_a_well_formed_head() -> None:
    async with serving(echo) as (server, pool):
        assert await request(pool, b'{"a":1}') == b'{"a":1}'
        assert await request(pool, b'{"b":2}') == b'{"b":2}'
    assert server.connections == 1
    head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"PATCH /x HTTP/1.1"
    assert head[1].startswith(b"Host: 127.0.0.1:")
    assert b"Content-Length: 7" in head


async def test_a_chunked_reply_is_put_together() -> None:
    async def chunked(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        reply = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'4\r\n{"a"\r\n'
            b"3;ext=1\r\n:12\r\n"
            b"1\r\n}\r\n"
            b"0\r\nX-Trailer: t\r\n\r\n"
        )
        return reply, True

    async with serving(chunked) as (server, pool):
        assert await request(pool) == b'{"a":12}'
        assert await request(pool) == b'{"a":12}'  # the connection was left at the next reply
    assert server.connections == 1


async def test_a_keep_alive_connection_closed_under_a_request_is_replaced_once() -> None:
    """The server closes a kept-alive connection as the next request arrives (its idle timeout
    racing the request), without a reply: the request goes out again on a fresh connection."""
    calls = 0

    async def close_the_second(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        nonlocal calls
        calls += 1
        return (None, False) if calls == 2 else (sized(body), True)

    async with serving(close_the_second) as (server, pool):
        assert await request(pool, b"1") == b"1"
        assert await request(pool, b"2") == b"2"
    assert server.connections == 2
    assert [r.rpartition(b"\r\n")[2] for r in server.requests] == [b"1", b"2", b"2"]


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async def one_per_connection(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        return sized(body), False

    async with serving(one_per_connection) as (server, pool):
        assert await request(pool, b"1") == b"1"
        await asyncio.sleep(0.05)  # the close reaches the client
        assert await request(pool, b"2") == b"2"
    assert server.connections == 2
    assert len(server.requests) == 2


async def test_a_fresh_connection_closed_before_a_reply_is_an_error_and_not_sent_again() -> None:
    async def hang_up(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        return None, False

    async with serving(hang_up) as (server, pool):
        with pytest.raises(Dropped, match="connection closed before a reply") as dropped:
            await request(pool)
    assert transient(dropped.value)  # retried by the caller's backoff, as aiohttp's errors are
    assert len(server.requests) == 1


async def test_connection_close_is_honoured() -> None:
    async def closing(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        return sized(body, "Connection: close"), False

    async with serving(closing) as (server, pool):
        await request(pool)
        await request(pool)
    assert server.connections == 2
    assert len(server.requests) == 2  # no request went out on the closed connection


async def test_a_reply_that_never_comes_times_out_and_the_connection_is_not_reused() -> None:
    calls = 0

    async def slow_first(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(30)
        return sized(body), True

    async with serving(slow_first, timeout_s=0.3) as (server, pool):
        with pytest.raises(TimeoutError):
            await request(pool)
        assert await request(pool, b"2") == b"2"
    assert server.connections == 2


async def test_a_cancelled_request_leaves_no_half_read_connection_behind() -> None:
    started = asyncio.Event()
    calls = 0

    async def slow_first(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            await asyncio.sleep(0.5)
            return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale", True
        return sized(body), True

    async with serving(slow_first) as (server, pool):
        task = asyncio.create_task(request(pool))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await request(pool, b"fresh") == b"fresh"
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    ],
    ids=["not-http", "bad-status", "bad-chunk-size", "short-body"],
)
async def test_a_broken_reply_is_an_error(answer: bytes) -> None:
    async def broken(head: bytes, body: bytes) -> tuple[bytes | None, bool]:
        return answer, False

    async with serving(broken) as (_, pool):
        with pytest.raises(Dropped):
            await request(pool)


async def test_nothing_listening_is_a_transient_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    pool = pool_for(
        f"http://127.0.0.1:{port}",
        proxy=None,
        ssl_context=ssl_context_for(ca_file=None, cert_file=None, key_file=None, verify=True, strict=True),
        server_hostname=None,
        timeout_s=5,
    )
    assert pool is not None
    with pytest.raises(Dropped, match="cannot connect") as dropped:
        await request(pool)
    assert transient(dropped.value)


def test_only_what_the_pool_speaks_gets_a_pool() -> None:
    context = ssl_context_for(ca_file=None, cert_file=None, key_file=None, verify=True, strict=True)

    def pool(url: str, proxy: str | None = None) -> ConnectionPool | None:
        return pool_for(url, proxy=proxy, ssl_context=context, server_hostname=None, timeout_s=5)

    assert pool("https://10.0.0.1:6443") is not None
    assert pool("https://kubernetes.default.svc") is not None
    assert pool("https://10.0.0.1:6443", proxy="http://proxy:3128") is None
    assert pool("https://rancher.example/k8s/clusters/c-1") is None  # a path prefix
    v6 = pool("https://[fd00::1]:6443")
    assert v6 is not None
    assert v6._head("GET", "/x", {}, 0).split(b"\r\n")[1] == b"Host: [fd00::1]:6443"


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/x HTTP/1.1\r\nHost: evil\r\n\r\nDELETE /y", {}),
        ("/api/v1/namespaces/a b/events", {}),
        ("/x", {"X-Note": "ok\r\nAuthorization: Bearer stolen"}),
        ("/x", {"X-Bad\nName": "v"}),
    ],
    ids=["crlf-in-path", "space-in-path", "crlf-in-value", "lf-in-name"],
)
async def test_nothing_is_sent_that_could_end_a_line_early(path: str, headers: dict[str, str]) -> None:
    async with serving(echo) as (server, pool):
        with pytest.raises(ValueError, match="a space or a control character"):
            await pool.request("PATCH", path, headers=headers, body=b"{}")
        # a header value may hold a space
        await pool.request("PATCH", "/x", headers={"Authorization": "Bearer t"}, body=b"{}")
    assert len(server.requests) == 1
