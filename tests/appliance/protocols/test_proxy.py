"""The PROXY protocol header reader (sans-IO), against HAProxy's doc/proxy-protocol.txt.

Headers are written out byte for byte here (the spec's own example lines,
and v2 headers packed by hand with ``struct``), not built with the module's
encoders, so the reader is checked against the spec and not against itself;
the encoders get their own round-trip tests. Every valid form is fed in one
piece, split at every byte into two reads, one byte at a time, as
``bytearray``, and in the reads :meth:`ProxyHeaderReader.safe_read_size`
asks for (which must never read past the header). Hostile inputs must raise
``RemoteProtocolError`` as soon as the offending byte arrives; hypothesis
feeds garbage, mutated headers and random cuts.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocols.errors import LocalProtocolError, RemoteProtocolError
from appliance.protocols.proxy import (
    MAX_V2_PAYLOAD_BYTES,
    V1_MAX_LINE_BYTES,
    Command,
    Endpoint,
    Family,
    ProxyHeader,
    ProxyHeaderReader,
    Transport,
    crc32c,
    encode_v1,
    encode_v2,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: §2.2's signature, typed out again here rather than imported.
SIG = bytes([0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A])
#: What follows the header in these samples: a TLS ClientHello's record header.
TLS_START = b"\x16\x03\x01\x02\x00\x01"


def v2(ver_cmd: int, fam: int, body: bytes, length: int | None = None) -> bytes:
    """A v2 header packed by hand."""
    size = len(body) if length is None else length
    return SIG + bytes([ver_cmd, fam]) + struct.pack(">H", size) + body


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack(">H", len(value)) + value


def ep(address: str, port: int) -> Endpoint:
    return Endpoint(ip_address(address), port)


IPV4_BLOCK = bytes([192, 168, 0, 1, 192, 168, 0, 11]) + struct.pack(">HH", 56324, 443)
IPV6_BLOCK = (
    bytes.fromhex("20010db8000000000000000000000001")
    + bytes.fromhex("20010db8000000000000000000000002")
    + struct.pack(">HH", 40000, 24224)
)
UNIX_BLOCK = b"/run/client.sock".ljust(108, b"\0") + b"/run/server.sock".ljust(108, b"\0")

#: An SSL TLV (§2.2.6): client bits, verify, then a version and a CN sub-TLV.
SSL_TLV = tlv(0x20, b"\x07" + b"\0\0\0\0" + tlv(0x21, b"TLSv1.3") + tlv(0x22, b"client.example"))


def with_crc(header: bytes) -> bytes:
    """``header`` with its last 4 bytes (a zeroed CRC32c TLV value) filled in."""
    return header[:-4] + struct.pack(">I", crc32c(header))


#: (name, header bytes, expected header fields: version, command, family,
#: transport, source, destination).
Expected = tuple[int, Command, Family, Transport, Endpoint | None, Endpoint | None]


def unmapped(family: Family, transport: Transport, command: Command = Command.PROXY) -> Expected:
    """A v2 header whose addresses the reader does not map to a client."""
    return 2, command, family, transport, None, None


V1_UNKNOWN: Expected = (1, Command.PROXY, Family.UNSPEC, Transport.UNSPEC, None, None)

# fmt: off
VALID: list[tuple[str, bytes, Expected]] = [
    # §2.1: the example line before an HTTP request.
    (
        "v1-spec-example",
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
        (1, Command.PROXY, Family.INET, Transport.STREAM,
         ep("192.168.0.1", 56324), ep("192.168.0.11", 443)),
    ),
    # §2.1: the longest TCP/IPv4 line (56 chars).
    (
        "v1-tcp4-longest",
        b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
        (1, Command.PROXY, Family.INET, Transport.STREAM,
         ep("255.255.255.255", 65535), ep("255.255.255.255", 65535)),
    ),
    (
        "v1-tcp4-zeros",
        b"PROXY TCP4 0.0.0.0 0.0.0.0 0 0\r\n",
        (1, Command.PROXY, Family.INET, Transport.STREAM, ep("0.0.0.0", 0), ep("0.0.0.0", 0)),
    ),
    # §2.1: the longest TCP/IPv6 line (104 chars), upper and lower case hex.
    (
        "v1-tcp6-longest",
        b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        b"FFFF:FFFF:FFFF:FFFF:FFFF:FFFF:FFFF:FFFF 65535 65535\r\n",
        (1, Command.PROXY, Family.INET6, Transport.STREAM,
         ep("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535),
         ep("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535)),
    ),
    # What inet_ntop (HAProxy's sender) writes: compressed zeros, a v4-mapped address.
    (
        "v1-tcp6-compressed",
        b"PROXY TCP6 2001:db8::1 ::ffff:127.0.0.1 40000 24224\r\n",
        (1, Command.PROXY, Family.INET6, Transport.STREAM,
         ep("2001:db8::1", 40000), ep("::ffff:127.0.0.1", 24224)),
    ),
    # §2.1: UNKNOWN, short form (15 chars) and worst case (107 chars, ignored).
    ("v1-unknown-short", b"PROXY UNKNOWN\r\n", V1_UNKNOWN),
    (
        "v1-unknown-worst-case",
        b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
        b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
        V1_UNKNOWN,
    ),
    ("v1-unknown-anything", b"PROXY UNKNOWN whatever \x00\xff follows\r\n", V1_UNKNOWN),
    # §2.2: each family/protocol byte the spec lists, with the PROXY command.
    (
        "v2-tcp4",
        v2(0x21, 0x11, IPV4_BLOCK),
        (2, Command.PROXY, Family.INET, Transport.STREAM,
         ep("192.168.0.1", 56324), ep("192.168.0.11", 443)),
    ),
    (
        "v2-tcp6",
        v2(0x21, 0x21, IPV6_BLOCK),
        (2, Command.PROXY, Family.INET6, Transport.STREAM,
         ep("2001:db8::1", 40000), ep("2001:db8::2", 24224)),
    ),
    # UDP, UNIX and UNSPEC are valid but not mapped: the connection's address stands.
    ("v2-udp4", v2(0x21, 0x12, IPV4_BLOCK), unmapped(Family.INET, Transport.DGRAM)),
    ("v2-udp6", v2(0x21, 0x22, IPV6_BLOCK), unmapped(Family.INET6, Transport.DGRAM)),
    ("v2-unix-stream", v2(0x21, 0x31, UNIX_BLOCK), unmapped(Family.UNIX, Transport.STREAM)),
    ("v2-unix-dgram", v2(0x21, 0x32, UNIX_BLOCK), unmapped(Family.UNIX, Transport.DGRAM)),
    ("v2-proxy-unspec", v2(0x21, 0x00, b""), unmapped(Family.UNSPEC, Transport.UNSPEC)),
    # LOCAL (a health check): the block is skipped whatever it holds (§2.2:
    # "must not assume zero is presented for LOCAL connections").
    ("v2-local", v2(0x20, 0x00, b""), unmapped(Family.UNSPEC, Transport.UNSPEC, Command.LOCAL)),
    (
        "v2-local-with-addresses",
        v2(0x20, 0x11, IPV4_BLOCK + b"\x99\x99"),
        unmapped(Family.INET, Transport.STREAM, Command.LOCAL),
    ),
    # TLVs after the addresses: skipped, the CRC32c checked.
    (
        "v2-tcp4-tlvs",
        v2(
            0x21, 0x11,
            IPV4_BLOCK + tlv(0x01, b"h2") + tlv(0x02, b"logs.example") + tlv(0x04, b"")
            + tlv(0x05, bytes(128)) + SSL_TLV + tlv(0x30, b"ns") + tlv(0xE0, b"custom")
            + tlv(0xF8, b"future"),
        ),
        (2, Command.PROXY, Family.INET, Transport.STREAM,
         ep("192.168.0.1", 56324), ep("192.168.0.11", 443)),
    ),
    (
        "v2-tcp6-crc32c",
        with_crc(v2(0x21, 0x21, IPV6_BLOCK + tlv(0x04, b"pad") + tlv(0x03, bytes(4)))),
        (2, Command.PROXY, Family.INET6, Transport.STREAM,
         ep("2001:db8::1", 40000), ep("2001:db8::2", 24224)),
    ),
    (
        "v2-tcp4-crc32c-first",
        with_crc(v2(0x21, 0x11, IPV4_BLOCK + tlv(0x03, bytes(4)))),
        (2, Command.PROXY, Family.INET, Transport.STREAM,
         ep("192.168.0.1", 56324), ep("192.168.0.11", 443)),
    ),
]
# fmt: on

IDS = [name for name, _, _ in VALID]


def feed(
    chunks: Sequence[bytes | bytearray], reader: ProxyHeaderReader | None = None
) -> ProxyHeader:
    """Feed ``chunks`` until the header is complete; it must complete."""
    reader = reader or ProxyHeaderReader()
    for i, chunk in enumerate(chunks):
        header = reader.receive(chunk)
        if header is not None:
            rest = b"".join(bytes(c) for c in chunks[i + 1 :])
            return header if not rest else _with_trailing(header, header.trailing + rest)
    raise AssertionError(f"no header after {len(chunks)} reads")


def _with_trailing(header: ProxyHeader, trailing: bytes) -> ProxyHeader:
    return ProxyHeader(
        header.version, header.command, header.family, header.transport,
        header.source, header.destination, header.header_bytes, trailing,
    )  # fmt: skip


def check(header: ProxyHeader, data: bytes, expected: Expected, trailing: bytes) -> None:
    version, command, family, transport, source, destination = expected
    assert (header.version, header.command, header.family, header.transport) == (
        version, command, family, transport,
    )  # fmt: skip
    assert header.source == source
    assert header.destination == destination
    assert header.uses_connection_address is (source is None)
    assert header.header_bytes == len(data)
    assert header.trailing == trailing


@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=IDS)
def test_valid_header_in_one_read(name: str, data: bytes, expected: Expected) -> None:
    check(feed([data]), data, expected, b"")
    check(feed([data + TLS_START]), data, expected, TLS_START)


@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=IDS)
def test_valid_header_split_at_every_byte(name: str, data: bytes, expected: Expected) -> None:
    stream = data + TLS_START
    for cut in range(1, len(stream)):
        reader = ProxyHeaderReader()
        first = reader.receive(stream[:cut])
        if cut < len(data):
            assert first is None, cut
            assert reader.buffered_bytes == cut
            header = reader.receive(stream[cut:])
            assert header is not None
        else:
            assert first is not None, cut
            header = _with_trailing(first, first.trailing + stream[cut:])
        check(header, data, expected, TLS_START)


@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=IDS)
def test_valid_header_byte_by_byte_as_bytearray(name: str, data: bytes, expected: Expected) -> None:
    chunks = [bytearray(data[i : i + 1]) for i in range(len(data))] + [bytearray(TLS_START)]
    header = feed(chunks)
    check(header, data, expected, TLS_START)
    assert isinstance(header.trailing, bytes)


@pytest.mark.parametrize(("name", "data", "expected"), VALID, ids=IDS)
def test_safe_read_size_never_reads_past_the_header(
    name: str, data: bytes, expected: Expected
) -> None:
    stream = data + TLS_START
    reader = ProxyHeaderReader()
    offset = reads = 0
    header = None
    while header is None:
        size = reader.safe_read_size()
        assert size >= 1
        header = reader.receive(stream[offset : offset + size])
        offset += size
        reads += 1
    assert offset == len(data)
    check(header, data, expected, b"")
    assert reader.safe_read_size() == 0
    if header.version == 2:
        assert reads <= 3  # 15 bytes, the 16th, then the rest


def test_an_empty_read_changes_nothing() -> None:
    reader = ProxyHeaderReader()
    assert reader.receive(b"") is None
    assert reader.receive(b"PROXY ") is None
    assert reader.receive(b"") is None
    assert reader.buffered_bytes == 6


def test_a_truncated_header_waits_and_holds_its_bytes() -> None:
    """The reader cannot see EOF: the driver's deadline or EOF ends a truncated header."""
    for data in (
        b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r",
        v2(0x21, 0x11, IPV4_BLOCK)[:-1],
    ):
        reader = ProxyHeaderReader()
        assert reader.receive(data) is None
        assert reader.buffered_bytes == len(data)
        assert reader.safe_read_size() == 1


