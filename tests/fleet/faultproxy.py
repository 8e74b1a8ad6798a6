"""A fault-injecting HTTP proxy for tests, on loopback in front of an S3 server (moto).

deltalake's object_store client talks to :attr:`FaultProxy.endpoint` as if it
were S3; the proxy forwards each request to the upstream server, unless the
test switched it to a fault, for a while or until :meth:`FaultProxy.heal`:

* ``forbidden``: ``403 AccessDenied`` (an S3 XML error body);
* ``internal``: ``500 InternalError``;
* ``slowdown``: ``503 SlowDown``;
* ``reset``: the connection is reset (``SO_LINGER`` 0, a TCP RST) when a request arrives;
* ``blackhole``: the request is read and never answered; the connection is
  held until the fault ends, then closed. New connections are accepted (the
  kernel completes the handshake) and treated alike.

The proxy speaks HTTP/1.1 per request, not per connection: a client's
pooled keep-alive connection gets the fault of the moment each request
arrives, so a switch takes effect at the next request, not at the next
connection. Bodies are relayed whole (``Content-Length``, chunked, or until
the upstream closes). Threads: one accepting, one per client connection.

Every wait is bounded: a client connection idle for
:data:`IDLE_TIMEOUT_SECONDS` is closed, an upstream read waits at most
:data:`UPSTREAM_TIMEOUT_SECONDS`, and a blackholed connection is held at
most until its fault ends or the proxy closes.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal

__all__ = [
    "FAULTS",
    "IDLE_TIMEOUT_SECONDS",
    "UPSTREAM_TIMEOUT_SECONDS",
    "Fault",
    "FaultProxy",
    "ProxyServer",
    "fault_proxy",
]

Fault = Literal["forbidden", "internal", "slowdown", "reset", "blackhole"]
#: Every fault, in the order a test may cycle through them.
FAULTS: Final[tuple[Fault, ...]] = ("forbidden", "internal", "slowdown", "reset", "blackhole")

#: Seconds a client connection may stay idle (between requests) before it is closed.
IDLE_TIMEOUT_SECONDS: Final = 120.0
#: Seconds to connect to, and to wait for each read from, the upstream server.
UPSTREAM_TIMEOUT_SECONDS: Final = 60.0
#: Longest request or response head accepted, in bytes.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Seconds between a held (blackholed) connection's looks at whether its fault ended.
HOLD_POLL_SECONDS: Final = 0.05
#: Seconds the child process has to start or to answer a command.
COMMAND_TIMEOUT_SECONDS: Final = 30.0


@dataclass(frozen=True)
class _ErrorAnswer:
    status: int
    reason: str
    code: str
    message: str


_ANSWERS: Final[dict[str, _ErrorAnswer]] = {
    "forbidden": _ErrorAnswer(403, "Forbidden", "AccessDenied", "Access Denied"),
    "internal": _ErrorAnswer(
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "slowdown": _ErrorAnswer(503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


class _Closed(Exception):
    """The peer closed the connection (or it timed out) between or inside messages."""


def _read_head(stream: BinaryIO) -> list[bytes] | None:
    """The lines of an HTTP head (start line first), or None at a clean end of stream."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = stream.readline(MAX_HEAD_BYTES + 1)
        if not line:
            if lines:
                raise _Closed("closed inside a head")
            return None
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise _Closed("head too long")
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue  # a stray empty line between messages
            return lines
        lines.append(line)


