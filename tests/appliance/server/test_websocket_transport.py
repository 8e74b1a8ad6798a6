"""appliance/server/transports/websocket.py: wsproto unmasks with VectorMasker, same bytes."""

from __future__ import annotations

import numpy  # noqa: F401  (loaded, as pyarrow loads it in the service: the vector path runs)
from hypothesis import given
from hypothesis import strategies as st
from wsproto import frame_protocol
from wsproto.frame_protocol import FrameDecoder, Opcode

from appliance.server.transports import websocket  # binds wsproto's masker name
from appliance.server.transports.websocket import VectorMasker

#: wsproto's own masker, kept before the binding replaced the module's name.
_WSPROTO = VectorMasker.__mro__[1]


def _masked_frame(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 65536:
        head = bytes([0x82, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x82, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def test_wsproto_builds_vector_maskers() -> None:
    assert websocket.VectorMasker is frame_protocol.XorMaskerSimple
    assert _WSPROTO.__module__ == "wsproto.frame_protocol"
    decoder = FrameDecoder(client=False)
    decoder.receive_bytes(_masked_frame(b"abcde", b"\x01\x02\x03\x04")[:6])
    assert decoder.process_buffer() is None  # the header only: no payload yet
    assert type(decoder.masker) is VectorMasker


@given(
    key=st.binary(min_size=4, max_size=4),
    parts=st.lists(st.binary(max_size=700), max_size=6),
)
def test_same_bytes_as_wsproto_read_by_read(key: bytes, parts: list[bytes]) -> None:
    ours, theirs = VectorMasker(key), _WSPROTO(key)
    for part in parts:  # the key carries over from read to read
        assert ours.process(bytearray(part)) == theirs.process(bytearray(part))


@given(
    payload=st.binary(max_size=3000),
    key=st.binary(min_size=4, max_size=4),
    cuts=st.lists(st.integers(1, 900), max_size=8),
)
def test_a_frame_cut_anywhere_decodes_to_its_payload(
    payload: bytes, key: bytes, cuts: list[int]
) -> None:
    frame = _masked_frame(payload, key)
    decoder = FrameDecoder(client=False)
    got = b""
    for size in [*cuts, len(frame)]:
        chunk, frame = frame[:size], frame[size:]
        decoder.receive_bytes(chunk)
        while (decoded := decoder.process_buffer()) is not None:
            assert decoded.opcode in (Opcode.BINARY, Opcode.CONTINUATION)
            got += bytes(decoded.payload)
            if decoded.frame_finished:
                break
    assert got == payload
