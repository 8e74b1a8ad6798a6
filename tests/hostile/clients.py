"""Sockets and well-behaved clients of every protocol, and the frames the tests build."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import itertools
import json
import os
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import msgpack
import zmq
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

from appliance.protocols.logjam import Compression, pack_meta
from tests.courier_client import CourierClient
from tests.hostile.limits import PROXIED_CLIENT, WAIT_SECONDS
from tests.hostile.service import HostileService

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
    return read_until(sock, lambda _received: False, timeout)


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
    return read_until(sock, lambda _received: False, seconds)


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
