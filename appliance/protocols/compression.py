"""Bounded decoders for the compressed bodies Logjam and Fluentd producers send.

Pure Python on purpose: small enough to audit, and every decoder takes the
largest output it may produce, checked *before* the output grows, so a
decompression bomb costs at most that many bytes. docs/logjam.md says where
each format comes from (skaes/logjam-tools ``src/logjam-util.c``, the agents).

* :func:`gunzip` - concatenated gzip members (Fluentd's CompressedPackedForward,
  through ``forward.gunzip_members``). Any number of members, each of any
  size (Fluentd writes one per buffer append), in time linear in the input:
  no member costs a copy of the input after it.
* :func:`inflate` - Logjam's compression method 1. logjam-tools compresses
  with zlib's ``compress()`` (RFC 1950), but the Ruby agent sends
  ``ActiveSupport::Gzip.compress`` output (RFC 1952) under the same id, so a
  body starting with the gzip magic ``1f 8b`` is read as gzip (one or more
  members), anything else as zlib.
* :func:`snappy_decompress` - method 2: raw Snappy (the block format with its
  varint length preamble, not the framing format), what ``snappy_compress``,
  Ruby's ``Snappy.deflate`` and Go's ``snappy.Encode`` write.
* :func:`lz4_prefixed_decompress` - method 3: a big-endian u32 with the
  uncompressed size, then one LZ4 block (``LZ4_compress_default``).

Each raises :class:`CompressionError` for data it cannot decode, and nothing
else (fuzz-tested). Throughput is that of Python loops over the sequences of
the compressed data (docs/logjam.md and bench/RESULTS.md give numbers); the
driver decodes large bodies in a worker thread.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

__all__ = [
    "GZIP_MAGIC",
    "CompressionError",
    "InvalidDataError",
    "OutputLimitError",
    "TruncatedError",
    "gunzip",
    "inflate",
    "lz4_block_decompress",
    "lz4_prefixed_decompress",
    "snappy_decompress",
]

#: The first two bytes of every gzip member (RFC 1952).
GZIP_MAGIC: Final = b"\x1f\x8b"
#: zlib's ``wbits`` for gzip (RFC 1952) framing.
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
#: Bytes of compressed input first handed to zlib for each gzip member or zlib
#: stream (doubled while the member goes on). An empty gzip member is 20 bytes.
_FIRST_SLICE_BYTES: Final = 64
#: Snappy's length preamble is a varint of at most 32 bits: 5 bytes.
_SNAPPY_MAX_VARINT_BYTES: Final = 5
#: The LZ4 size prefix of Logjam's method 3.
_U32_BE: Final = struct.Struct(">I")
#: A literal or match length of 15 in an LZ4 token continues in extra bytes.
_LZ4_EXTENDED: Final = 15
#: The shortest LZ4 match.
_LZ4_MIN_MATCH: Final = 4


class CompressionError(ValueError):
    """Compressed data that cannot be decoded, or whose output passes the limit."""


class OutputLimitError(CompressionError):
    """The output would pass the limit the caller gave."""


class TruncatedError(CompressionError):
    """The compressed data ends before the end of its stream."""


class InvalidDataError(CompressionError):
    """zlib refused the data; ``detail`` is its message."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _check_limit(max_output: int) -> None:
    if max_output < 0:
        raise ValueError("max_output must not be negative")


# -- zlib and gzip -----------------------------------------------------------------


