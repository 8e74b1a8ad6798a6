"""What the hostile-client suite shares: the service, well-behaved clients, log and memory checks.

Every module of ``tests/hostile/`` runs ONE real ``appliance serve`` subprocess
(:class:`HostileService`, a module-scoped fixture in ``conftest.py``) with a
listener of every protocol: forward (TLS, no handshake), forward with the
shared-key handshake, Lumberjack, Log Courier and WebSocket over real TLS,
and Logjam over real ZeroMQ with CURVE. Credentials (a shared key, a CURVE
client key, a WebSocket token) are made with the real CLI code, in-process.

Each test runs its hostile input inside :func:`hostile_case`, which:

* starts a well-behaved client of the same protocol in a thread (:class:`GoodTraffic`):
  it sends small batches and waits for each ack, from ``127.0.0.1``, for the
  whole time the hostile input is sent, and at least :data:`GOOD_BATCHES_AFTER`
  batches after it;
* gives the hostile client its own loopback source address (``127.1.x.y``,
  :func:`next_address`: Linux routes all of ``127.0.0.0/8`` to ``lo``), so its
  rows (``peer`` column), its log lines (``peer=``) and the per-address
  connection limit are its own and nobody else's;
* afterwards asserts the service process is still up (``poll() is None``),
  every good batch is stored exactly once, no ``connection.failed`` /
  ``message.failed`` line was logged (that is the catch-all at the connection
  boundary: it keeps the service up, but it means an exception escaped a
  codec, which is a bug), and the memory bound below held.

Memory bound (asserted per test): the service's peak RSS during the test
(``VmHWM`` of ``/proc/PID/status``, reset to the current RSS before the test
by writing ``5`` to ``/proc/PID/clear_refs``) may exceed its RSS at the start
of the test by at most :data:`RSS_GROWTH_BOUND_BYTES` = 384 MiB. That is the
largest documented per-connection worst case under this suite's listener
limits plus headroom for the writer: forward decodes at most
``DECODE_MEMORY_FACTOR`` (120) bytes of Python objects per msgpack byte, and
its requests and decompressed entries are limited to 2 MiB here, so 240 MiB;
every other codec's documented factor times its limit here is below that
(Lumberjack: an unfinished window up to ``max_window_bytes``, 64 MiB, held
as text, about 1 to 3 times for ASCII JSON, plus 352 bytes per event; Log
Courier ``max_payload_memory_bytes`` 16 MiB; Logjam 16 x 2 MiB plus
containers; WebSocket about 30 x 1 MiB); plus 144 MiB for the writer's
Arrow conversion, the commit and allocator slack. The hostile inputs once found
(1.2 GiB for 16 MiB of msgpack, 1 GiB for a 33 KB Logjam body) are far
above it. The growth of every test is kept in :data:`RSS_GROWTH` and the
largest are printed at the end of the run (``conftest.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import itertools
import json
import os
import re
import socket
import ssl
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import msgpack
import zmq
from deltalake import DeltaTable
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.events import Message as WsMessage

from appliance.cli import main as cli_main
from appliance.protocols.logjam import Compression, pack_meta
from tests.conftest import ApplianceProcess, start_appliance
from tests.courier_client import CourierClient

MIB = 1024 * 1024
#: Peak RSS growth allowed during one test (module docstring), in bytes.
RSS_GROWTH_BOUND_BYTES = 384 * MIB
#: Peak RSS growth measured per test (test id -> bytes), for the run's summary.
RSS_GROWTH: dict[str, int] = {}
#: Seconds any single wait of this suite may take before it fails (a liveness
#: bound, never a timing assertion).
WAIT_SECONDS = 60.0
#: Good batches that must be acked after the hostile input was sent.
GOOD_BATCHES_AFTER = 2
#: Events per good batch.
GOOD_EVENTS = 3
#: Seconds between two good batches (keeps the table to a few hundred commits).
GOOD_PAUSE_SECONDS = 0.05

# -- the service's limits (small, so the suite stays fast) ------------------------

MAX_CONNECTIONS_PER_ADDRESS = 4
REQUEST_TIMEOUT_SECONDS = 2
TLS_HANDSHAKE_TIMEOUT_SECONDS = 3
FORWARD_MAX_REQUEST_BYTES = 2 * MIB
FORWARD_MAX_DECOMPRESSED_BYTES = 2 * MIB
LUMBERJACK_MAX_FRAME_BYTES = 1 * MIB
LUMBERJACK_MAX_DECOMPRESSED_BYTES = 4 * MIB
LUMBERJACK_MAX_WINDOW_SIZE = 10_000
COURIER_MAX_PAYLOAD_BYTES = 1 * MIB
COURIER_MAX_DECOMPRESSED_BYTES = 4 * MIB
COURIER_MAX_EVENTS = 100_000
LOGJAM_MAX_BODY_BYTES = 1 * MIB
LOGJAM_MAX_DECOMPRESSED_BYTES = 2 * MIB
WEBSOCKET_MAX_MESSAGE_BYTES = 1 * MIB
COURIER_TAG = "courier-default"
LUMBERJACK_TAG = "lumberjack-default"

WEBSOCKET_IDLE_TIMEOUT_SECONDS = 5
#: The proxied listener's header deadline (short: the slow-header test waits it out).
PROXY_HEADER_TIMEOUT_SECONDS = 2
#: The client a good proxied connection's header names (documentation range, RFC 5737).
PROXIED_CLIENT = "192.0.2.44"
_TCP_LIMITS = (
    f"request_timeout_seconds = {REQUEST_TIMEOUT_SECONDS}\n"
    f"tls_handshake_timeout_seconds = {TLS_HANDSHAKE_TIMEOUT_SECONDS}\n"
    f"max_connections_per_address = {MAX_CONNECTIONS_PER_ADDRESS}\n"
)
_TCP_COMMON = "idle_timeout_seconds = 30\n" + _TCP_LIMITS


def listener_bodies() -> dict[str, str]:
    """Every listener of the suite's service (name -> TOML body; ``bind`` is added)."""
    forward_limits = (
        f"udp_heartbeat = false\nmax_request_bytes = {FORWARD_MAX_REQUEST_BYTES}\n"
        f"max_decompressed_bytes = {FORWARD_MAX_DECOMPRESSED_BYTES}\n"
        "max_events_per_request = 100000\n"
    )
    return {
        "forward": 'protocol = "forward"\n' + forward_limits + _TCP_COMMON,
        # Behind a balancer: every connection starts with a PROXY header; the good client
        # (127.0.0.1) and the hostile ones (next_address: 127.1.x.y) are trusted proxies.
        "forward_proxied": 'protocol = "forward"\nproxy_protocol = true\n'
        'trusted_proxies = ["127.0.0.1/32", "127.1.0.0/16"]\n'
        f"proxy_header_timeout_seconds = {PROXY_HEADER_TIMEOUT_SECONDS}\n"
        + forward_limits
        + _TCP_COMMON,
        "forward_secure": 'protocol = "forward"\nsecurity = "shared_key"\n'
        'self_hostname = "appliance.test"\nhandshake_timeout_seconds = 5\n'
        "free_failed_handshakes = 1000\n" + forward_limits + _TCP_COMMON,
        "lumberjack": 'protocol = "lumberjack"\n'
        f"max_frame_bytes = {LUMBERJACK_MAX_FRAME_BYTES}\n"
        f"max_decompressed_bytes = {LUMBERJACK_MAX_DECOMPRESSED_BYTES}\n"
        f"max_window_size = {LUMBERJACK_MAX_WINDOW_SIZE}\n"
        f'keepalive_seconds = 1\ntag = "{LUMBERJACK_TAG}"\n' + _TCP_COMMON,
        "courier": 'protocol = "courier"\n'
        f"max_payload_bytes = {COURIER_MAX_PAYLOAD_BYTES}\n"
        f"max_decompressed_bytes = {COURIER_MAX_DECOMPRESSED_BYTES}\n"
        f"max_events = {COURIER_MAX_EVENTS}\nmax_payload_memory_bytes = {16 * MIB}\n"
        f'keepalive_seconds = 1\ntag = "{COURIER_TAG}"\n' + _TCP_COMMON,
        "logjam": 'protocol = "logjam"\ntls = false\n'
        'pull_bind = "127.0.0.1:0"\n'
        f"max_body_bytes = {LOGJAM_MAX_BODY_BYTES}\n"
        f"max_decompressed_bytes = {LOGJAM_MAX_DECOMPRESSED_BYTES}\n"
        f"max_message_bytes = {LOGJAM_MAX_BODY_BYTES + 64 * 1024}\n"
        "handshake_timeout_seconds = 5\n",
        "websocket": 'protocol = "websocket"\n'
        f"max_message_bytes = {WEBSOCKET_MAX_MESSAGE_BYTES}\n"
        f"idle_timeout_seconds = {WEBSOCKET_IDLE_TIMEOUT_SECONDS}\n" + _TCP_LIMITS,
    }


