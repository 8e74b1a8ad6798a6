"""Reads the PROXY protocol header (v1, v2) a load balancer puts before a connection's data.

Spec: ``doc/proxy-protocol.txt`` in haproxy/haproxy at commit
50872daa6a857e82afc40b1c5161924aef4172d7 (the document's revision
2026/04/27); section numbers below are that document's. HAProxy's own
receiver (``conn_recv_proxy`` in ``src/connection.c``, same commit) settled
the points the text leaves open.

A :class:`ProxyHeaderReader` is fed whatever the transport read. It answers
``None`` (need more bytes) until the header is complete, then a frozen
:class:`ProxyHeader`: the client's address and port (``source``) and the
address it connected to (``destination``), or ``None`` for both when the
header says to use the connection's own addresses (v1 ``UNKNOWN``, v2
``LOCAL``, and v2 families this receiver does not map: UNSPEC, UDP, UNIX,
the fallback §2.2 allows). The bytes that followed the header in the last
read (the TLS ClientHello, or the protocol's first bytes) come back in
:attr:`ProxyHeader.trailing`; :meth:`ProxyHeaderReader.safe_read_size` says
how much a transport may read next without reading past the header at all.

Strict and bounded (§2: "any sequence which does not exactly match the
protocol must be discarded"):

* The first byte decides: ``P`` is v1, ``\\r`` is v2, anything else (a TLS
  record, a plaintext protocol) is refused at once; each further byte must
  continue the signature (``PROXY `` / the 12-byte v2 signature), so a wrong
  prefix never waits for more input.
* v1: one US-ASCII line of at most :data:`V1_MAX_LINE_BYTES` bytes, CRLF
  included, and nothing else ends it (a lone CR or LF is refused). ``TCP4``
  takes dotted-quad addresses, ``TCP6`` IPv6 text (``inet_ntop``'s
  forms, an embedded dotted quad included, no zone index), then two ports in
  0..65535; decimal numbers have no leading zeros (§2.1: "to avoid any
  possible confusion with octal numbers"); fields are separated by exactly
  one space. ``UNKNOWN`` may be followed by anything up to the CRLF, which
  is ignored (§2.1), but only after a space.
* v2: version 2, command LOCAL or PROXY, and one of the family/protocol
  bytes §2.2 lists (``0x00 0x11 0x12 0x21 0x22 0x31 0x32``). The length after
  the 16 fixed bytes is at most ``max_v2_payload_bytes``
  (:data:`MAX_V2_PAYLOAD_BYTES` by default) and, for PROXY, at least the
  family's address block. LOCAL discards the block whatever it holds
  (§2.2: "discard the protocol block including the family"). After the
  addresses of a PROXY header come TLVs: each is bounds-checked and skipped,
  they must end exactly where the header ends (as HAProxy requires), and a
  ``PP2_TYPE_CRC32C`` one is verified (§2.2.3: a receiver that supports it
  MUST check it). The rest, SSL and unknown types included, is ignored.

Invariants (the h11 way): input split at any byte gives the same result as
in one piece; the reader holds at most ``16 + max_v2_payload_bytes`` bytes of
header plus what the last read brought past it; a
:class:`~appliance.protocols.errors.RemoteProtocolError` (with ``reason``)
is the only exception :meth:`ProxyHeaderReader.receive` raises for any
input, and after it, or after the header, the reader takes nothing more
(:class:`~appliance.protocols.errors.LocalProtocolError`).

Security (§5) is the listener's part: a receiver must never guess whether a
header is there, and takes one only from trusted proxies
(docs/proxy-protocol.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Final, Literal

from appliance.protocols.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "CRC32C_TYPE",
    "MAX_V2_PAYLOAD_BYTES",
    "TLV_HEADER_BYTES",
    "V1_MAX_LINE_BYTES",
    "V1_PREFIX",
    "V2_FIXED_BYTES",
    "V2_SIGNATURE",
    "Command",
    "Endpoint",
    "Family",
    "ProxyHeader",
    "ProxyHeaderReader",
    "Transport",
    "crc32c",
    "encode_v1",
    "encode_v2",
]

#: Bytes a v1 line may take, CRLF included (§2.1: the worst case, ``UNKNOWN``
#: with two full IPv6 addresses and ports, is 107).
V1_MAX_LINE_BYTES: Final = 107
#: What every v1 header starts with.
V1_PREFIX: Final = b"PROXY "
#: The 12 bytes every v2 header starts with (§2.2).
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
#: Bytes of the v2 fixed part: signature, version/command, family/protocol, u16 length.
V2_FIXED_BYTES: Final = 16
#: Default cap, in bytes, on a v2 header's length field (addresses plus TLVs,
#: after the fixed 16). The spec's own ceiling is 65,535; HAProxy sends 12 or
#: 36 bytes of addresses and, unless told to add TLVs, nothing more; a few
#: hundred bytes of TLVs (ALPN, authority, unique id up to 128, SSL strings)
#: fit easily. Only a client certificate TLV needs more: raise it for that.
MAX_V2_PAYLOAD_BYTES: Final = 2048
#: Bytes of a TLV's type and length.
TLV_HEADER_BYTES: Final = 3
#: The TLV type of the header's CRC32c checksum (§2.2.3).
CRC32C_TYPE: Final = 0x03
#: Bytes of a CRC32c value.
_CRC32C_BYTES: Final = 4
#: Largest TCP/UDP port.
_MAX_PORT: Final = 65535
#: Longest IPv6 text: six hextets and a dotted quad.
_MAX_IPV6_TEXT: Final = 45
#: Shortest complete v1 line for each protocol token (addresses ``0.0.0.0`` /
#: ``::``, ports 0): bounds what :meth:`ProxyHeaderReader.safe_read_size` may ask for.
_V1_SHORTEST: Final = {
    b"TCP4": len(b"PROXY TCP4 0.0.0.0 0.0.0.0 0 0\r\n"),
    b"TCP6": len(b"PROXY TCP6 :: :: 0 0\r\n"),
    b"UNKNOWN": len(b"PROXY UNKNOWN\r\n"),
}
_V1_SHORTEST_ANY: Final = min(_V1_SHORTEST.values())
#: What may follow ``PROXY ``: each token with what must come next (``UNKNOWN``
#: may end the line at once or be followed by a space and anything).
_V1_TOKENS: Final = (b"TCP4 ", b"TCP6 ", b"UNKNOWN ", b"UNKNOWN\r")
_V1_TOKEN_BYTES: Final = max(len(t) for t in _V1_TOKENS)
#: Bytes a TCP4/TCP6 line may hold before its CRLF.
_V1_ADDRESS_CHARS: Final = frozenset(b"0123456789abcdefABCDEF:. ")
_DECIMAL: Final = frozenset("0123456789")
_IPV6_CHARS: Final = frozenset("0123456789abcdefABCDEF:.")


class Command(enum.Enum):
    """What the header says about the connection (§2.2; v1 headers are all PROXY)."""

    #: The proxy opened the connection itself (a health check): use its addresses.
    LOCAL = 0x0
    #: The connection is relayed on behalf of the client the header names.
    PROXY = 0x1


class Family(enum.Enum):
    """The address family of the relayed connection."""

    UNSPEC = 0x0
    INET = 0x1
    INET6 = 0x2
    UNIX = 0x3


class Transport(enum.Enum):
    """The socket type of the relayed connection."""

    UNSPEC = 0x0
    STREAM = 0x1
    DGRAM = 0x2


#: The v2 family/protocol bytes §2.2 lists; any other is refused.
_V2_FAMILIES: Final = frozenset({0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32})
#: Bytes of the v2 address block by family (§2.2).
_V2_ADDRESS_BYTES: Final = {Family.UNSPEC: 0, Family.INET: 12, Family.INET6: 36, Family.UNIX: 216}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An IP address and a port."""

    address: IPv4Address | IPv6Address
    port: int

    def __str__(self) -> str:
        """``address:port``, ``[address]:port`` for IPv6 (the listeners' ``peer`` form)."""
        if self.address.version == 6:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete, valid PROXY protocol header.

    ``source`` and ``destination`` are set only for a relayed TCP connection
    over IPv4 or IPv6 (v1 ``TCP4``/``TCP6``, v2 PROXY with ``0x11``/``0x21``);
    otherwise both are None and the connection's own addresses stand.
    """

    version: Literal[1, 2]
    command: Command
    family: Family
    transport: Transport
    #: The client: who connected to the proxy.
    source: Endpoint | None
    #: What the client connected to (the proxy's listening address).
    destination: Endpoint | None
    #: Bytes the header took on the wire.
    header_bytes: int
    #: Bytes after the header in the reads so far: the start of TLS or of the protocol.
    trailing: bytes

    @property
    def uses_connection_address(self) -> bool:
        """Whether the connection's own peer address stands (no client named)."""
        return self.source is None