def test_nothing_is_taken_after_the_header_or_an_error() -> None:
    reader = ProxyHeaderReader()
    assert reader.receive(b"PROXY UNKNOWN\r\n") is not None
    assert reader.buffered_bytes == 0
    with pytest.raises(LocalProtocolError, match="done"):
        reader.receive(b"x")
    reader = ProxyHeaderReader()
    with pytest.raises(RemoteProtocolError):
        reader.receive(b"GET / HTTP/1.1\r\n")
    assert reader.buffered_bytes == 0
    assert reader.safe_read_size() == 0
    with pytest.raises(LocalProtocolError, match="failed"):
        reader.receive(b"PROXY UNKNOWN\r\n")


def test_the_v2_length_limit_is_a_parameter() -> None:
    for bad in (35, 65536):
        with pytest.raises(ValueError, match="max_v2_payload_bytes"):
            ProxyHeaderReader(max_v2_payload_bytes=bad)
    body = IPV4_BLOCK + tlv(0x04, bytes(100))
    with pytest.raises(RemoteProtocolError, match="at most 36"):
        ProxyHeaderReader(max_v2_payload_bytes=36).receive(v2(0x21, 0x11, body))
    assert ProxyHeaderReader(max_v2_payload_bytes=len(body)).receive(v2(0x21, 0x11, body))
    big = IPV4_BLOCK + tlv(0x04, bytes(65535 - 12 - 3))
    assert ProxyHeaderReader(max_v2_payload_bytes=65535).receive(v2(0x21, 0x11, big))