def _inflate_stream(
    data: bytes, max_output: int, wbits: int, *, members: bool, magic: bool = True
) -> bytes:
    """zlib (``members=False``) or one or more gzip members, at most ``max_output`` bytes.

    With ``members``, bytes after a member are the next member: when they start
    with the gzip magic, or always with ``magic=False`` (then zlib judges them).

    Work is linear in ``len(data)``: zlib is handed slices of a memoryview
    (no copy), and when a member ends zlib copies what is left of the slice
    into ``unused_data``. Slices start at :data:`_FIRST_SLICE_BYTES` for each
    member and double while it goes on, so that copy is at most about twice
    the member plus the first slice, never the rest of the input (which made
    many small members quadratic: 4 MiB of empty members took 14 s).
    """
    view = memoryview(data)
    end = len(view)
    pos = 0
    out = bytearray()
    try:
        while True:
            decompressor = zlib.decompressobj(wbits=wbits)
            size = _FIRST_SLICE_BYTES
            while True:
                piece = view[pos : pos + size]
                # One byte past the room left: output over the limit is seen at once.
                out += decompressor.decompress(piece, max_output - len(out) + 1)
                if len(out) > max_output:
                    raise OutputLimitError(f"decompressed body exceeds {max_output} bytes")
                if decompressor.eof:
                    pos += len(piece) - len(decompressor.unused_data)
                    break
                # Not at the end of the stream and under the output limit:
                # zlib took the whole slice (no unconsumed_tail).
                pos += len(piece)
                if pos >= end:
                    raise TruncatedError("the compressed body is truncated")
                size *= 2
            if pos >= end:
                return bytes(out)
            if not members or (magic and view[pos : pos + len(GZIP_MAGIC)].tobytes() != GZIP_MAGIC):
                raise CompressionError(f"{end - pos} bytes of garbage after the body")
    except zlib.error as exc:
        raise InvalidDataError(f"invalid compressed body: {exc}", str(exc)) from None


def inflate(data: bytes, max_output: int) -> bytes:
    """Logjam method 1: gzip when ``data`` starts with the gzip magic, else zlib.

    Raises:
        CompressionError: invalid, truncated or trailing data, or more than
            ``max_output`` bytes of output.
    """
    _check_limit(max_output)
    if data.startswith(GZIP_MAGIC):
        return _inflate_stream(data, max_output, _GZIP_WBITS, members=True)
    return _inflate_stream(data, max_output, zlib.MAX_WBITS, members=False)


def gunzip(data: bytes, max_output: int) -> bytes:
    """One or more concatenated gzip members, at most ``max_output`` bytes out.

    Whatever follows a member is read as the next member. Decompression is
    streamed and stops as soon as the output would pass ``max_output``.

    Raises:
        OutputLimitError: more than ``max_output`` bytes of output.
        TruncatedError: the data ends inside a member (or is empty).
        InvalidDataError: data that is not gzip.
    """
    _check_limit(max_output)
    return _inflate_stream(data, max_output, _GZIP_WBITS, members=True, magic=False)


# -- Snappy ------------------------------------------------------------------------