class _State(enum.Enum):
    READING = enum.auto()
    DONE = enum.auto()
    FAILED = enum.auto()


class ProxyHeaderReader:
    """Reads one PROXY protocol header, v1 or v2, from the start of a connection.

    Args:
        max_v2_payload_bytes: the largest v2 length field accepted (bytes of
            addresses and TLVs after the 16 fixed bytes).

    Raises:
        ValueError: ``max_v2_payload_bytes`` outside 36..65535 (an IPv6
            address block must fit).
    """

    def __init__(self, *, max_v2_payload_bytes: int = MAX_V2_PAYLOAD_BYTES) -> None:
        if not _V2_ADDRESS_BYTES[Family.INET6] <= max_v2_payload_bytes <= 0xFFFF:
            raise ValueError("max_v2_payload_bytes must be within 36..65535")
        self._max_v2 = max_v2_payload_bytes
        self._buffer = bytearray()
        self._state = _State.READING

    @property
    def buffered_bytes(self) -> int:
        """Bytes held of a header not yet complete."""
        return len(self._buffer)

    def safe_read_size(self) -> int:
        """The most bytes the next read may take without reading past the header.

        At least 1 while the header is incomplete, 0 afterwards. A transport
        that reads only this much never has :attr:`ProxyHeader.trailing`
        bytes, so the socket is left exactly at the first byte after the
        header (v2: two or three reads; v1: about two bytes a read once the
        protocol token is known, since only the CRLF ends the line).
        """
        if self._state is not _State.READING:
            return 0
        buf = self._buffer
        have = len(buf)
        if have == 0 or buf[0] != V2_SIGNATURE[0]:
            # Empty, or v1 (anything else fails on the first byte).
            shortest = _V1_SHORTEST_ANY
            for token, length in _V1_SHORTEST.items():
                if buf.startswith(V1_PREFIX + token):
                    shortest = length
            ending = 1 if buf.endswith(b"\r") else 2
            return max(shortest - have, ending)
        if have < V2_FIXED_BYTES:
            return V2_FIXED_BYTES - have
        return V2_FIXED_BYTES + int.from_bytes(buf[14:16], "big") - have

    def receive(self, data: bytes | bytearray) -> ProxyHeader | None:
        """Feed bytes read from the connection.

        Returns:
            None while the header is incomplete; the header once it is.

        Raises:
            RemoteProtocolError: the bytes are not a valid header (``reason`` says why).
            LocalProtocolError: called again after the header or after an error.
        """
        if self._state is not _State.READING:
            raise LocalProtocolError(f"the PROXY header reader is {self._state.name.lower()}")
        self._buffer += data
        try:
            if not self._buffer:
                return None
            first = self._buffer[0]
            if first == V1_PREFIX[0]:
                header = self._parse_v1()
            elif first == V2_SIGNATURE[0]:
                header = self._parse_v2()
            else:
                raise RemoteProtocolError(_not_a_header(first))
        except RemoteProtocolError:
            self._state = _State.FAILED
            self._buffer.clear()
            raise
        if header is not None:
            self._state = _State.DONE
            self._buffer.clear()
        return header

    # -- v1 ----------------------------------------------------------------------------

    def _parse_v1(self) -> ProxyHeader | None:
        buf = self._buffer
        head = bytes(buf[: len(V1_PREFIX)])
        if not V1_PREFIX.startswith(head):
            raise RemoteProtocolError(f"PROXY v1: the line starts {head!r}, not {V1_PREFIX!r}")
        if len(head) < len(V1_PREFIX):
            return None
        token = bytes(buf[len(V1_PREFIX) : len(V1_PREFIX) + _V1_TOKEN_BYTES])
        if not any(t[: len(token)] == token[: len(t)] for t in _V1_TOKENS):
            raise RemoteProtocolError(
                f"PROXY v1: the protocol {token!r} is none of TCP4, TCP6, UNKNOWN"
            )
        window = bytes(buf[:V1_MAX_LINE_BYTES])
        cr = window.find(b"\r")
        lf = window.find(b"\n")
        if lf != -1 and (cr == -1 or lf < cr):
            raise RemoteProtocolError("PROXY v1: a bare LF in the line (only CRLF ends it)")
        if cr != -1 and cr + 1 < len(window) and window[cr + 1] != 0x0A:
            raise RemoteProtocolError("PROXY v1: a bare CR in the line (only CRLF ends it)")
        line = window[: cr if cr != -1 else len(window)]
        unknown = token[:1] == b"U"
        if not unknown:
            bad = next((b for b in line[len(V1_PREFIX) + 5 :] if b not in _V1_ADDRESS_CHARS), None)
            if bad is not None:
                raise RemoteProtocolError(f"PROXY v1: byte 0x{bad:02x} in an address line")
        if cr == -1 or cr + 1 >= len(window):
            if len(window) >= V1_MAX_LINE_BYTES:
                raise RemoteProtocolError(
                    f"PROXY v1: no CRLF within the first {V1_MAX_LINE_BYTES} bytes"
                )
            return None
        end = cr + 2
        trailing = bytes(buf[end:])
        fields = line[len(V1_PREFIX) :]
        if unknown:
            return ProxyHeader(
                1, Command.PROXY, Family.UNSPEC, Transport.UNSPEC, None, None, end, trailing
            )
        source, destination = _v1_endpoints(fields.decode("ascii"))
        family = Family.INET if fields.startswith(b"TCP4") else Family.INET6
        return ProxyHeader(
            1, Command.PROXY, family, Transport.STREAM, source, destination, end, trailing
        )

    # -- v2 ----------------------------------------------------------------------------

    def _parse_v2(self) -> ProxyHeader | None:
        buf = self._buffer
        have = len(buf)
        signature = bytes(buf[: len(V2_SIGNATURE)])
        if not V2_SIGNATURE.startswith(signature):
            raise RemoteProtocolError(
                f"PROXY v2: the signature starts {signature!r}, not {V2_SIGNATURE!r}"
            )
        if have <= len(V2_SIGNATURE):
            return None
        version, command_bits = buf[12] >> 4, buf[12] & 0x0F
        if version != 2:
            raise RemoteProtocolError(f"PROXY v2: version {version}, not 2")
        if command_bits not in (Command.LOCAL.value, Command.PROXY.value):
            raise RemoteProtocolError(
                f"PROXY v2: command 0x{command_bits:x} is neither LOCAL nor PROXY"
            )
        if have < 14:
            return None
        if buf[13] not in _V2_FAMILIES:
            raise RemoteProtocolError(
                f"PROXY v2: family/protocol byte 0x{buf[13]:02x} is not one the spec lists"
            )
        family, transport = Family(buf[13] >> 4), Transport(buf[13] & 0x0F)
        if have < V2_FIXED_BYTES:
            return None
        length = int.from_bytes(buf[14:16], "big")
        if length > self._max_v2:
            raise RemoteProtocolError(
                f"PROXY v2: the header announces {length} bytes after its first 16;"
                f" at most {self._max_v2} are accepted"
            )
        command = Command(command_bits)
        addresses = _V2_ADDRESS_BYTES[family]
        if command is Command.PROXY and length < addresses:
            raise RemoteProtocolError(
                f"PROXY v2: {length} bytes cannot hold the {family.name} addresses ({addresses})"
            )
        end = V2_FIXED_BYTES + length
        if have < end:
            return None  # §2.2: never parse an address before the whole block is in
        header = bytes(buf[:end])
        trailing = bytes(buf[end:])
        if command is Command.LOCAL:
            return ProxyHeader(2, command, family, transport, None, None, end, trailing)
        _check_tlvs(header, V2_FIXED_BYTES + addresses)
        source = destination = None
        if transport is Transport.STREAM and family in (Family.INET, Family.INET6):
            source, destination = _v2_endpoints(header, family)
        return ProxyHeader(2, command, family, transport, source, destination, end, trailing)