# -- hostile inputs: each fails at its first wrong byte ---------------------------------------


def fails_at(data: bytes, match: str, **kwargs: int) -> int:
    """Feed ``data`` a byte at a time; return the index of the byte that raised."""
    reader = ProxyHeaderReader(**kwargs)
    for i in range(len(data)):
        try:
            header = reader.receive(data[i : i + 1])
        except RemoteProtocolError as exc:
            if match not in exc.reason:
                raise AssertionError(f"{exc.reason!r} does not say {match!r}") from exc
            # In one piece the same input fails too.
            with pytest.raises(RemoteProtocolError):
                ProxyHeaderReader(**kwargs).receive(data)
            return i
        assert header is None, f"{data!r} parsed as {header}"
    raise AssertionError(f"{data!r} did not fail")


@pytest.mark.parametrize(
    ("data", "at", "match"),
    [
        (TLS_START, 0, "TLS handshake"),
        (b"GET / HTTP/1.1\r\n", 0, "first byte 0x47"),
        (b"\x00PROXY", 0, "first byte 0x00"),
        (b'{"a": 1}', 0, "first byte 0x7b"),
        (b"POST / HTTP/1.1\r\n", 1, "starts b'PO'"),
        (b"proxy TCP4", 0, "first byte 0x70"),
        (b"PROXY\tTCP4", 5, "not b'PROXY '"),
        (b"PROXY  TCP4", 6, "none of TCP4"),
        (b"PROXY TCP5 1.2.3.4", 9, "none of TCP4"),
        (b"PROXY UDP4 1.2.3.4", 7, "none of TCP4"),
        (b"PROXY TCP4\r\n", 10, "none of TCP4"),
        (b"PROXY UNKNOWNX\r\n", 13, "none of TCP4"),
        (b"PROXY UNKNOWN\n", 13, "none of TCP4"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", 30, "bare LF"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n", 31, "bare CR"),
        (b"PROXY TCP4 1.2.3.4\n5.6.7.8 1 2\r\n", 18, "bare LF"),
        (b"PROXY UNKNOWN a\rb\r\n", 16, "bare CR"),
        (b"PROXY TCP4 1.2.3.4\t5.6.7.8 1 2\r\n", 18, "byte 0x09"),
        (b"PROXY TCP6 ::1%eth0 ::1 1 2\r\n", 14, "byte 0x25"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\xc2\xa0\r\n", 30, "byte 0xc2"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", 32, "single spaces"),
        (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", 32, "single spaces"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", 29, "single spaces"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", 33, "single spaces"),
        # Ports: range, sign, leading zeros (§2.1), length.
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", 35, "port 65536 is over"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n", 35, "port 99999 is over"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 080 443\r\n", 35, "port '080' has a leading zero"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 00 443\r\n", 34, "leading zero"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 0000001 2\r\n", 37, "not a decimal number"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 a 2\r\n", 31, "not a decimal number"),
        # IPv4: leading zeros, range, octet count; a family mismatch either way.
        (b"PROXY TCP4 192.168.01.1 5.6.7.8 1 2\r\n", 36, "leading zero"),
        (b"PROXY TCP4 010.0.0.1 5.6.7.8 1 2\r\n", 33, "leading zero"),
        (b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", 33, "over 255"),
        (b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n", 29, "not an IPv4 address"),
        (b"PROXY TCP4 1.2.3.4.5 5.6.7.8 1 2\r\n", 33, "not an IPv4 address"),
        (b"PROXY TCP4 1..3.4 5.6.7.8 1 2\r\n", 30, "not a decimal number"),
        (b"PROXY TCP4 ::1 ::1 1 2\r\n", 23, "not an IPv4 address"),
        (b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n", 31, "not an IPv6 address"),
        (b"PROXY TCP6 ::1 5.6.7.8 1 2\r\n", 27, "not an IPv6 address"),
        (b"PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n", 37, "not an IPv6 address"),
        (b"PROXY TCP6 1::2::3 ::1 1 2\r\n", 27, "not an IPv6 address"),
        (b"PROXY TCP6 12345::1 ::1 1 2\r\n", 28, "not an IPv6 address"),
        (b"PROXY TCP6 ::ffff:1.2.3.04 ::1 1 2\r\n", 35, "not an IPv6 address"),
        # v2: the signature, then version, command, family/protocol, length.
        (SIG[:4] + b"\x01", 4, "signature"),
        (SIG[:11] + b"\x0b", 11, "signature"),
        (SIG + b"\x11\x11", 12, "version 1"),
        (SIG + b"\x31\x11", 12, "version 3"),
        (SIG + b"\x02\x11", 12, "version 0"),
        (SIG + b"\x22\x11", 12, "command 0x2"),
        (SIG + b"\x2f\x11", 12, "command 0xf"),
        (SIG + b"\x21\x01", 13, "byte 0x01"),
        (SIG + b"\x21\x10", 13, "byte 0x10"),
        (SIG + b"\x21\x13", 13, "byte 0x13"),
        (SIG + b"\x21\x41", 13, "byte 0x41"),
        (SIG + b"\x20\xff", 13, "byte 0xff"),
        (v2(0x21, 0x11, b"", length=0xFFFF), 15, "announces 65535 bytes"),
        (v2(0x21, 0x11, b"", length=MAX_V2_PAYLOAD_BYTES + 1), 15, "at most 2048"),
        (v2(0x21, 0x11, IPV4_BLOCK[:11]), 15, "11 bytes cannot hold the INET addresses"),
        (v2(0x21, 0x21, IPV6_BLOCK[:35]), 15, "35 bytes cannot hold the INET6"),
        (v2(0x21, 0x31, UNIX_BLOCK[:215]), 15, "215 bytes cannot hold the UNIX"),
        (v2(0x21, 0x12, IPV4_BLOCK[:4]), 15, "cannot hold the INET addresses"),
    ],
)
def test_hostile_input_fails_at_its_first_wrong_byte(data: bytes, at: int, match: str) -> None:
    assert fails_at(data, match) == at


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (IPV4_BLOCK + b"\x04", "1 bytes left after the TLVs"),
        (IPV4_BLOCK + b"\x04\x00", "2 bytes left after the TLVs"),
        (IPV4_BLOCK + b"\x04\x00\x05abcd", "TLV 0x04 of 5 bytes runs past"),
        (IPV4_BLOCK + tlv(0x04, b"") + b"\x20\xff\xff", "TLV 0x20 of 65535 bytes runs past"),
        (IPV4_BLOCK + tlv(0x03, bytes(3)), "CRC32c TLV must be one, of 4 bytes"),
        (IPV4_BLOCK + tlv(0x03, b"\xde\xad\xbe\xef"), "CRC32c does not match"),
        (IPV4_BLOCK + tlv(0x03, bytes(4)) + tlv(0x03, bytes(4)), "must be one"),
    ],
)
def test_hostile_tlvs(body: bytes, match: str) -> None:
    header = v2(0x21, 0x11, body)
    assert fails_at(header, match) == len(header) - 1


def test_a_flipped_bit_breaks_the_crc32c() -> None:
    good = with_crc(v2(0x21, 0x11, IPV4_BLOCK + tlv(0x03, bytes(4))))
    assert ProxyHeaderReader().receive(good) is not None
    for i in range(16, len(good) - 7):  # the addresses and the CRC TLV's type/length
        bad = bytearray(good)
        bad[i] ^= 0x01
        with pytest.raises(RemoteProtocolError):
            ProxyHeaderReader().receive(bytes(bad))


def test_v1_without_crlf_fails_at_the_107th_byte_not_before() -> None:
    line = b"PROXY UNKNOWN " + b"x" * 200
    assert fails_at(line, f"no CRLF within the first {V1_MAX_LINE_BYTES}") == V1_MAX_LINE_BYTES - 1
    # A CR as the 107th byte leaves no room for the LF.
    line = b"PROXY UNKNOWN " + b"x" * (V1_MAX_LINE_BYTES - 15) + b"\r\n"
    assert len(line) == V1_MAX_LINE_BYTES + 1
    assert fails_at(line, "no CRLF") == V1_MAX_LINE_BYTES - 1
    # A long TCP6 form (embedded dotted quads) that passes 107 bytes is refused.
    long6 = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255 " * 1
    line = long6 + b"ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255 65535 65535\r\n"
    assert fails_at(line, "no CRLF") == V1_MAX_LINE_BYTES - 1


def test_crc32c_known_answer() -> None:
    """RFC 3720 B.4's check value (the CRC32c of ASCII "123456789")."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA


# -- encoders -------------------------------------------------------------------------------


def test_encoders_write_the_spec_forms() -> None:
    src, dst = ep("192.168.0.1", 56324), ep("192.168.0.11", 443)
    assert encode_v1(src, dst) == b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
    assert encode_v1(None, None) == b"PROXY UNKNOWN\r\n"
    assert encode_v2(src, dst) == v2(0x21, 0x11, IPV4_BLOCK)
    assert encode_v2(None, None) == v2(0x20, 0x00, b"")
    assert encode_v2(src, dst, tlvs=((0x04, b"ab"),)) == v2(0x21, 0x11, IPV4_BLOCK + tlv(4, b"ab"))
    crc = encode_v2(src, dst, checksum=True)
    assert crc == with_crc(v2(0x21, 0x11, IPV4_BLOCK + tlv(0x03, bytes(4))))
    six = ep("2001:db8::1", 40000), ep("2001:db8::2", 24224)
    assert encode_v2(*six) == v2(0x21, 0x21, IPV6_BLOCK)
    assert encode_v1(*six) == b"PROXY TCP6 2001:db8::1 2001:db8::2 40000 24224\r\n"


@pytest.mark.parametrize("encode", [encode_v1, encode_v2])
def test_encoders_refuse_mixed_or_missing_endpoints(encode: object) -> None:
    assert callable(encode)
    with pytest.raises(LocalProtocolError):
        encode(ep("127.0.0.1", 1), ep("::1", 2))
    with pytest.raises(LocalProtocolError):
        encode(ep("127.0.0.1", 1), None)


def test_endpoint_text_is_the_listeners_peer_form() -> None:
    assert str(ep("127.0.0.1", 40000)) == "127.0.0.1:40000"
    assert str(ep("::1", 40000)) == "[::1]:40000"


# -- hypothesis -----------------------------------------------------------------------------

_IPV4 = st.builds(IPv4Address, st.integers(min_value=0, max_value=2**32 - 1))
_IPV6 = st.builds(IPv6Address, st.integers(min_value=0, max_value=2**128 - 1))
_PORT = st.integers(min_value=0, max_value=65535)
_PAIR = st.one_of(
    st.tuples(st.builds(Endpoint, _IPV4, _PORT), st.builds(Endpoint, _IPV4, _PORT)),
    st.tuples(st.builds(Endpoint, _IPV6, _PORT), st.builds(Endpoint, _IPV6, _PORT)),
)
_TLVS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=255).filter(lambda t: t != 3), st.binary(max_size=40)
    ),
    max_size=5,
).map(tuple)


def _cuts(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def _outcome(chunks: Sequence[bytes]) -> tuple[str, object]:
    reader = ProxyHeaderReader()
    for i, chunk in enumerate(chunks):
        try:
            header = reader.receive(chunk)
        except RemoteProtocolError as exc:
            return "error", type(exc.reason)
        if header is not None:
            rest = header.trailing + b"".join(chunks[i + 1 :])
            return "header", (_with_trailing(header, b""), rest)
    return "incomplete", reader.buffered_bytes


@FAST
@given(
    _PAIR,
    st.booleans(),
    _TLVS,
    st.booleans(),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=4),
)
def test_fuzz_round_trip_at_random_cuts(
    pair: tuple[Endpoint, Endpoint], v1: bool, tlvs: tuple[tuple[int, bytes], ...],
    checksum: bool, tail: bytes, cuts: list[int],
) -> None:  # fmt: skip
    source, destination = pair
    if v1:
        data = encode_v1(source, destination)
    else:
        data = encode_v2(source, destination, tlvs=tlvs, checksum=checksum)
    kind, value = _outcome(_cuts(data + tail, cuts))
    assert kind == "header"
    assert isinstance(value, tuple)
    header, rest = value
    assert (header.source, header.destination) == (source, destination)
    assert header.header_bytes == len(data)
    assert rest == tail


@FAST
@given(st.binary(max_size=300), st.lists(st.integers(), max_size=4))
def test_fuzz_garbage_parses_or_raises_remote_error(data: bytes, cuts: list[int]) -> None:
    assert _outcome(_cuts(data, cuts)) == _outcome([data])


_PREFIXES = st.sampled_from([data for _, data, _ in VALID])


@FAST
@given(
    _PREFIXES, st.integers(min_value=0), st.integers(min_value=0, max_value=255),
    st.binary(max_size=20), st.lists(st.integers(), max_size=3),
)  # fmt: skip
def test_fuzz_mutated_header_is_split_invariant(
    data: bytes, at: int, value: int, tail: bytes, cuts: list[int]
) -> None:
    mutated = bytearray(data + tail)
    mutated[at % len(data)] = value
    stream = bytes(mutated)
    whole = _outcome([stream])
    split = _outcome(_cuts(stream, cuts))
    assert split == whole
    if whole[0] == "header":
        header, rest = whole[1]  # type: ignore[misc]
        assert rest == stream[header.header_bytes :]
