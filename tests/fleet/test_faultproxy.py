"""tests/fleet/faultproxy.py itself: passes requests through, and each fault does what it says.

The upstream is a small keep-alive HTTP server in this process (the proxy
runs in a child process, so this process's threads do not slow it). Waits
are bounded only to fail a hung test; nothing asserts a duration.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.fleet.faultproxy import FaultProxy

#: Seconds a client waits for an answer before it calls the proxy silent (the blackhole).
SILENCE_SECONDS = 1.0
#: Bound on waiting for something the test expects.
PATIENCE_SECONDS = 30.0


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as S3

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked"):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self._answer(f"got {self.path}".encode())

    def do_HEAD(self) -> None:
        self._answer(b"0123456789")

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(b"stored " + body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultProxy(("127.0.0.1", server.server_address[1])) as running:
            yield running
    finally:
        server.shutdown()
        server.server_close()


def _client(proxy: FaultProxy, timeout: float = PATIENCE_SECONDS) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)


def _get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def test_passes_requests_through_on_one_keep_alive_connection(proxy: FaultProxy) -> None:
    conn = _client(proxy)
    assert _get(conn, "/a") == (200, b"got /a")
    conn.request("PUT", "/b", body=b"payload")
    put = conn.getresponse()
    assert (put.status, put.read()) == (200, b"stored payload")
    conn.request("HEAD", "/c")
    head = conn.getresponse()
    assert (head.status, head.read(), head.getheader("Content-Length")) == (200, b"", "10")
    assert _get(conn, "/chunked") == (200, b"hello chunked")
    conn.close()
    assert proxy.counts["passed"] == 4


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [("forbidden", 403, "AccessDenied"), ("internal", 500, "InternalError"),
     ("slowdown", 503, "SlowDown")],
)  # fmt: skip
def test_error_answers_are_s3_errors_and_the_connection_goes_on(
    proxy: FaultProxy, fault: str, status: int, code: str
) -> None:
    conn = _client(proxy)
    assert _get(conn, "/before")[0] == 200
    proxy.fail(fault)  # type: ignore[arg-type]
    answer_status, body = _get(conn, "/during")
    assert answer_status == status
    assert f"<Code>{code}</Code>".encode() in body
    conn.request("PUT", "/during", body=b"x" * 1000)  # the body is read and dropped
    put = conn.getresponse()
    assert put.status == status
    put.read()
    proxy.heal()
    assert _get(conn, "/after") == (200, b"got /after")  # same connection
    assert proxy.counts[fault] == 2


def test_a_fault_for_some_seconds_ends_by_itself(proxy: FaultProxy) -> None:
    proxy.fail("slowdown", seconds=0.2)
    deadline = time.monotonic() + PATIENCE_SECONDS
    while proxy.fault is not None:
        assert time.monotonic() < deadline, "the fault never ended"
        time.sleep(0.05)
    assert _get(_client(proxy), "/x") == (200, b"got /x")


def test_reset_resets_the_connection(proxy: FaultProxy) -> None:
    conn = _client(proxy)
    assert _get(conn, "/a")[0] == 200
    proxy.fail("reset")
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        _get(conn, "/b")
    proxy.heal()
    assert _get(_client(proxy), "/c")[0] == 200
    assert proxy.counts["reset"] == 1


def test_blackhole_answers_nothing_until_it_ends(proxy: FaultProxy) -> None:
    pooled = _client(proxy, timeout=SILENCE_SECONDS)
    assert _get(pooled, "/a")[0] == 200
    proxy.fail("blackhole")
    with pytest.raises(TimeoutError):  # a pooled connection: silence
        _get(pooled, "/b")
    with pytest.raises(TimeoutError):  # a new connection: accepted, then silence
        _get(_client(proxy, timeout=SILENCE_SECONDS), "/c")
    proxy.heal()
    assert _get(_client(proxy), "/d")[0] == 200
    assert proxy.counts["blackhole"] == 2


def test_the_child_ends_with_the_proxy(proxy: FaultProxy) -> None:
    port = proxy.port
    proxy.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_SECONDS).close()
