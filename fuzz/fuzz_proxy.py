"""Fuzz target: the PROXY protocol header reader (``appliance/protocols/proxy.py``).

Run: ``python fuzz/fuzz_proxy.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; the payload is what a connection on a
``proxy_protocol`` listener starts with: a header, then whatever follows (a
TLS ClientHello, a protocol's first bytes). There are no rows: the header
only replaces the connection's peer address. The run fails on any exception
but ``RemoteProtocolError`` (the connection closes), and checks the reader's
contracts:

* fed in the harness's reads, and again in the reads
  :meth:`~appliance.protocols.proxy.ProxyHeaderReader.safe_read_size` asks
  for, the outcome is the same (the same header, or an error, or still
  incomplete), and the sized reads never read past the header;
* a header's ``trailing`` plus the unread reads are exactly the payload after
  ``header_bytes``, and the header alone parses to the same header;
* a named client re-encodes (v1 or v2) to the same endpoints;
* after the header or an error the reader refuses more input
  (``LocalProtocolError``, the appliance's misuse), and while incomplete it
  holds exactly what it was fed.

Flag bits: ``SMALL_LIMITS`` caps the v2 length at 36 bytes (an IPv6 address
block, no TLVs); none of the low five bits is used.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.protocols.errors import LocalProtocolError, RemoteProtocolError
    from appliance.protocols.proxy import (
        ProxyHeader,
        ProxyHeaderReader,
        encode_v1,
        encode_v2,
    )
    from fuzz.harness import SMALL_LIMITS, FuzzInput, fuzz_main

#: The v2 length cap with ``SMALL_LIMITS``: an IPv6 address block and nothing more.
SMALL_V2_PAYLOAD_BYTES: Final = 36

#: What a run ended with: a header (trailing cleared) and the bytes after it,
#: "error", or the bytes held of an incomplete header.
Outcome = tuple[ProxyHeader, bytes] | str | int


def _reader(small: bool) -> ProxyHeaderReader:
    if small:
        return ProxyHeaderReader(max_v2_payload_bytes=SMALL_V2_PAYLOAD_BYTES)
    return ProxyHeaderReader()


def _bare(header: ProxyHeader) -> ProxyHeader:
    return ProxyHeader(
        header.version, header.command, header.family, header.transport,
        header.source, header.destination, header.header_bytes, b"",
    )  # fmt: skip


def _refuses_more(reader: ProxyHeaderReader) -> None:
    assert reader.safe_read_size() == 0
    try:
        reader.receive(b"x")
    except LocalProtocolError:
        return
    raise AssertionError("the reader took bytes after it finished")


def _fed(reads: Sequence[bytes | bytearray], small: bool) -> Outcome:
    reader = _reader(small)
    held = 0
    for i, data in enumerate(reads):
        assert reader.safe_read_size() >= 1
        error: RemoteProtocolError | None
        try:
            header = reader.receive(data)
        except RemoteProtocolError as exc:
            error = exc
        else:
            error = None
        if error is not None:
            assert isinstance(error.reason, str), type(error.reason)
            assert error.reason
            _refuses_more(reader)
            return "error"
        held += len(data)
        if header is not None:
            assert isinstance(header.trailing, bytes), type(header.trailing)
            assert 0 < header.header_bytes <= held, (header.header_bytes, held)
            assert len(header.trailing) == held - header.header_bytes
            assert reader.buffered_bytes == 0
            _refuses_more(reader)
            rest = header.trailing + b"".join(bytes(r) for r in reads[i + 1 :])
            return _bare(header), rest
        assert reader.buffered_bytes == held, (reader.buffered_bytes, held)
    return held


def _sized(payload: bytes, small: bool) -> Outcome:
    """Reads of exactly ``safe_read_size`` bytes, as a listener that must not over-read."""
    reader = _reader(small)
    offset = 0
    while offset < len(payload):
        size = reader.safe_read_size()
        assert size >= 1, size
        chunk = payload[offset : offset + size]
        try:
            header = reader.receive(chunk)
        except RemoteProtocolError:
            return "error"
        offset += len(chunk)
        if header is not None:
            assert header.trailing == b"", "a sized read went past the header"
            assert header.header_bytes == offset
            return header, payload[offset:]
    return offset


def _same_endpoints(header: ProxyHeader) -> None:
    if header.source is None or header.destination is None:
        assert header.source is None
        assert header.destination is None
        return
    assert header.source.address.version == header.destination.address.version
    assert 0 <= header.source.port <= 0xFFFF
    assert 0 <= header.destination.port <= 0xFFFF
    str(header.source)
    encode = encode_v1 if header.version == 1 else encode_v2
    again = ProxyHeaderReader().receive(encode(header.source, header.destination))
    assert again is not None
    assert (again.source, again.destination) == (header.source, header.destination)


def run_one(data: bytes) -> None:
    """One connection's first bytes through the PROXY header reader (module docstring)."""
    fuzz = FuzzInput.parse(data)
    small = fuzz.has(SMALL_LIMITS)
    fed = _fed(fuzz.reads(), small)
    sized = _sized(fuzz.payload, small)
    assert fed == sized, (fed, sized)
    if isinstance(fed, tuple):
        header, rest = fed
        assert rest == fuzz.payload[header.header_bytes :]
        alone = _reader(small).receive(fuzz.payload[: header.header_bytes])
        assert alone == header, (alone, header)
        _same_endpoints(header)


if __name__ == "__main__":
    fuzz_main(run_one)
