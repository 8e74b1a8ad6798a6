"""The ``compressed`` option's decoders (gzip, zstd), bounded, with the codec's errors.

Adapters of :mod:`appliance.protocols.compression` for CompressedPackedForward:
each stops at ``max_decompressed_bytes`` and raises
:class:`~appliance.protocols.errors.RemoteProtocolError` with the reason the
codec reports.
"""

from __future__ import annotations

from typing import Final

from appliance.protocols.compression import (
    GZIP_MAGIC,
    ZSTD_MAGIC,
    InvalidDataError,
    OutputLimitError,
    TruncatedError,
    gunzip,
    unzstd,
)
from appliance.protocols.errors import RemoteProtocolError

__all__ = ["ZSTD_MAX_EXPANSION", "gunzip_members", "unzstd_frames"]


def gunzip_members(data: bytes, limit: int) -> bytes:
    """Decompress one or several concatenated gzip members, at most ``limit`` bytes out.

    Spec "CompressedPackedForward": entries "MAY be a concatenated binary of
    multiple gzip binary strings". Decompression is streamed and stops as soon
    as the output would pass ``limit``, so a gzip bomb costs at most ``limit``;
    the work is linear in ``len(data)`` however many members it holds.

    Raises:
        RemoteProtocolError: invalid or truncated gzip data, or output over ``limit``.
    """
    try:
        return gunzip(data, limit)
    except OutputLimitError:
        raise RemoteProtocolError(
            f"decompressed entries exceed max_decompressed_bytes={limit}"
        ) from None
    except TruncatedError:
        raise RemoteProtocolError("gzip entries are truncated") from None
    except InvalidDataError as exc:
        raise RemoteProtocolError(f"gzip entries are invalid: {exc.detail}") from None


#: The most a zstd ``entries`` stream may expand, output bytes per input byte:
#: deflate's own ceiling (about 1032:1). zstd can expand far more (192 bytes
#: to 250,000 events), which would break the driver's bound on work done on
#: the event loop for small reads (appliance/server/connection.py,
#: INLINE_DECODE_MAX_BYTES) and make a tiny request cost seconds of decoding.
#: Real log chunks compress 5-50:1; a stream past this is refused, not acked.
ZSTD_MAX_EXPANSION: Final = 1032


def unzstd_frames(data: bytes, limit: int) -> bytes:
    """Decompress one or several concatenated zstd frames, at most ``limit`` bytes out.

    ``compressed: "zstd"`` (Fluentd >= 1.19's out_forward, which writes a frame
    per buffer append, so a chunk is usually several; docs/forward.md). Like
    :func:`gunzip_members`: streamed, stopped as soon as the output would pass
    ``limit``, linear in ``len(data)``.

    Raises:
        RemoteProtocolError: invalid or truncated zstd data, or output over ``limit``.
    """
    ratio_limit = ZSTD_MAX_EXPANSION * len(data)
    try:
        return unzstd(data, min(limit, ratio_limit))
    except OutputLimitError:
        if ratio_limit < limit:
            raise RemoteProtocolError(
                f"zstd entries expand more than {ZSTD_MAX_EXPANSION}:1 "
                f"(ZSTD_MAX_EXPANSION, the most deflate can)"
            ) from None
        raise RemoteProtocolError(
            f"decompressed entries exceed max_decompressed_bytes={limit}"
        ) from None
    except TruncatedError:
        raise RemoteProtocolError("zstd entries are truncated") from None
    except InvalidDataError as exc:
        raise RemoteProtocolError(f"zstd entries are invalid: {exc.detail}") from None


#: What each ``compressed`` option value names: its decoder (spec "Option" has
#: "gzip"; Fluentd >= 1.19 and Fluent Bit's in_forward also read "zstd").
_DECOMPRESSORS: Final = {"gzip": gunzip_members, "zstd": unzstd_frames}
#: The magic of each compressed format, to refuse compressed entries that came
#: without their label (0x1f and 0x28 are msgpack integers, never an entry).
_MAGICS: Final = {"gzip": GZIP_MAGIC, "zstd": ZSTD_MAGIC}
