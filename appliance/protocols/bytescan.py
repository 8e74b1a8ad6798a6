"""Whole-buffer byte work in C: a WebSocket payload's unmasking, a JSON text's container count.

Both run over every byte of a message (about 300 KB for 1,000 events), so
their cost is per byte, not per event. With numpy they are vector
operations; without it, the stdlib's (``bytes.translate`` on strided
slices, as wsproto does; ``str.count``), which take 5 to 10 times longer.
Either way the result is the same (tests/appliance/protocols/test_bytescan.py
holds numpy's to the stdlib's with hypothesis).

numpy is used only once the process has it
(:func:`appliance.blocks.numpy_loaded.loaded_numpy`: pyarrow loads it with
the first rows); until then, the stdlib path runs.
"""

from __future__ import annotations

from typing import Final

from appliance.blocks.numpy_loaded import loaded_numpy

__all__ = ["VECTOR_MIN_BYTES", "brackets", "xor_mask"]

#: Below this many bytes the stdlib is as fast as numpy's per-call overhead.
VECTOR_MIN_BYTES: Final = 256

#: wsproto's table: byte -> byte ^ key for each key byte (its XorMaskerSimple's).
_XOR_TABLE: Final = [bytes(a ^ b for a in range(256)) for b in range(256)]


def xor_mask(data: bytearray, key: bytes) -> None:
    """XOR ``data`` in place with the 4-byte ``key`` repeated (RFC 6455 section 5.3)."""
    n = len(data)
    numpy = loaded_numpy() if n >= VECTOR_MIN_BYTES else None
    if numpy is not None:
        words = n >> 2
        # Both sides read in the machine's byte order, so XOR of the words is
        # XOR of the bytes; frombuffer of a bytearray is a writable view.
        view = numpy.frombuffer(data, numpy.uint32, words)
        numpy.bitwise_xor(view, numpy.frombuffer(key, numpy.uint32)[0], out=view)
        for index in range(words << 2, n):
            data[index] ^= key[index & 3]
        return
    for offset in range(4):
        data[offset::4] = data[offset::4].translate(_XOR_TABLE[key[offset]])


def brackets(data: str | bytes) -> int:
    """How many ``{`` and ``[`` characters ``data`` holds."""
    numpy = loaded_numpy() if len(data) >= VECTOR_MIN_BYTES else None
    if numpy is None or (isinstance(data, str) and not data.isascii()):
        # A str that is not ASCII would need an encode first, about what the counts cost.
        if isinstance(data, str):
            return data.count("{") + data.count("[")
        return data.count(b"{") + data.count(b"[")
    raw = data.encode("ascii") if isinstance(data, str) else data
    # "{" is 0x7B and "[" 0x5B: they differ in bit 0x20 only, and no other byte
    # becomes 0x7B with that bit set.
    return int(numpy.count_nonzero((numpy.frombuffer(raw, numpy.uint8) | 0x20) == 0x7B))