def _not_a_header(first: int) -> str:
    if first == 0x16:
        hint = "a TLS handshake: the client bypassed the proxy, or the proxy sends no PROXY header"
    else:
        hint = "neither 'PROXY' (v1) nor the v2 signature"
    return f"not a PROXY protocol header: the first byte 0x{first:02x} starts {hint}"


def _v1_endpoints(fields: str) -> tuple[Endpoint, Endpoint]:
    """``TCP4 src dst sport dport`` (or TCP6) as endpoints."""
    parts = fields.split(" ")
    if len(parts) != 5 or not all(parts):
        raise RemoteProtocolError(
            "PROXY v1: a TCP line needs 'protocol source destination sport dport',"
            " separated by single spaces"
        )
    protocol, src, dst, sport, dport = parts
    parse = _v1_ipv4 if protocol == "TCP4" else _v1_ipv6
    return Endpoint(parse(src), _v1_port(sport)), Endpoint(parse(dst), _v1_port(dport))


def _decimal(text: str, what: str) -> int:
    """A decimal number without leading zeros (§2.1)."""
    if not text or not set(text) <= _DECIMAL or len(text) > 5:
        raise RemoteProtocolError(f"PROXY v1: {what} {text!r} is not a decimal number")
    if len(text) > 1 and text[0] == "0":
        raise RemoteProtocolError(f"PROXY v1: {what} {text!r} has a leading zero")
    return int(text)


