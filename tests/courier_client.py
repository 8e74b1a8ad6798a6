"""A small Log Courier client, written from the protocol for tests and the bench.

No Log Courier client is packaged on the registries the project reaches
(docs/courier.md), so this one follows the first spec (``docs/Protocol.md``
in https://github.com/driskell/log-courier) and what the Go client there
does (``docs/courier.md`` cites
the files). It shares no code with the appliance's codec on purpose: a bug
the two shared would otherwise pass every test.

What it does, like the real client:

* opens TCP (TLS by default, verifying the server against a CA file), sends
  HELO in the Go layout (32 bytes, client id ``TEST`` unless told) and reads
  VERS; it sends EVNT only when VERS advertises it, else JDAT. ``legacy=True``
  skips the handshake, as Log Courier clients older than it did;
* sends payloads with a random 16-byte nonce (or the one it is given, for
  resends), and any number of them before waiting (pipelining);
* treats ACKNs as the Go client's ``payload.go`` does: a count that is not
  above the last one seen for the nonce changes nothing (a keepalive), a
  count at or above the payload's length completes it; every ACKN, partial
  or not, resets the network timeout (``publisher.go``);
* answers nothing itself; PING/PONG on request.

It is blocking (plain ``ssl`` sockets), so trio tests run it in a thread.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

HEADER = struct.Struct(">4sI")
U32 = struct.Struct(">I")
STREAMED = 0xFFFFFFFF
#: Seconds without any message from the server, while a payload waits, before
#: the client gives up (Log Courier's ``network timeout`` defaults to 15).
NETWORK_TIMEOUT_SECONDS = 15.0
#: Largest server message body the client accepts (the Ruby client's limit).
MAX_SERVER_BODY = 1024 * 1024


class CourierClientError(Exception):
    """The server broke the protocol, timed out or closed the connection."""


def encode(kind: bytes, body: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(body)) + body


def event_stream(events: Iterable[bytes]) -> bytes:
    """Events back to back, each with a u32 length (the uncompressed payload)."""
    return b"".join(U32.pack(len(e)) + e for e in events)


def jdat(nonce: bytes, events: Iterable[bytes], level: int = 3) -> bytes:
    """A JDAT message: length = nonce + compressed data."""
    compressed = zlib.compress(event_stream(events), level)
    return encode(b"JDAT", nonce + compressed)


def evnt(nonce: bytes, events: Iterable[bytes], level: int = 3) -> bytes:
    """An EVNT message: length 0xFFFFFFFF, nonce, a zlib stream that ends the message."""
    compressed = zlib.compress(event_stream(events), level)
    return HEADER.pack(b"EVNT", STREAMED) + nonce + compressed


def helo(client: bytes = b"TEST", version: tuple[int, int, int] = (2, 10, 0)) -> bytes:
    """HELO in the Go layout: flags[4], u32 major, minor, patch, client[4], reserved[12]."""
    body = b"\x00\x00\x00\x00" + struct.pack(">III", *version) + client + bytes(12)
    return encode(b"HELO", body)


def as_json(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


@dataclass
class Pending:
    """A payload sent and not yet fully acknowledged."""

    nonce: bytes
    count: int
    sent_at: float
    last_sequence: int = 0
    #: Counts of the ACKNs that did not complete the payload, in arrival order.
    partials: list[int] = field(default_factory=list)
    acked_at: float | None = None

    @property
    def complete(self) -> bool:
        return self.acked_at is not None


@dataclass
class Vers:
    flags: bytes
    version: tuple[int, int, int]
    server: bytes

    @property
    def supports_evnt(self) -> bool:
        return bool(self.flags[0] & 0x01)


class CourierClient:
    """One connection to a Log Courier server.

    Args:
        host, port: where the server listens.
        ca_file: CA to verify the server with; None means plaintext TCP.
        server_hostname: the name the certificate must carry.
        legacy: skip HELO/VERS and send JDAT only (clients older than the handshake).
        use_evnt: None sends EVNT when VERS advertises it; False always JDAT.
        cert_file, key_file: a client certificate for mutual TLS.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        server_hostname: str = "localhost",
        legacy: bool = False,
        use_evnt: bool | None = None,
        client_id: bytes = b"TEST",
        cert_file: str | os.PathLike[str] | None = None,
        key_file: str | os.PathLike[str] | None = None,
        network_timeout: float = NETWORK_TIMEOUT_SECONDS,
    ) -> None:
        self.host, self.port = host, port
        self.ca_file = ca_file
        self.server_hostname = server_hostname
        self.legacy = legacy
        self.use_evnt = use_evnt
        self.client_id = client_id
        self.cert_file, self.key_file = cert_file, key_file
        self.network_timeout = network_timeout
        self.sock: socket.socket | None = None
        self.vers: Vers | None = None
        self.pending: dict[bytes, Pending] = {}
        self.pongs = 0
        self.unknown_replies = 0
        #: Every server message received, as (type, body), for tests.
        self.received: list[tuple[bytes, bytes]] = []
        self._buffer = bytearray()

    # -- connection --------------------------------------------------------------

    def connect(self) -> CourierClient:
        raw = socket.create_connection((self.host, self.port), timeout=self.network_timeout)
        if self.ca_file is not None:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            if self.cert_file is not None:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            self.sock = context.wrap_socket(raw, server_hostname=self.server_hostname)
        else:
            self.sock = raw
        if not self.legacy:
            self.sock.sendall(helo(self.client_id))
            kind, body = self.read_message()
            if kind == b"VERS":
                padded = body.ljust(32, b"\x00")
                major, minor, patch = struct.unpack(">III", padded[4:16])
                self.vers = Vers(padded[:4], (major, minor, patch), padded[16:20])
            elif kind != b"????":  # a server older than the handshake
                raise CourierClientError(f"unexpected {kind!r} in reply to HELO")
        return self

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def __enter__(self) -> CourierClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def streams(self) -> bool:
        """Whether payloads go out as EVNT."""
        if self.use_evnt is False or self.vers is None:
            return False
        return self.vers.supports_evnt

    # -- sending -----------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        assert self.sock is not None, "not connected"
        self.sock.sendall(data)

    def send_payload(
        self,
        events: list[bytes] | list[dict[str, Any]],
        nonce: bytes | None = None,
    ) -> bytes:
        """Send one payload (EVNT or JDAT); returns its nonce. Does not wait."""
        raw = [e if isinstance(e, bytes) else as_json(e) for e in events]
        nonce = nonce if nonce is not None else os.urandom(16)
        message = evnt(nonce, raw) if self.streams else jdat(nonce, raw)
        self.pending[nonce] = Pending(nonce, len(raw), time.monotonic())
        self.send_raw(message)
        return nonce

    def ping(self) -> None:
        self.send_raw(encode(b"PING"))

    # -- receiving -----------------------------------------------------------------

    def read_message(self) -> tuple[bytes, bytes]:
        """One whole message from the server, within the network timeout."""
        assert self.sock is not None, "not connected"
        self.sock.settimeout(self.network_timeout)
        while True:
            if len(self._buffer) >= HEADER.size:
                kind, length = HEADER.unpack_from(self._buffer)
                if length > MAX_SERVER_BODY:
                    raise CourierClientError(f"{kind!r} of {length} bytes is too large")
                if len(self._buffer) >= HEADER.size + length:
                    body = bytes(self._buffer[HEADER.size : HEADER.size + length])
                    del self._buffer[: HEADER.size + length]
                    self.received.append((kind, body))
                    return kind, body
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise CourierClientError(
                    f"no message from the server within {self.network_timeout}s"
                ) from None
            except (ssl.SSLError, OSError) as exc:
                raise CourierClientError(f"connection failed: {exc}") from None
            if not data:
                raise CourierClientError("the server closed the connection")
            self._buffer += data

    def _handle(self, kind: bytes, body: bytes, on_partial: Callable[[Pending, int], None]) -> None:
        if kind == b"ACKN":
            if len(body) != 20:
                raise CourierClientError(f"ACKN of {len(body)} bytes")
            nonce, sequence = body[:16], U32.unpack(body[16:])[0]
            payload = self.pending.get(nonce)
            if payload is None or payload.complete:
                return  # a nonce we do not wait for: ignored (spec "ACKN")
            if sequence >= payload.count:
                payload.last_sequence = sequence
                payload.acked_at = time.monotonic()
                return
            payload.partials.append(sequence)
            if sequence > payload.last_sequence:
                payload.last_sequence = sequence
            on_partial(payload, sequence)
        elif kind == b"PONG":
            self.pongs += 1
        elif kind == b"????":
            self.unknown_replies += 1
        else:
            raise CourierClientError(f"unexpected server message {kind!r}")

    def wait_acked(
        self,
        nonces: Iterable[bytes] | None = None,
        on_partial: Callable[[Pending, int], None] | None = None,
    ) -> list[Pending]:
        """Read until every given payload (default: all pending) is fully acknowledged.

        Every message from the server resets the network timeout, so a
        server that sends partial ACKNs keeps a slow commit alive.
        """
        wanted = list(nonces) if nonces is not None else list(self.pending)
        callback = on_partial or (lambda payload, count: None)
        while not all(self.pending[n].complete for n in wanted):
            kind, body = self.read_message()
            self._handle(kind, body, callback)
        return [self.pending.pop(n) for n in wanted]

    def wait_pong(self) -> None:
        before = self.pongs
        while self.pongs == before:
            kind, body = self.read_message()
            self._handle(kind, body, lambda payload, count: None)

    def publish(
        self, events: list[bytes] | list[dict[str, Any]], nonce: bytes | None = None
    ) -> Pending:
        """Send one payload and wait for its final ACKN."""
        sent = self.send_payload(events, nonce)
        (done,) = self.wait_acked([sent])
        return done
