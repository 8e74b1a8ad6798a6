"""What a msgpack request's first bytes tell before it is decoded: its kind and its least size.

The codec keeps a request's first bytes (:data:`_HEAD_KEPT_BYTES`) to ask
the decode gate for its cost (:func:`request_kind`) and to leave reads that
cannot complete it on the event loop (:func:`packed_request_min_bytes`).
"""

from __future__ import annotations

from typing import Final

from appliance.blocks.text import MAX_TAG_BYTES
from appliance.protocols.compression import GZIP_MAGIC, ZSTD_MAGIC

__all__ = ["REQUEST_HEAD_BYTES", "packed_request_min_bytes", "request_kind"]

#: Bytes of a request's start kept to tell its kind before it is decoded
#: (:func:`request_kind`): the largest array header, a tag of up to
#: ``MAX_TAG_BYTES`` with a str32 header, the entries' header and the four
#: bytes of the zstd magic.
_HEAD_KEPT_BYTES: Final = 5 + 5 + MAX_TAG_BYTES + 5 + 4


def request_kind(head: bytes | bytearray, size: int) -> str:
    """What a msgpack request of ``size`` bytes starting with ``head`` is, for its decode cost.

    ``head``: the request's first bytes, as many as it has up to
    :data:`_HEAD_KEPT_BYTES` (fewer: not known). ``"packed"`` or
    ``"compressed"`` (PackedForward; compressed when the entries start with
    the gzip or zstd magic, labelled or not: unlabelled ones are refused
    before they are decoded, but cost no more for it), ``"msgpack"``
    (anything else: Message and Forward mode, a heartbeat, a request that is
    not an array), ``"unknown"`` when the head does not tell (see
    :func:`appliance.defaults.forward_request_cost`).
    """
    if len(head) < min(size, _HEAD_KEPT_BYTES) or not head:
        return "unknown"
    first = head[0]
    if 0x90 <= first <= 0x9F:
        at = 1
    elif first in (0xDC, 0xDD):
        at = 3 if first == 0xDC else 5
    else:
        return "msgpack"  # not an array: a heartbeat, or refused
    if len(head) <= at:
        return "msgpack"  # the whole request is shorter: refused
    tag = head[at]
    if 0xA0 <= tag <= 0xBF:
        at += 1 + (tag - 0xA0)
    elif tag in (0xD9, 0xDA, 0xDB):
        width = _SIZED_HEADERS[tag]
        at += 1 + width + int.from_bytes(head[at + 1 : at + 1 + width], "big")
    else:
        return "msgpack"  # a tag that is not a string: refused
    if at >= _HEAD_KEPT_BYTES:
        return "unknown"  # a tag longer than MAX_TAG_BYTES: refused, after its cost
    if len(head) <= at:
        return "msgpack"
    marker = head[at]
    width = 0 if 0xA0 <= marker <= 0xBF else _SIZED_HEADERS.get(marker, -1)
    if width < 0:
        return "msgpack"  # Forward mode's array, or Message mode's time
    entries = bytes(head[at + 1 + width : at + 1 + width + len(ZSTD_MAGIC)])
    if entries.startswith(GZIP_MAGIC) or entries.startswith(ZSTD_MAGIC):
        return "compressed"
    return "packed"


#: Bytes of a request's start kept to read its declared size: a fixarray, the
#: tag (a str of up to 255 bytes with its header, 2 bytes more than the 1-byte
#: headers) and the entries' bin or str header (at most 5 bytes).
REQUEST_HEAD_BYTES: Final = 1 + 2 + 255 + 5

#: msgpack headers whose length follows in 1, 2 or 4 big-endian bytes: str 8/16/32, bin 8/16/32.
_SIZED_HEADERS: Final = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}


def packed_request_min_bytes(head: bytes | bytearray) -> int:
    """The fewest bytes a request starting with ``head`` can take; 0 when it cannot be told.

    Told for ``[tag, entries, option?]`` with ``entries`` a str or bin (the
    PackedForward modes): the array and tag headers, the tag, the entries'
    header and the length it declares, and one byte of option when the
    array has three elements. A wrong guess only costs a worker thread or
    spares one: the codec itself reads every byte as before.
    """
    if len(head) < 2 or head[0] not in (0x92, 0x93):
        return 0
    at = 1
    tag = head[at]
    if 0xA0 <= tag <= 0xBF:
        at += 1 + (tag - 0xA0)
    elif tag == 0xD9 and len(head) > at + 1:
        at += 2 + head[at + 1]
    else:
        return 0
    if len(head) <= at:
        return 0
    width = _SIZED_HEADERS.get(head[at])
    if width is None or len(head) < at + 1 + width:
        return 0
    declared = int.from_bytes(head[at + 1 : at + 1 + width], "big")
    return at + 1 + width + declared + (1 if head[0] == 0x93 else 0)