def _v1_port(text: str) -> int:
    port = _decimal(text, "port")
    if port > _MAX_PORT:
        raise RemoteProtocolError(f"PROXY v1: port {port} is over {_MAX_PORT}")
    return port


def _v1_ipv4(text: str) -> IPv4Address:
    octets = text.split(".")
    if len(octets) != 4:
        raise RemoteProtocolError(f"PROXY v1: {text!r} is not an IPv4 address (TCP4)")
    values = [_decimal(octet, "IPv4 octet") for octet in octets]
    if max(values) > 255:
        raise RemoteProtocolError(f"PROXY v1: {text!r} has an octet over 255")
    return IPv4Address(bytes(values))


def _v1_ipv6(text: str) -> IPv6Address:
    if len(text) > _MAX_IPV6_TEXT or ":" not in text or not set(text) <= _IPV6_CHARS:
        raise RemoteProtocolError(f"PROXY v1: {text!r} is not an IPv6 address (TCP6)")
    try:
        return IPv6Address(text)
    except ValueError as exc:
        raise RemoteProtocolError(f"PROXY v1: {text!r} is not an IPv6 address (TCP6)") from exc


def _v2_endpoints(header: bytes, family: Family) -> tuple[Endpoint, Endpoint]:
    start = V2_FIXED_BYTES
    size = 4 if family is Family.INET else 16
    kind = IPv4Address if family is Family.INET else IPv6Address
    src = kind(header[start : start + size])
    dst = kind(header[start + size : start + 2 * size])
    ports = start + 2 * size
    sport = int.from_bytes(header[ports : ports + 2], "big")
    dport = int.from_bytes(header[ports + 2 : ports + 4], "big")
    return Endpoint(src, sport), Endpoint(dst, dport)