def _headers(lines: list[bytes]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        found[name.strip().lower()] = value.strip()
    return found


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise _Closed("closed inside a body")
    return data


def _read_body(stream: BinaryIO, headers: dict[str, str]) -> bytes:
    """The body as it came over the wire (chunked framing kept), by its headers."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        while True:
            size_line = stream.readline(MAX_HEAD_BYTES)
            if not size_line:
                raise _Closed("closed inside a chunked body")
            parts.append(size_line)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    trailer = stream.readline(MAX_HEAD_BYTES)
                    if not trailer:
                        raise _Closed("closed inside trailers")
                    parts.append(trailer)
                    if trailer in (b"\r\n", b"\n"):
                        return b"".join(parts)
            parts.append(_read_exact(stream, size + 2))
    length = headers.get("content-length")
    return _read_exact(stream, int(length)) if length else b""


def _wants_close(headers: dict[str, str], version: bytes) -> bool:
    connection = headers.get("connection", "").lower()
    return "close" in connection or (version == b"HTTP/1.0" and "keep-alive" not in connection)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with suppress(OSError):
        sock.close()


class ProxyServer:
    """The proxy itself, in this process: :meth:`start` it, switch faults, :meth:`close` it.

    Tests use :class:`FaultProxy`, which runs it in a process of its own.

    Args:
        upstream: the ``(host, port)`` of the server requests pass to.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self._fault: Fault | None = None
        self._until = float("inf")
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        #: Requests seen, by what happened to them: ``passed`` or the fault's name.
        self.counts: Counter[str] = Counter()
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The URL a client uses instead of the upstream's (``AWS_ENDPOINT_URL``)."""
        return f"http://127.0.0.1:{self.port}"

    # -- control -----------------------------------------------------------------------

    def fail(self, fault: Fault, seconds: float | None = None) -> None:
        """Answer every request with ``fault`` from now on, for ``seconds`` (None: until healed)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self.lock:
            self._fault = fault
            self._until = float("inf") if seconds is None else time.monotonic() + seconds

    def heal(self) -> None:
        """Pass every request through again."""
        with self.lock:
            self._fault = None
            self._until = float("inf")

    @property
    def fault(self) -> Fault | None:
        """The fault in force now (None: passing through)."""
        with self.lock:
            if self._fault is not None and time.monotonic() >= self._until:
                self._fault = None
                self._until = float("inf")
            return self._fault

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> ProxyServer:
        """Bind a free loopback port and accept in a background thread."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._spawn(self._accept_loop, listener)
        return self

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        if self._listener is not None:
            with suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        with self.lock:
            open_now = list(self._sockets)
        for sock in open_now:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self.lock:
            (self._sockets.add if add else self._sockets.discard)(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._spawn(self._serve, client)

    # -- one client connection -------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(IDLE_TIMEOUT_SECONDS)
        self._track(client, True)
        upstream: socket.socket | None = None
        upstream_in: BinaryIO | None = None
        client_in = client.makefile("rb")
        try:
            while not self._closed.is_set():
                head = _read_head(client_in)
                if head is None:
                    return
                fault = self.fault
                if fault == "blackhole":
                    self._count("blackhole")
                    self._hold()
                    return
                if fault == "reset":
                    self._count("reset")
                    _reset(client)
                    return
                headers = _headers(head)
                method, _, rest = head[0].partition(b" ")
                version = rest.rsplit(b" ", 1)[-1].strip()
                body = _read_body(client_in, headers)
                if fault is not None:
                    self._count(fault)
                    client.sendall(self._error(fault, method))
                    if _wants_close(headers, version):
                        return
                    continue
                if upstream is None or upstream_in is None:
                    upstream = socket.create_connection(
                        self.upstream, timeout=UPSTREAM_TIMEOUT_SECONDS
                    )
                    self._track(upstream, True)
                    upstream_in = upstream.makefile("rb")
                upstream.sendall(b"".join(head) + b"\r\n" + body)
                self._count("passed")  # before the client can see the answer
                keep = self._relay_response(upstream_in, client, method)
                if not keep or _wants_close(headers, version):
                    return
        except (_Closed, OSError, ValueError):
            return
        finally:
            client_in.close()
            if upstream is not None:
                if upstream_in is not None:
                    upstream_in.close()
                self._track(upstream, False)
                upstream.close()
            self._track(client, False)
            with suppress(OSError):
                client.close()

    def _relay_response(self, upstream_in: BinaryIO, client: socket.socket, method: bytes) -> bool:
        """Copy one response from upstream to the client; whether the connection may go on."""
        while True:
            head = _read_head(upstream_in)
            if head is None:
                raise _Closed("the upstream closed")
            status = int(head[0].split(b" ", 2)[1])
            headers = _headers(head)
            if 100 <= status < 200:
                client.sendall(b"".join(head) + b"\r\n")
                continue  # an interim answer: the real one follows
            break
        client.sendall(b"".join(head) + b"\r\n")
        if method == b"HEAD" or status in (204, 304):
            return not _wants_close(headers, b"HTTP/1.1")
        if "chunked" in headers.get("transfer-encoding", "").lower() or "content-length" in headers:
            client.sendall(_read_body(upstream_in, headers))
            return not _wants_close(headers, b"HTTP/1.1")
        while chunk := upstream_in.read(65536):  # delimited by the upstream's close
            client.sendall(chunk)
        return False

    def _error(self, fault: Fault, method: bytes) -> bytes:
        answer = _ANSWERS[fault]
        request_id = uuid.uuid4().hex[:16].upper()
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{answer.code}</Code><Message>{answer.message}</Message>"
            f"<RequestId>{request_id}</RequestId><HostId>faultproxy</HostId></Error>"
        ).encode()
        head = (
            f"HTTP/1.1 {answer.status} {answer.reason}\r\n"
            "Content-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"x-amz-request-id: {request_id}\r\n"
            "\r\n"
        ).encode()
        return head if method == b"HEAD" else head + body

    def _hold(self) -> None:
        """Answer nothing until the blackhole ends or the proxy closes."""
        while not self._closed.is_set() and self.fault == "blackhole":
            self._closed.wait(HOLD_POLL_SECONDS)

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1


# -- in a process of its own -------------------------------------------------------------------
#
# deltalake calls that wait for S3 while holding the GIL (DeltaTable.is_deltatable)
# would starve a proxy thread of the test's own process, so the proxy runs in a
# child process, driven over its stdin and stdout: one JSON command a line, one
# JSON answer a line. The child exits when its stdin closes (the test ended, or died).


class FaultProxy:
    """A :class:`ProxyServer` in a child process, and the commands that switch its faults.

    Args:
        upstream: the ``(host, port)`` of the server requests pass to.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        """The URL a client uses instead of the upstream's (``AWS_ENDPOINT_URL``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        """Start the child process and learn the port it bound."""
        host, port = self.upstream
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.fleet.faultproxy", host, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        self.port = int(self._read()["port"])
        return self

    def _read(self) -> dict[str, Any]:
        process = self._process
        if process is None or process.stdout is None:
            raise RuntimeError("the fault proxy is not running")
        ready, _, _ = select.select([process.stdout], [], [], COMMAND_TIMEOUT_SECONDS)
        if not ready:
            raise RuntimeError(f"the fault proxy did not answer within {COMMAND_TIMEOUT_SECONDS}s")
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fault proxy exited ({process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _command(self, **command: Any) -> dict[str, Any]:
        with self._lock:
            process = self._process
            if process is None or process.stdin is None:
                raise RuntimeError("the fault proxy is not running")
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()
            return self._read()

    def fail(self, fault: Fault, seconds: float | None = None) -> None:
        """Answer every request with ``fault`` from now on, for ``seconds`` (None: until healed)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self._command(op="fail", fault=fault, seconds=seconds)

    def heal(self) -> None:
        """Pass every request through again."""
        self._command(op="heal")

    @property
    def fault(self) -> Fault | None:
        """The fault in force now (None: passing through)."""
        fault: Fault | None = self._command(op="state")["fault"]
        return fault

    @property
    def counts(self) -> Counter[str]:
        """Requests seen, by what happened to them: ``passed`` or the fault's name."""
        return Counter(self._command(op="state")["counts"])

    def close(self) -> None:
        """Stop the child (closing its stdin ends it; a kill after a bounded wait)."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            with suppress(OSError):
                process.stdin.close()
        try:
            process.wait(timeout=COMMAND_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def fault_proxy(upstream_endpoint: str) -> Iterator[FaultProxy]:
    """A started :class:`FaultProxy` in front of ``http://host:port``, closed on exit."""
    host, _, port = upstream_endpoint.removeprefix("http://").rstrip("/").partition(":")
    with FaultProxy((host, int(port))) as proxy:
        yield proxy


def main(argv: list[str]) -> int:
    """The child: ``python -m tests.fleet.faultproxy UPSTREAM_HOST UPSTREAM_PORT``."""
    server = ProxyServer((argv[0], int(argv[1]))).start()

    def say(value: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    say({"port": server.port})
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "fail":
                server.fail(command["fault"], command["seconds"])
            elif command["op"] == "heal":
                server.heal()
            with server.lock:
                counts = dict(server.counts)
            say({"fault": server.fault, "counts": counts})
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
