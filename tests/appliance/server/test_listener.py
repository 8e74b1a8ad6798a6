"""The TCP listener: the connection boundary and the per-address connection limit.

Real loopback sockets, plaintext (TLS is tested in tests/pki and end to end).
"""

from __future__ import annotations

import pytest
import trio

from appliance.server.listener import ConnectionInfo, TcpService, describe_failure


async def _listen(service: TcpService, nursery: trio.Nursery) -> int:
    sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port: int = sockets[0].socket.getsockname()[1]
    nursery.start_soon(service.serve, sockets, nursery)
    return port


@pytest.mark.trio
async def test_a_handler_that_raises_closes_only_its_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any exception in one connection ends that connection, never the service."""
    served: list[bytes] = []

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        data = await stream.receive_some(100)
        if data.startswith(b"boom"):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        if data.startswith(b"group"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                raise OverflowError("int too big")
        served.append(data)
        await stream.send_all(b"ok")

    service = TcpService("t", handler, ssl_context=None, tls_handshake_timeout=5,
                         max_connections=10)  # fmt: skip
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await _listen(service, nursery)
            for payload in (b"boom", b"group", b"fine"):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(payload)
                answer = await stream.receive_some(10)
                await stream.aclose()
                assert answer == (b"ok" if payload == b"fine" else b"")
            nursery.cancel_scope.cancel()
    assert served == [b"fine"]
    assert service.failed == 2
    assert service.active == 0
    failures = [r.fields for r in caplog.records if r.getMessage() == "connection.failed"]  # type: ignore[attr-defined]
    assert [f["error"] for f in failures] == ["UnicodeEncodeError", "OverflowError"]
    assert "surrogates not allowed" in failures[0]["reason"]


@pytest.mark.trio
async def test_one_address_cannot_take_every_connection_slot() -> None:
    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        await stream.send_all(b"hi")
        await stream.receive_some(10)  # returns when the client closes

    service = TcpService("t", handler, ssl_context=None, tls_handshake_timeout=5,
                         max_connections=10, max_connections_per_address=2)  # fmt: skip
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await _listen(service, nursery)
            kept = []
            for _ in range(2):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                assert await stream.receive_some(10) == b"hi"
                kept.append(stream)
            third = await trio.open_tcp_stream("127.0.0.1", port)
            assert await third.receive_some(10) == b""  # closed at once
            assert service.refused == 1
            await kept.pop().aclose()
            while service.active > 1:  # the server side notices the close
                await trio.sleep(0.01)
            again = await trio.open_tcp_stream("127.0.0.1", port)
            assert await again.receive_some(10) == b"hi"
            nursery.cancel_scope.cancel()


def test_describe_failure_lists_the_types_in_a_group() -> None:
    group = ExceptionGroup("x", [ValueError("bad value"), ExceptionGroup("y", [KeyError("k")])])
    types, text = describe_failure(group)
    assert types == "KeyError,ValueError"
    assert text in {"bad value", "'k'"}
    assert describe_failure(RuntimeError("a\nb")) == ("RuntimeError", "a")