def _check_tlvs(header: bytes, offset: int) -> None:
    """Walk the TLVs from ``offset`` to the end of ``header``; verify a CRC32c one."""
    crc_at = None
    while offset < len(header):
        if offset + TLV_HEADER_BYTES > len(header):
            raise RemoteProtocolError(
                f"PROXY v2: {len(header) - offset} bytes left after the TLVs, too few for one"
            )
        kind = header[offset]
        size = int.from_bytes(header[offset + 1 : offset + 3], "big")
        value_at = offset + TLV_HEADER_BYTES
        offset = value_at + size
        if offset > len(header):
            raise RemoteProtocolError(
                f"PROXY v2: TLV 0x{kind:02x} of {size} bytes runs past the header"
            )
        if kind == CRC32C_TYPE:
            if size != _CRC32C_BYTES or crc_at is not None:
                raise RemoteProtocolError("PROXY v2: a CRC32c TLV must be one, of 4 bytes")
            crc_at = value_at
    if crc_at is not None:
        sent = int.from_bytes(header[crc_at : crc_at + _CRC32C_BYTES], "big")
        zeroed = header[:crc_at] + bytes(_CRC32C_BYTES) + header[crc_at + _CRC32C_BYTES :]
        if crc32c(zeroed) != sent:
            raise RemoteProtocolError("PROXY v2: the header's CRC32c does not match")


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE: Final = _crc32c_table()