def _copy(out: bytearray, offset: int, length: int) -> None:
    """Append ``length`` bytes copied from ``offset`` back (the ranges may overlap)."""
    start = len(out) - offset
    if length <= offset:
        out += out[start : start + length]
        return
    pattern = bytes(out[start:])
    repeats = -(-length // offset)
    out += (pattern * repeats)[:length]


def snappy_decompress(data: bytes, max_output: int) -> bytes:
    """Decode raw Snappy (block format); the declared length must be at most ``max_output``.

    Raises:
        CompressionError: a malformed preamble or element, an offset before the
            start of the output, output longer or shorter than declared, or a
            declared length over ``max_output``.
    """
    _check_limit(max_output)
    view = memoryview(data)
    n = len(view)
    length = 0
    i = 0
    while True:
        if i >= n or i >= _SNAPPY_MAX_VARINT_BYTES:
            raise CompressionError("snappy: bad length preamble")
        byte = view[i]
        length |= (byte & 0x7F) << (7 * i)
        i += 1
        if not byte & 0x80:
            break
    if length > 0xFFFFFFFF:
        raise CompressionError("snappy: bad length preamble")
    if length > max_output:
        raise CompressionError(f"snappy: declared length {length} exceeds {max_output} bytes")
    out = bytearray()
    while i < n:
        tag = view[i]
        i += 1
        kind = tag & 3
        if kind == 0:  # literal
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                if i + extra > n:
                    raise CompressionError("snappy: truncated literal length")
                size = int.from_bytes(view[i : i + extra], "little")
                i += extra
            size += 1
            if i + size > n:
                raise CompressionError("snappy: truncated literal")
            if len(out) + size > length:
                raise CompressionError("snappy: output longer than declared")
            out += view[i : i + size]
            i += size
            continue
        if kind == 1:  # copy, 1-byte offset
            if i >= n:
                raise CompressionError("snappy: truncated copy")
            size = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | view[i]
            i += 1
        elif kind == 2:  # copy, 2-byte offset
            if i + 2 > n:
                raise CompressionError("snappy: truncated copy")
            size = (tag >> 2) + 1
            offset = view[i] | (view[i + 1] << 8)
            i += 2
        else:  # copy, 4-byte offset
            if i + 4 > n:
                raise CompressionError("snappy: truncated copy")
            size = (tag >> 2) + 1
            offset = int.from_bytes(view[i : i + 4], "little")
            i += 4
        if offset == 0 or offset > len(out):
            raise CompressionError(f"snappy: copy offset {offset} outside the output")
        if len(out) + size > length:
            raise CompressionError("snappy: output longer than declared")
        _copy(out, offset, size)
    if len(out) != length:
        raise CompressionError(f"snappy: {len(out)} bytes decoded, {length} declared")
    return bytes(out)


# -- LZ4 ---------------------------------------------------------------------------


def _lz4_length(view: memoryview, i: int, n: int) -> tuple[int, int]:
    """The extra length bytes after a nibble of 15: (added length, next index)."""
    total = 0
    while True:
        if i >= n:
            raise CompressionError("lz4: truncated length")
        byte = view[i]
        i += 1
        total += byte
        if byte != 255:
            return total, i


def lz4_block_decompress(data: bytes, max_output: int) -> bytes:
    """Decode one LZ4 block whose output is at most ``max_output`` bytes.

    Raises:
        CompressionError: a truncated sequence, an offset before the start of
            the output, or more than ``max_output`` bytes of output.
    """
    _check_limit(max_output)
    view = memoryview(data)
    n = len(view)
    out = bytearray()
    i = 0
    if n == 0:
        raise CompressionError("lz4: empty block")
    while True:
        if i >= n:
            raise CompressionError("lz4: truncated block")
        token = view[i]
        i += 1
        literals = token >> 4
        if literals == _LZ4_EXTENDED:
            more, i = _lz4_length(view, i, n)
            literals += more
        if i + literals > n:
            raise CompressionError("lz4: truncated literals")
        if len(out) + literals > max_output:
            raise CompressionError(f"lz4: output exceeds {max_output} bytes")
        out += view[i : i + literals]
        i += literals
        if i == n:
            return bytes(out)  # the last sequence has literals only
        if i + 2 > n:
            raise CompressionError("lz4: truncated match offset")
        offset = view[i] | (view[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(out):
            raise CompressionError(f"lz4: match offset {offset} outside the output")
        size = token & 0x0F
        if size == _LZ4_EXTENDED:
            more, i = _lz4_length(view, i, n)
            size += more
        size += _LZ4_MIN_MATCH
        if len(out) + size > max_output:
            raise CompressionError(f"lz4: output exceeds {max_output} bytes")
        _copy(out, offset, size)


def lz4_prefixed_decompress(data: bytes, max_output: int) -> bytes:
    """Logjam method 3: a big-endian u32 uncompressed size, then one LZ4 block.

    The size bounds the output, as the capacity of logjam-tools'
    ``LZ4_decompress_safe`` does: a block that decodes to fewer bytes is
    accepted, one that would decode to more is not.

    Raises:
        CompressionError: no prefix, a declared size over ``max_output``, or a
            block :func:`lz4_block_decompress` refuses.
    """
    _check_limit(max_output)
    if len(data) < _U32_BE.size:
        raise CompressionError("lz4: body shorter than its 4-byte size prefix")
    (declared,) = _U32_BE.unpack_from(data)
    if declared > max_output:
        raise CompressionError(f"lz4: declared size {declared} exceeds {max_output} bytes")
    return lz4_block_decompress(data[_U32_BE.size :], declared)