# -- addresses ---------------------------------------------------------------------

_addresses = itertools.count(1)


def next_address() -> str:
    """A loopback address no other hostile client of this run has used (127.1.0.1, ...)."""
    n = next(_addresses)
    return f"127.1.{n // 250}.{n % 250 + 1}"


# -- logs --------------------------------------------------------------------------

_LOGFMT = re.compile(r'([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_logfmt(line: str) -> dict[str, str]:
    """One logfmt line (``appliance.logs``) as a dict of strings."""
    fields: dict[str, str] = {}
    for key, raw in _LOGFMT.findall(line):
        fields[key] = json.loads(raw) if raw.startswith('"') else raw
    return fields


#: Log events that close a stream connection because of what it sent, with a
#: reason. (``connection.refused``, the per-address limit, is not one: a test
#: that expects a protocol refusal must not pass on it.)
CLOSE_EVENTS = frozenset(
    {"protocol.error", "block.refused", "request.timeout", "handshake.timeout"}
)
#: Log events of the catch-alls: an exception escaped a codec or a driver.
BUG_EVENTS = frozenset({"connection.failed", "message.failed"})


# -- times every protocol with text times must treat alike --------------------------

#: ``@timestamp`` / ``time`` values that name no instant int64 nanoseconds hold,
#: or are not ASCII RFC 3339 (appliance/blocks/timefmt.py, docs/table.md).
BAD_TIMESTAMPS: list[object] = [
    "2024-01-01T00:00:0\u00b2Z",  # superscript two: str.isdigit() says yes, int() says no
    "2024-01-01T00:00:0\u0663Z",  # Arabic-Indic three
    "2024-01-01T00:00:0\uff13Z",  # fullwidth three
    "\uff12\uff10\uff12\uff14-01-01T00:00:00Z",  # fullwidth year
    "2024-01-01T00:00:00.\uff11\uff12\uff13Z",  # fullwidth fraction
    "2024-01-01T00:00:00.123\u0663Z",
    "2024-01-01T0\u00b9:00:00+01:00",  # superscript one in the hour, slow path
    "2024-01-01T00:00:00+0\u00b2:00",  # in the offset
    "0001-01-01T00:00:00Z",  # Go's zero time
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:00:00-14:00",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59.999999999+14:00",
    "9999-12-31T23:59:59.999999999-14:00",
    "2262-04-11T23:47:16.854775808Z",  # one ns past int64
    "1677-09-21T00:12:43.145224191Z",  # one ns before int64
    "2024-13-45T25:61:61Z",
    "2024-01-01T00:00:00." + "9" * 5000 + "Z",
    "",
]


def short_id(value: object) -> str:
    """A test id for a parameter: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: Times at the very ends of int64 nanoseconds: stored exactly.
EXTREME_TIMESTAMPS: list[tuple[str, int]] = [
    ("2262-04-11T23:47:16.854775807Z", 2**63 - 1),
    ("1677-09-21T00:12:43.145224192Z", -(2**63)),
    ("2262-04-12T09:47:16.854775807+10:00", 2**63 - 1),
]


# -- memory ------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise LookupError(f"{key} not in /proc/{pid}/status")


def reset_peak_rss(pid: int) -> int:
    """Reset the peak RSS (VmHWM) of ``pid`` to its current RSS; returns that RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss(pid: int) -> int:
    """The peak RSS (VmHWM) of ``pid`` since the last reset, in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


# -- the service -------------------------------------------------------------------


def _cli(config: Path, group: str, command: str, *args: str) -> str:
    """The real ``appliance`` CLI, in-process (no interpreter start-up per call).

    Options first and ``--`` before the arguments: a Z85 key may begin with ``-``.
    """
    out = io.StringIO()
    argv = [group, command, "--config", str(config), "--json", *(["--", *args] if args else [])]
    with contextlib.redirect_stdout(out):
        code = cli_main(argv)
    assert code == 0, f"appliance {' '.join(argv)} exited {code}: {out.getvalue()}"
    return out.getvalue()


@dataclass
class Credentials:
    shared_key: str
    curve_server_key: bytes
    curve_public: bytes
    curve_secret: bytes
    token: str


class HostileService:
    """The suite's ``appliance serve``, started again (new state) if a test took it down."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.starts = 0
        self.app: ApplianceProcess | None = None
        self.credentials: Credentials | None = None
        #: Why earlier instances died (a test that crashed the service).
        self.deaths: list[str] = []

    def start(self) -> None:
        index = self.starts
        self.starts += 1
        app = start_appliance(self.directory, listener_bodies(), index=index)
        config = self.directory / f"appliance{index}.toml"
        try:
            key = json.loads(_cli(config, "key", "generate", "fleet"))["secret"]
            server_key = json.loads(_cli(config, "curve", "server-key"))["public_key"]
            public, secret = zmq.curve_keypair()
            _cli(config, "curve", "add", "good-producer", public.decode())
            token = json.loads(_cli(config, "token", "add", "good-sender"))["token"]
        except BaseException:
            app.stop()  # never leave a service running behind a failed fixture
            raise
        self.app = app
        self.credentials = Credentials(key, server_key.encode(), public, secret, token)

    def ensure_running(self) -> None:
        if self.app is None:
            self.start()
            return
        if self.app.process.poll() is not None:
            self.deaths.append(f"exit {self.app.process.returncode}")
            self.start()

    def stop(self) -> None:
        if self.app is not None:
            self.app.stop()

    # -- parts ---------------------------------------------------------------------

    @property
    def running(self) -> ApplianceProcess:
        assert self.app is not None
        return self.app

    @property
    def creds(self) -> Credentials:
        assert self.credentials is not None
        return self.credentials

    @property
    def pid(self) -> int:
        return self.running.process.pid

    def port(self, listener: str) -> int:
        return self.running.ports[listener]

    @property
    def logjam_pull_port(self) -> int:
        """The port the Logjam listener's PULL socket bound."""
        return self.port("logjam-pull")

    @property
    def ca_file(self) -> Path:
        return self.running.ca_file

    def alive(self) -> bool:
        return self.running.process.poll() is None

    # -- logs --------------------------------------------------------------------

    def log_mark(self) -> int:
        """The log's current length: lines after it belong to what happens next."""
        return self.running.log_path.stat().st_size

    def log_lines(self, mark: int = 0) -> list[dict[str, str]]:
        with open(self.running.log_path, "rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        return [parse_logfmt(line) for line in text.splitlines() if "event=" in line]

    def log_tail(self, mark: int = 0, lines: int = 40) -> str:
        with open(self.running.log_path, "rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_log(
        self, mark: int, match: Callable[[dict[str, str]], bool], timeout: float = 15.0
    ) -> dict[str, str] | None:
        """The first log line after ``mark`` that ``match``es, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for fields in self.log_lines(mark):
                if match(fields):
                    return fields
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    # -- rows --------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        columns = ["event_time_ns", "received_at", "protocol", "tag", "source", "peer", "host",
                   "record", "batch_id"]  # fmt: skip
        table = DeltaTable(self.running.table_uri).to_pyarrow_table(columns=columns)
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows


def rows_from(rows: list[dict[str, Any]], address: str) -> list[dict[str, Any]]:
    """The rows whose peer is ``address`` (any port; ZeroMQ's Peer-Address has none)."""
    return [r for r in rows if r["peer"] == address or r["peer"].startswith(address + ":")]


def received_at_ns(row: dict[str, Any]) -> int:
    """A row's ``received_at`` in epoch nanoseconds (the column holds microseconds)."""
    value: datetime = row["received_at"]
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def has_receive_time(row: dict[str, Any]) -> bool:
    """Whether the row's event time is its receive time (docs/table.md: no usable time)."""
    return bool(row["event_time_ns"] // 1000 * 1000 == received_at_ns(row))


def record(row: dict[str, Any]) -> Any:
    return json.loads(row["record"])


# -- sockets -----------------------------------------------------------------------


def tls_connect(
    service: HostileService, listener: str, source: str | None = None, *, timeout: float = 30
) -> ssl.SSLSocket:
    """A TLS connection to ``listener`` from ``source`` (a loopback address; None: any)."""
    raw = socket.create_connection(
        ("127.0.0.1", service.port(listener)),
        timeout=timeout,
        source_address=(source, 0) if source else None,
    )
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    context = ssl.create_default_context(cafile=str(service.ca_file))
    return context.wrap_socket(raw, server_hostname="localhost")


def peer_name(sock: socket.socket) -> str:
    """How the service names this client in ``peer=`` (``address:port``)."""
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def send_ignoring_close(sock: socket.socket, data: bytes) -> bool:
    """``sendall``; False when the service already closed the connection."""
    try:
        sock.sendall(data)
    except (OSError, ssl.SSLError):
        return False
    return True


def read_until_closed(sock: socket.socket, timeout: float = 30.0) -> tuple[bytes, bool]:
    """Everything the service sends until it closes; (bytes, closed within ``timeout``)."""
    received = bytearray()
    deadline = time.monotonic() + timeout
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except (OSError, ssl.SSLError):
            return bytes(received), True
        if not data:
            return bytes(received), True
        received += data
    return bytes(received), False


def read_until(
    sock: socket.socket, done: Callable[[bytes], bool], timeout: float = 30.0
) -> tuple[bytes, bool]:
    """Read until ``done(received)``, the service closes, or ``timeout``; (bytes, closed)."""
    received = bytearray()
    deadline = time.monotonic() + timeout
    while not done(bytes(received)) and (left := deadline - time.monotonic()) > 0:
        sock.settimeout(min(left, 1.0))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except (OSError, ssl.SSLError):
            return bytes(received), True
        if not data:
            return bytes(received), True
        received += data
    return bytes(received), False


def read_available(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the service sends within ``seconds``; (bytes, closed)."""
    received = bytearray()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except (OSError, ssl.SSLError):
            return bytes(received), True
        if not data:
            return bytes(received), True
        received += data
    return bytes(received), False


# -- well-behaved clients ------------------------------------------------------------


class GoodClient(Protocol):
    """One connection of a well-behaved client: a batch goes out, its ack comes back."""

    def send_batch(self, batch_id: str, events: int) -> None: ...

    def close(self) -> None: ...


def good_record(batch_id: str, i: int) -> dict[str, Any]:
    return {"good": batch_id, "i": i, "message": f"good event {i} of {batch_id} ünïcødé"}


class ForwardGood:
    """PackedForward with a chunk id, as out_forward with require_ack_response."""

    def __init__(self, service: HostileService, listener: str = "forward") -> None:
        self.sock = tls_connect(service, listener)
        self.sock.settimeout(WAIT_SECONDS)
        self.unpacker = msgpack.Unpacker(raw=False)

    def send_batch(self, batch_id: str, events: int) -> None:
        now = time.time_ns()
        entries = b"".join(
            msgpack.packb([msgpack.ExtType(0, struct.pack(">II", now // 10**9, now % 10**9)),
                           good_record(batch_id, i)])
            for i in range(events)
        )  # fmt: skip
        self.sock.sendall(
            msgpack.packb(["good.forward", entries, {"chunk": batch_id, "size": events}])
        )
        while True:
            for answer in self.unpacker:
                assert answer == {"ack": batch_id}, answer
                return
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("forward: the service closed the good connection")
            self.unpacker.feed(data)

    def close(self) -> None:
        self.sock.close()


def lumberjack_ack(sequence: int, version: int = 2) -> bytes:
    return str(version).encode() + b"A" + struct.pack(">I", sequence)


def j_frame(sequence: int, payload: bytes) -> bytes:
    return b"2J" + struct.pack(">II", sequence, len(payload)) + payload


def c_frame(inner: bytes, version: int = 2, level: int = 3) -> bytes:
    body = zlib.compress(inner, level)
    return str(version).encode() + b"C" + struct.pack(">I", len(body)) + body


def w_frame(count: int, version: int = 2) -> bytes:
    return str(version).encode() + b"W" + struct.pack(">I", count)


def read_lumberjack_acks(buffer: bytearray) -> list[tuple[int, int]]:
    """Complete ``A`` frames at the front of ``buffer`` (removed): (version, sequence)."""
    acks = []
    while len(buffer) >= 6:
        version, kind = buffer[0], buffer[1]
        if kind != ord("A"):
            raise AssertionError(f"unexpected frame {bytes(buffer[:2])!r} from the service")
        acks.append((version - ord("0"), struct.unpack(">I", buffer[2:6])[0]))
        del buffer[:6]
    return acks


class LumberjackGood:
    """What Filebeat sends: ``2W n``, a ``2C`` frame of ``n`` J frames numbered 1..n."""

    def __init__(self, service: HostileService) -> None:
        self.sock = tls_connect(service, "lumberjack")
        self.sock.settimeout(WAIT_SECONDS)
        self.buffer = bytearray()

    def send_batch(self, batch_id: str, events: int) -> None:
        frames = b"".join(
            j_frame(i + 1, json.dumps({"@metadata": {"beat": "good-beat"},
                                       "@timestamp": "2026-01-02T03:04:05.123456789Z",
                                       **good_record(batch_id, i)}).encode())
            for i in range(events)
        )  # fmt: skip
        self.sock.sendall(w_frame(events) + c_frame(frames))
        while True:
            for _, sequence in read_lumberjack_acks(self.buffer):
                if sequence == events:
                    return
                assert sequence == 0, f"ack {sequence} for a window of {events}"  # keepalive
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("lumberjack: the service closed the good connection")
            self.buffer += data

    def close(self) -> None:
        self.sock.close()


class CourierGood:
    """tests/courier_client.py: HELO/VERS, EVNT payloads, the final ACKN."""

    def __init__(self, service: HostileService) -> None:
        self.client = CourierClient(
            "127.0.0.1", service.port("courier"), ca_file=service.ca_file,
            network_timeout=WAIT_SECONDS,
        ).connect()  # fmt: skip

    def send_batch(self, batch_id: str, events: int) -> None:
        self.client.publish(
            [{"type": "good-courier", **good_record(batch_id, i)} for i in range(events)]
        )

    def close(self) -> None:
        self.client.close()


def logjam_dealer(
    service: HostileService, source: str | None = None, *, curve: bool = True
) -> zmq.Socket[bytes]:
    """A DEALER to the Logjam ROUTER (CURVE with the good producer's key unless told)."""
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    if curve:
        creds = service.creds
        dealer.curve_serverkey = creds.curve_server_key
        dealer.curve_publickey = creds.curve_public
        dealer.curve_secretkey = creds.curve_secret
    dealer.setsockopt(zmq.RCVTIMEO, int(WAIT_SECONDS * 1000))
    dealer.setsockopt(zmq.SNDTIMEO, int(WAIT_SECONDS * 1000))
    dealer.setsockopt(zmq.LINGER, 0)
    target = f"127.0.0.1:{service.port('logjam')}"
    dealer.connect(f"tcp://{source}:0;{target}" if source else f"tcp://{target}")
    return dealer


_logjam_sequence = itertools.count(1)


def logjam_meta(compression: int = Compression.NONE) -> bytes:
    return pack_meta(
        compression=Compression(compression),
        sequence=next(_logjam_sequence),
        created_ms=int(time.time() * 1000),
    )


class LogjamGood:
    """A Logjam agent's requests (``["", app-env, topic, body, meta]``), each awaiting 202."""

    def __init__(self, service: HostileService) -> None:
        self.dealer = logjam_dealer(service)

    def send_batch(self, batch_id: str, events: int) -> None:
        for i in range(events):
            body = json.dumps({"action": "Good#index", **good_record(batch_id, i)}).encode()
            self.dealer.send_multipart([b"", b"good-production", b"logs.good", body,
                                        logjam_meta()])  # fmt: skip
        for _ in range(events):
            reply = self.dealer.recv_multipart()
            # logjam-tools' device answers [app-env]["202 Accepted"] (docs/logjam.md).
            assert reply == [b"good-production", b"202 Accepted"], reply

    def close(self) -> None:
        self.dealer.close()


class WsClient:
    """A blocking WebSocket client (wsproto over ``ssl``) that can also send raw frames."""

    def __init__(
        self,
        service: HostileService,
        source: str | None = None,
        *,
        token: str | None = None,
        path: str = "/ingest",
    ) -> None:
        self.sock = tls_connect(service, "websocket", source)
        self.sock.settimeout(WAIT_SECONDS)
        self.peer = peer_name(self.sock)
        self.ws = WSConnection(ConnectionType.CLIENT)
        token = token if token is not None else service.creds.token
        headers = [(b"authorization", f"Bearer {token}".encode())]
        self.sock.sendall(self.ws.send(Request(host="localhost", target=path,
                                               extra_headers=headers)))  # fmt: skip
        self._events: list[Event] = []
        self._text: list[str] = []
        self.closed: CloseConnection | None = None
        event = self._next_event()
        if isinstance(event, RejectConnection | RejectData):
            raise ConnectionError(f"websocket refused: {event!r}")
        assert isinstance(event, AcceptConnection), event

    def _next_event(self) -> Event:
        while not self._events:
            try:
                data = self.sock.recv(65536)
            except (OSError, ssl.SSLError):
                data = b""
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                if isinstance(event, Ping):
                    self.sock.sendall(self.ws.send(event.response()))
                    continue
                self._events.append(event)
            if not data and not self._events:
                raise ConnectionError("websocket: the service closed the connection")
        return self._events.pop(0)

    def send_text(self, text: str) -> None:
        self.sock.sendall(self.ws.send(WsMessage(data=text)))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> str | CloseConnection:
        """The next whole text message, or the service's close."""
        while True:
            event = self._next_event()
            if isinstance(event, CloseConnection):
                self.closed = event
                with contextlib.suppress(OSError, ssl.SSLError, Exception):
                    self.sock.sendall(self.ws.send(event.response()))
                return event
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    text, self._text = "".join(self._text), []
                    return text
            elif isinstance(event, BytesMessage):
                raise AssertionError("the service sent a binary message")

    def receive_json(self) -> Any:
        answer = self.receive()
        assert isinstance(answer, str), f"closed: {answer!r}"
        return json.loads(answer)

    def close(self) -> None:
        self.sock.close()


def ws_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A client frame with the given opcode and payload (masked with a zero key: unchanged)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    return head + b"\x00\x00\x00\x00" + payload


class WebSocketGood:
    """``/ingest`` messages ``{"id", "tag", "events"}``, each awaiting ``{"ack": id}``."""

    def __init__(self, service: HostileService) -> None:
        self.client = WsClient(service)

    def send_batch(self, batch_id: str, events: int) -> None:
        records = [{"record": good_record(batch_id, i)} for i in range(events)]
        message = {"id": batch_id, "tag": "good.websocket", "events": records}
        self.client.send_text(json.dumps(message))
        assert self.client.receive_json() == {"ack": batch_id}

    def close(self) -> None:
        self.client.close()


def sha512_hex(*parts: bytes) -> str:
    digest = hashlib.sha512()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def forward_login(sock: ssl.SSLSocket, shared_key: str, hostname: str = "good-client") -> None:
    """The forward handshake (spec "Handshake Messages") with ``shared_key``; asserts the PONG."""
    unpacker = msgpack.Unpacker(raw=False)

    def read() -> Any:
        while True:
            for message in unpacker:
                return message
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("forward: the service closed during the handshake")
            unpacker.feed(data)

    helo = read()
    assert helo[0] == "HELO", helo
    nonce = helo[1]["nonce"]
    salt = os.urandom(16).hex().encode()
    digest = sha512_hex(salt, hostname.encode(), nonce, shared_key.encode())
    sock.sendall(msgpack.packb(["PING", hostname, salt, digest, "", ""]))
    pong = read()
    assert pong[:2] == ["PONG", True], pong


class ForwardProxiedGood(ForwardGood):
    """:class:`ForwardGood` relayed by a balancer: a PROXY v2 header names the client."""

    def __init__(self, service: HostileService) -> None:
        raw = socket.create_connection(("127.0.0.1", service.port("forward_proxied")), timeout=30)
        raw.sendall(proxy_v2_header(PROXIED_CLIENT))
        context = ssl.create_default_context(cafile=str(service.ca_file))
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.sock.settimeout(WAIT_SECONDS)
        self.unpacker = msgpack.Unpacker(raw=False)


def proxy_v2_header(client: str, port: int = 40000) -> bytes:
    """What HAProxy's ``send-proxy-v2`` sends first: ``client:port`` relayed to the appliance."""
    from appliance.protocols.proxy import Endpoint, encode_v2

    destination = Endpoint(ipaddress.ip_address("127.0.0.1"), 24224)
    return encode_v2(Endpoint(ipaddress.ip_address(client), port), destination)


class ForwardSecureGood(ForwardGood):
    """:class:`ForwardGood` on the listener with the shared-key handshake, logged in first."""

    def __init__(self, service: HostileService) -> None:
        super().__init__(service, "forward_secure")
        forward_login(self.sock, service.creds.shared_key)


GOOD_CLIENTS: dict[str, Callable[[HostileService], GoodClient]] = {
    "forward": ForwardGood,
    "forward_secure": ForwardSecureGood,
    "forward_proxied": ForwardProxiedGood,
    "lumberjack": LumberjackGood,
    "courier": CourierGood,
    "logjam": LogjamGood,
    "websocket": WebSocketGood,
}


@dataclass
class GoodTraffic:
    """A good client sending batch after batch in a thread, each after the last was acked."""

    client_factory: Callable[[], GoodClient]
    prefix: str = field(default_factory=lambda: f"good-{uuid.uuid4().hex[:12]}")
    acked: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)

    def _run(self) -> None:
        client: GoodClient | None = None
        try:
            client = self.client_factory()
            for n in itertools.count():
                if self._stop.is_set():
                    return
                batch_id = f"{self.prefix}-{n}"
                start = time.monotonic()
                client.send_batch(batch_id, GOOD_EVENTS)
                with self._progress:
                    self.latencies.append(time.monotonic() - start)
                    self.acked.append(batch_id)
                    self._progress.notify_all()
                self._stop.wait(GOOD_PAUSE_SECONDS)
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            with self._progress:
                self._progress.notify_all()
            if client is not None:
                with contextlib.suppress(OSError):
                    client.close()

    def _wait_for(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        with self._progress:
            while len(self.acked) < count and self.error is None and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._progress.wait(left)

    def __enter__(self) -> GoodTraffic:
        self._thread.start()
        self._wait_for(1)
        self._check(1, "before the hostile input")
        return self

    def _check(self, count: int, when: str) -> None:
        if self.error is not None:
            raise AssertionError(f"the good client failed {when}: {self.error!r}") from self.error
        if len(self.acked) < count:
            raise AssertionError(
                f"the good client got {len(self.acked)} acks {when}, not {count} "
                f"within {WAIT_SECONDS}s"
            )

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None:
                target = len(self.acked) + GOOD_BATCHES_AFTER
                self._wait_for(target)
                self._check(target, "after the hostile input")
        finally:
            self._stop.set()
            self._thread.join(WAIT_SECONDS)

    def assert_stored(self, rows: list[dict[str, Any]]) -> None:
        """Every acked batch is in ``rows`` exactly once: GOOD_EVENTS rows, i = 0..n-1."""
        mine = set(self.acked)
        seen: dict[str, list[int]] = {}
        for row in rows:
            if self.prefix not in row["record"]:
                continue
            data = json.loads(row["record"])
            batch = data.get("good")
            if isinstance(batch, str) and batch.startswith(self.prefix + "-"):
                seen.setdefault(batch, []).append(data["i"])
        missing = sorted(mine - set(seen))
        assert not missing, f"acked good batches not in the table: {missing}"
        for batch in mine:
            assert sorted(seen[batch]) == list(range(GOOD_EVENTS)), (batch, seen[batch])


# -- one hostile case ---------------------------------------------------------------


@dataclass
class Case:
    """What a hostile test needs: the service, its own source address and the log mark."""

    service: HostileService
    protocol: str
    address: str
    mark: int
    good: GoodTraffic
    #: Set by a test whose hostile input must leave no row from its address.
    expect_no_rows: bool = False
    #: The table read once when the case ends (one read per case: it is the slow part).
    final_rows: list[dict[str, Any]] | None = None

    def log_for(self, peer: str, events: frozenset[str] | set[str]) -> dict[str, str] | None:
        """The first line after the mark with one of ``events`` for exactly ``peer``."""
        return self.service.wait_log(
            self.mark, lambda f: f.get("event") in events and f.get("peer") == peer
        )

    def expect_closed_with_reason(
        self, sock: socket.socket, peer: str, *, timeout: float = 30.0, what: str = ""
    ) -> bytes:
        """The service closes ``sock`` and logs why; returns what it sent before closing.

        ``what`` names the input in failure messages.
        """
        received, closed = read_until_closed(sock, timeout)
        sock.close()
        assert closed, f"{what}: the hostile connection {peer} was not closed within {timeout}s"
        line = self.log_for(peer, CLOSE_EVENTS | BUG_EVENTS)
        assert line is not None, (
            f"{what}: no log line with a reason for {peer}:\n{self.service.log_tail(self.mark)}"
        )
        assert line["event"] not in BUG_EVENTS, f"{what}: an exception escaped for {peer}: {line}"
        assert line.get("reason") or line["event"] == "request.timeout", (what, line)
        return received

    def hostile_rows(self) -> list[dict[str, Any]]:
        """The rows from the case's address (as the case ended, when it has)."""
        rows = self.final_rows if self.final_rows is not None else self.service.rows()
        return rows_from(rows, self.address)


def expect_connection_refused(case: Case) -> None:
    """One more TCP connection from the case's address is closed at once, with a log line.

    For the listeners where the case's address already holds
    ``max_connections_per_address`` connections.
    """
    raw = socket.create_connection(
        ("127.0.0.1", case.service.port(case.protocol)), timeout=30,
        source_address=(case.address, 0),
    )  # fmt: skip
    peer = peer_name(raw)
    try:
        line = case.log_for(peer, {"connection.refused"})
        assert line is not None, case.service.log_tail(case.mark)
        assert "max_connections_per_address" in line.get("reason", ""), line
        received, closed = read_until_closed(raw, 10)
        assert closed, f"the refused connection {peer} stayed open"
        assert received == b""
    finally:
        raw.close()


@contextlib.contextmanager
def hostile_case(service: HostileService, protocol: str) -> Iterator[Case]:
    """Run a hostile input next to a good client of ``protocol``; check what must hold after."""
    service.ensure_running()
    app = service.running
    pid = app.process.pid
    mark = service.log_mark()
    rss_before = reset_peak_rss(pid)
    traffic = GoodTraffic(lambda: GOOD_CLIENTS[protocol](service))
    with traffic:
        case = Case(service, protocol, next_address(), mark, traffic)
        yield case
    assert app.process.poll() is None, (
        f"the service exited ({app.process.returncode}):\n{service.log_tail(mark)}"
    )
    growth = peak_rss(pid) - rss_before
    RSS_GROWTH[os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]] = growth
    assert growth <= RSS_GROWTH_BOUND_BYTES, (
        f"peak RSS grew by {growth / MIB:.0f} MiB (bound {RSS_GROWTH_BOUND_BYTES / MIB:.0f} MiB)"
    )
    case.final_rows = service.rows()
    traffic.assert_stored(case.final_rows)
    if case.expect_no_rows:
        assert case.hostile_rows() == [], "rows of a refused hostile input were stored"
    bugs = [f for f in service.log_lines(mark) if f.get("event") in BUG_EVENTS]
    assert not bugs, f"an exception escaped a codec or driver: {bugs}"