def crc32c(data: bytes | bytearray) -> int:
    """CRC32c (Castagnoli, RFC 4960 appendix B) of ``data``."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# -- encoding (what a proxy sends: tests, and a proxy of the appliance's own) ------------


def encode_v1(source: Endpoint | None, destination: Endpoint | None) -> bytes:
    """A v1 line: ``TCP4``/``TCP6`` for two endpoints of one family, ``UNKNOWN`` for None.

    Raises:
        LocalProtocolError: one endpoint missing, or the two of different families.
    """
    if source is None and destination is None:
        return b"PROXY UNKNOWN\r\n"
    if (
        source is None
        or destination is None
        or source.address.version != destination.address.version
    ):
        raise LocalProtocolError("encode_v1 needs two endpoints of one family, or none")
    protocol = "TCP4" if source.address.version == 4 else "TCP6"
    addresses = f"{source.address} {destination.address}"
    return f"PROXY {protocol} {addresses} {source.port} {destination.port}\r\n".encode("ascii")


def encode_v2(
    source: Endpoint | None,
    destination: Endpoint | None,
    *,
    tlvs: tuple[tuple[int, bytes], ...] = (),
    checksum: bool = False,
) -> bytes:
    """A v2 header: PROXY over TCP for two endpoints of one family, LOCAL for None.

    Args:
        tlvs: (type, value) pairs appended after the addresses.
        checksum: add a CRC32c TLV last.

    Raises:
        LocalProtocolError: one endpoint missing, or the two of different families.
    """
    if source is None and destination is None:
        ver_cmd, family, body = 0x20, 0x00, b""
    elif (
        source is None
        or destination is None
        or source.address.version != destination.address.version
    ):
        raise LocalProtocolError("encode_v2 needs two endpoints of one family, or none")
    else:
        ver_cmd, family = 0x21, (0x11 if source.address.version == 4 else 0x21)
        body = (
            source.address.packed
            + destination.address.packed
            + source.port.to_bytes(2, "big")
            + destination.port.to_bytes(2, "big")
        )
    for kind, value in tlvs:
        body += bytes([kind]) + len(value).to_bytes(2, "big") + value
    if checksum:
        body += bytes([CRC32C_TYPE]) + _CRC32C_BYTES.to_bytes(2, "big") + bytes(_CRC32C_BYTES)
    header = V2_SIGNATURE + bytes([ver_cmd, family]) + len(body).to_bytes(2, "big") + body
    if checksum:
        header = header[:-_CRC32C_BYTES] + crc32c(header).to_bytes(_CRC32C_BYTES, "big")
    return header
