"""Strict text for the table's columns: valid UTF-8, bounded length (pure: no I/O, no trio).

Every string a codec hands on for a column (``tag``, ``host``, ``batch_id``,
and the record's JSON text) must be storable: Arrow refuses a ``str`` that
carries lone surrogates (what ``surrogateescape`` makes of bytes that are not
UTF-8, or a JSON ``"\\ud800"`` escape), and one very long tag copied onto every
row of a request multiplies the bytes a peer sent (docs/security.md). So the
codecs check each such string where they decode it, with these helpers, and a
violation (:class:`~appliance.blocks.errors.InvalidText`) is the peer's fault:
the codec turns it into a protocol violation for that request, or a counted
per-event drop where the protocol keeps per-event drops.

The limits are in bytes of UTF-8 and are documented in docs/limits.md.
"""

from __future__ import annotations

from typing import Final

from appliance.blocks.errors import InvalidText

__all__ = [
    "MAX_BATCH_ID_BYTES",
    "MAX_HOST_BYTES",
    "MAX_TAG_BYTES",
    "check_text",
    "decode_text",
    "is_utf8_text",
]

#: Longest tag (Fluentd tag, Logjam topic, Lumberjack/Courier type), in bytes.
#: Fluentd tags are dotted words; 1 KiB is far past any real one.
MAX_TAG_BYTES: Final = 1024
#: Longest host name, in bytes (a DNS name is at most 253; room for odd ones).
MAX_HOST_BYTES: Final = 255
#: Longest batch id (Fluentd chunk, Courier nonce, Logjam id, WebSocket id), in bytes.
#: Real ids are 16-byte binaries, UUIDs or short digests.
MAX_BATCH_ID_BYTES: Final = 256


def is_utf8_text(value: str) -> bool:
    """False when ``value`` carries lone surrogates (so it has no UTF-8 encoding)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: str, what: str, limit: int) -> str:
    """``value`` when it is valid UTF-8 of at most ``limit`` bytes.

    Raises:
        InvalidText: naming ``what`` and the rule it broke.
    """
    if value.isascii():
        if len(value) > limit:
            raise InvalidText(f"{what} is {len(value)} bytes, over the limit of {limit}")
        return value
    # A str holds at most 4 UTF-8 bytes per code point: skip encoding huge ones.
    if len(value) > limit:
        raise InvalidText(f"{what} is over the limit of {limit} bytes")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidText(f"{what} is not valid UTF-8") from None
    if size > limit:
        raise InvalidText(f"{what} is {size} bytes, over the limit of {limit}")
    return value


def decode_text(raw: bytes | bytearray | memoryview, what: str, limit: int) -> str:
    """``raw`` decoded as strict UTF-8 of at most ``limit`` bytes.

    Raises:
        InvalidText: naming ``what`` and the rule it broke.
    """
    if len(raw) > limit:
        raise InvalidText(f"{what} is {len(raw)} bytes, over the limit of {limit}")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidText(f"{what} is not valid UTF-8") from None
