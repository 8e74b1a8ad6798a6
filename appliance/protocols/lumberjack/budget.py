"""What one ``C`` frame read off the wire may cost: its nesting, windows and items."""

from __future__ import annotations

from typing import Final

__all__ = [
    "C_FRAME_BASE_ITEMS",
    "C_FRAME_ITEMS_PER_BYTE",
    "MAX_COMPRESSION_DEPTH",
    "MAX_WINDOWS_PER_C_FRAME",
    "NESTED_C_FRAME_ITEMS",
]

#: ``C`` frames inside ``C`` frames, at most this deep.
MAX_COMPRESSION_DEPTH: Final = 4
#: ``W`` frames one ``C`` frame may hold, nested ones included (no real client
#: puts any there; without the cap, 8.8 KB of ``W 0`` frames made 1,000,000
#: windows).
MAX_WINDOWS_PER_C_FRAME: Final = 64
#: Items (frames, ``D`` pairs) any ``C`` frame may hold, whatever its size.
C_FRAME_BASE_ITEMS: Final = 64
#: Further items per byte of a ``C`` frame's compressed payload.
C_FRAME_ITEMS_PER_BYTE: Final = 4
#: Items a ``C`` frame nested in another costs: it starts a zlib stream, about
#: as much work as this many small frames (uncounted, 54 KB of empty nested
#: ``C`` frames took 4.8 s).
NESTED_C_FRAME_ITEMS: Final = 16


class _Budget:
    """What one ``C`` frame read off the wire may still cost, nested ``C`` frames included."""

    __slots__ = ("compressed", "decompressed", "items", "windows")

    def __init__(self, compressed: int, max_decompressed: int) -> None:
        self.compressed = compressed
        self.items = C_FRAME_BASE_ITEMS + C_FRAME_ITEMS_PER_BYTE * compressed
        self.decompressed = max_decompressed
        self.windows = MAX_WINDOWS_PER_C_FRAME
