"""Bounded decoders for the compressed bodies Logjam and Fluentd producers send.

Pure Python on purpose (zstd aside): small enough to audit, and every decoder
takes the largest output it may produce, checked *before* the output grows, so
a decompression bomb costs at most that many bytes. docs/logjam.md says where
each format comes from (skaes/logjam-tools ``src/logjam-util.c``, the agents);
docs/forward.md does for zstd.

* :func:`gunzip` - concatenated gzip members (Fluentd's CompressedPackedForward,
  through ``forward.gunzip_members``). Any number of members, each of any
  size (Fluentd writes one per buffer append), in time linear in the input:
  no member costs a copy of the input after it.
* :func:`unzstd` - one or more concatenated zstd frames (Fluentd's
  ``compressed: "zstd"``, through ``forward.unzstd_frames``): decoded by the
  ``zstandard`` library (libzstd), read out in bounded pieces, with the frame
  structure walked here so that data ending inside a frame is refused.
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

import zstandard

__all__ = [
    "GZIP_MAGIC",
    "ZSTD_MAGIC",
    "CompressionError",
    "InvalidDataError",
    "OutputLimitError",
    "TruncatedError",
    "gunzip",
    "inflate",
    "lz4_block_decompress",
    "lz4_prefixed_decompress",
    "snappy_decompress",
    "unzstd",
]

#: The first two bytes of every gzip member (RFC 1952).
GZIP_MAGIC: Final = b"\x1f\x8b"
#: The first four bytes of a zstd frame, little-endian (RFC 8878 3.1.1).
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
#: Skippable frames: a little-endian magic 0x184D2A50 to 0x184D2A5F, a u32
#: length, that many bytes (RFC 8878 3.1.2). libzstd skips them.
_ZSTD_SKIPPABLE_MAGIC: Final = 0x184D2A50
_ZSTD_SKIPPABLE_MASK: Final = 0xFFFFFFF0
_ZSTD_SKIPPABLE_HEADER: Final = struct.Struct("<II")
#: A frame header's size by its Frame_Header_Descriptor (RFC 8878 3.1.1.1):
#: magic and descriptor, Window_Descriptor unless Single_Segment (bit 5),
#: Dictionary_ID of 0/1/2/4 bytes (bits 0-1), Frame_Content_Size of 0/2/4/8
#: bytes (bits 6-7; 0 means 1 byte in a single-segment frame).
_ZSTD_HEADER_BYTES: Final = tuple(
    5 + (0 if d >> 5 & 1 else 1) + (0, 1, 2, 4)[d & 3] + ((0, 2, 4, 8)[d >> 6] or d >> 5 & 1)
    for d in range(256)
)
#: The 4-byte Content_Checksum after the last block, by the descriptor (bit 2).
_ZSTD_CHECKSUM_BYTES: Final = tuple(4 * (d >> 2 & 1) for d in range(256))
#: A block header, 3 bytes little-endian: Last_Block (bit 0), Block_Type
#: (bits 1-2: raw, RLE, compressed, reserved), Block_Size (bits 3-23).
_ZSTD_BLOCK_HEADER: Final = struct.Struct("<HB")
#: Block_Type bits 1-2 of a block header, as they are in its first byte.
_ZSTD_BLOCK_RLE: Final = 1 << 1
_ZSTD_BLOCK_RESERVED: Final = 3 << 1
#: Bytes of output asked of libzstd at a time (ZSTD_DStreamOutSize: one full
#: block), and never more than one byte past the room left under the limit.
_ZSTD_READ_BYTES: Final = zstandard.DECOMPRESSION_RECOMMENDED_OUTPUT_SIZE
#: The largest zstd window (history) accepted whatever the output limit:
#: windowLog 23, what zstd's non-"ultra" levels 1 to 19 use (Fluentd's
#: zstd-ruby streams at level 3: 2 MiB). A larger limit allows a window up to
#: that limit, for single-segment frames (window = content size, as Fluent
#: Bit's one-shot ZSTD_compress writes), up to libzstd's default cap (2**27).
_ZSTD_MIN_WINDOW_BYTES: Final = 1 << 23
_ZSTD_MAX_WINDOW_BYTES: Final = 1 << 27
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
    """zlib or libzstd refused the data; ``detail`` is its message."""

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


# -- zstd --------------------------------------------------------------------------


def unzstd(data: bytes, max_output: int) -> bytes:
    """One or more concatenated zstd frames, at most ``max_output`` bytes out.

    Skippable frames are skipped. Decompression is streamed: libzstd (the
    ``zstandard`` package) reads ``data`` in place, without a copy, and hands
    out at most :data:`_ZSTD_READ_BYTES` at a time, asked for no more than one
    byte past the room left, so a bomb stops with at most ``max_output + 1``
    bytes produced. The decoder's window is bounded too
    (:data:`_ZSTD_MIN_WINDOW_BYTES`, or the limit up to 128 MiB) and is only
    touched as output is written. Then :func:`_zstd_check_frames` walks the
    frame and block headers, which libzstd's streaming API does not report:
    data that ends inside a frame is refused instead of returning a prefix.
    Work is linear in ``len(data)``: one pass of libzstd, one of the walk
    (a Python step per frame and per block, each at least 3 bytes).

    Raises:
        OutputLimitError: more than ``max_output`` bytes of output.
        TruncatedError: the data ends inside a frame (or is empty).
        InvalidDataError: data that is not zstd, a corrupt frame, a bad
            checksum, a dictionary or a window the decoder does not allow.
    """
    _check_limit(max_output)
    window = max(_ZSTD_MIN_WINDOW_BYTES, min(max_output, _ZSTD_MAX_WINDOW_BYTES))
    decompressor = zstandard.ZstdDecompressor(max_window_size=window)
    pieces: list[bytes] = []
    total = 0
    try:
        with decompressor.stream_reader(data, read_across_frames=True) as reader:
            while True:
                piece = reader.read(min(_ZSTD_READ_BYTES, max_output - total + 1))
                if not piece:
                    break
                total += len(piece)
                if total > max_output:
                    raise OutputLimitError(f"decompressed body exceeds {max_output} bytes")
                pieces.append(piece)
    except zstandard.ZstdError as exc:
        detail = str(exc).removeprefix("zstd decompress error: ")
        raise InvalidDataError(f"invalid compressed body: {detail}", detail) from None
    _zstd_check_frames(data)
    return b"".join(pieces)


def _zstd_check_frames(data: bytes) -> None:
    """Check that ``data`` is whole zstd frames, by their headers (RFC 8878 3.1).

    Each frame: the magic, a Frame_Header_Descriptor giving the header's
    size, blocks of a 3-byte header (Last_Block, Block_Type, Block_Size)
    up to the last one, then a 4-byte checksum when the descriptor says so.
    The blocks' content is libzstd's to check; this only finds where frames
    end. A Python step per frame and per block: about 1 s for 16 MiB of empty
    9-byte frames or of empty 3-byte blocks, the worst cases (a Python loop,
    like the other decoders here; real frames have a block per 128 KiB of
    output at most, and a Fluentd chunk a frame per buffer append).

    Raises:
        TruncatedError: the data is empty or ends inside a frame.
        InvalidDataError: bytes where a frame should start that are not one.
    """
    end = len(data)
    if end == 0:
        raise TruncatedError("the compressed body is truncated")
    # Locals: this loop runs once per block.
    at_magic = data.startswith
    block_header = _ZSTD_BLOCK_HEADER.unpack_from
    header_bytes = _ZSTD_HEADER_BYTES
    checksum_bytes = _ZSTD_CHECKSUM_BYTES
    magic_end = len(ZSTD_MAGIC)  # the descriptor's offset in the frame
    rle = _ZSTD_BLOCK_RLE
    reserved = _ZSTD_BLOCK_RESERVED
    pos = 0
    while pos < end:
        if at_magic(ZSTD_MAGIC, pos):
            if pos + magic_end >= end:
                raise TruncatedError("the compressed body is truncated")
            descriptor = data[pos + magic_end]
            pos += header_bytes[descriptor]
            while True:
                if pos + 3 > end:
                    raise TruncatedError("the compressed body is truncated")
                low, high = block_header(data, pos)
                kind = low & 6  # Block_Type, as it is in the first byte
                if kind == rle:  # one byte, repeated Block_Size times
                    pos += 4
                elif kind == reserved:
                    raise InvalidDataError(
                        "invalid compressed body: reserved block type", "reserved block type"
                    )
                else:  # raw or compressed: Block_Size bytes
                    pos += 3 + ((low | high << 16) >> 3)
                if low & 1:  # Last_Block
                    break
            pos += checksum_bytes[descriptor]
        else:
            if end - pos < _ZSTD_SKIPPABLE_HEADER.size:
                # libzstd refuses a partial magic that is not a prefix of one.
                raise TruncatedError("the compressed body is truncated")
            magic, size = _ZSTD_SKIPPABLE_HEADER.unpack_from(data, pos)
            if magic & _ZSTD_SKIPPABLE_MASK != _ZSTD_SKIPPABLE_MAGIC:
                raise InvalidDataError(
                    "invalid compressed body: Unknown frame descriptor", "Unknown frame descriptor"
                )
            pos += _ZSTD_SKIPPABLE_HEADER.size + size
        if pos > end:
            raise TruncatedError("the compressed body is truncated")


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
