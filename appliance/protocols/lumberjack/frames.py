"""Lumberjack's frame layout: the version and type bytes, the headers, a ``D`` frame's text."""

from __future__ import annotations

import struct
from typing import Final

__all__: list[str] = []

_VERSIONS: Final = {ord("1"): 1, ord("2"): 2}
_U32: Final = struct.Struct(">I")
_HEADER: Final = 2  # version byte, type byte
_DATA_HEADER: Final = _HEADER + 8  # sequence, then pair count or JSON length
_W, _D, _J, _C, _A = (ord(c) for c in "WDJCA")


def _frame_min_bytes(head: bytes | bytearray) -> int:
    """Bytes of the ``C`` or ``J`` frame that ``head`` starts with, from its header; else 0."""
    if len(head) < _HEADER or head[0] not in _VERSIONS:
        return 0
    if head[1] == _C and len(head) >= _HEADER + 4:
        return _HEADER + 4 + int(_U32.unpack_from(head, _HEADER)[0])
    if head[1] == _J and len(head) >= _DATA_HEADER:
        return _DATA_HEADER + int(_U32.unpack_from(head, _HEADER + 4)[0])
    return 0


#: A J frame's sequence and JSON length, read together on the hot path.
_SEQUENCE_AND_LENGTH: Final = struct.Struct(">II")
_V2: Final = ord("2")


def _d_key(raw: memoryview) -> str:
    """A ``D`` key: its text, or backslash escapes when not UTF-8 (appliance.blocks.records)."""
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        return str(raw, "utf-8", "backslashreplace")


def _d_value(raw: memoryview) -> str | bytes:
    """A ``D`` value: its text, or its bytes when it is not UTF-8 (record_json: ``$binary``)."""
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        return bytes(raw)
