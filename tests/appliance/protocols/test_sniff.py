"""What a plaintext client's first bytes on a TLS port say: appliance/protocols/sniff.py.

Real openings of each kind of client, cut at every byte: the listener peeks
at whatever has arrived, so the guess must not depend on how much has.
"""

from __future__ import annotations

import ssl
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.protocols.sniff import (
    FORWARD_REASON,
    LUMBERJACK_REASON,
    SNIFF_BYTES,
    TEXT_REASON,
    TLS_HANDSHAKE_RECORD,
    plaintext_guess,
)


def _client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello), made in memory."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="appliance.example")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _lumberjack_v2_json(sequence: int, payload: bytes) -> bytes:
    window = b"2W" + struct.pack(">I", 1)
    return window + b"2J" + struct.pack(">II", sequence, len(payload)) + payload


FORWARD_MESSAGE = msgpack.packb(["app.log", 1700000000, {"message": "hello"}])
FORWARD_FORWARD = msgpack.packb(["app.log", [[1700000000, {"message": "hello"}]] * 20])
FORWARD_ARRAY_16 = b"\xdc\x00\x03" + msgpack.packb("app.log")[0:8]
FORWARD_ARRAY_32 = b"\xdd\x00\x00\x00\x03" + msgpack.packb("app.log")[0:8]
FORWARD_JSON = b'["app.log", 1700000000, {"message": "hello"}]'
FORWARD_JSON_MAP = b'{"message": "hello"}\n'
LUMBERJACK_V1 = b"1W" + struct.pack(">I", 1) + b"1D" + struct.pack(">II", 1, 1)
LUMBERJACK_V2 = _lumberjack_v2_json(1, b'{"message": "hello"}')
HTTP_GET = b"GET /ingest HTTP/1.1\r\nHost: appliance\r\nUpgrade: websocket\r\n\r\n"
COURIER_JDAT = b"JDAT" + struct.pack(">I", 20) + b"\x00" * 16 + struct.pack(">I", 0)


@pytest.mark.parametrize(
    ("opening", "reason"),
    [
        (_client_hello(), None),
        (FORWARD_MESSAGE, FORWARD_REASON),
        (FORWARD_FORWARD, FORWARD_REASON),
        (FORWARD_ARRAY_16, FORWARD_REASON),
        (FORWARD_ARRAY_32, FORWARD_REASON),
        (FORWARD_JSON, FORWARD_REASON),
        (FORWARD_JSON_MAP, FORWARD_REASON),
        (LUMBERJACK_V1, LUMBERJACK_REASON),
        (LUMBERJACK_V2, LUMBERJACK_REASON),
        (HTTP_GET, TEXT_REASON),
        (COURIER_JDAT, TEXT_REASON),
        (
            b"\x00\x00\x00\x01",
            "the client's first byte 0x00 is not a TLS handshake: connect with TLS",
        ),
        (b"\xff\xfe", "the client's first byte 0xff is not a TLS handshake: connect with TLS"),
    ],
    ids=[
        "tls-client-hello",
        "forward-message",
        "forward-forward",
        "forward-array16",
        "forward-array32",
        "forward-json-array",
        "forward-json-map",
        "lumberjack-v1",
        "lumberjack-v2",
        "http",
        "courier",
        "binary-zero",
        "binary-ff",
    ],
)
def test_an_opening_cut_at_every_byte_gives_one_answer(opening: bytes, reason: str | None) -> None:
    assert plaintext_guess(b"") is None  # nothing arrived yet: nothing to tell
    for cut in range(1, len(opening) + 1):
        assert plaintext_guess(opening[:cut]) == reason, cut


def test_a_tls_client_hello_starts_with_a_handshake_record() -> None:
    assert _client_hello()[0] == TLS_HANDSHAKE_RECORD


@pytest.mark.parametrize("first", range(256), ids=lambda b: f"0x{b:02x}")
def test_every_first_byte_but_a_handshake_record_is_refused_with_a_reason(first: int) -> None:
    guess = plaintext_guess(bytes([first]))
    if first == TLS_HANDSHAKE_RECORD:
        assert guess is None
        return
    assert guess is not None
    assert "TLS" in guess  # every reason says what to do: use TLS
    expected = (
        FORWARD_REASON
        if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD) or first in b"[{"
        else LUMBERJACK_REASON
        if first in b"12"
        else TEXT_REASON
        if chr(first).isascii() and chr(first).isalpha()
        else f"the client's first byte 0x{first:02x} is not a TLS handshake: connect with TLS"
    )
    assert guess == expected


@given(st.binary(min_size=1, max_size=64))
def test_only_the_first_bytes_count(head: bytes) -> None:
    assert plaintext_guess(head) == plaintext_guess(head[:SNIFF_BYTES])
