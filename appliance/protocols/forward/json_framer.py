"""The JSON form's framer: a byte stream split into top-level JSON values, unparsed."""

from __future__ import annotations

import re
from typing import Final

__all__: list[str] = []

#: The first byte of a JSON request ('[' or '{'); in_forward picks JSON by it.
_JSON_FIRST_BYTES: Final = frozenset(b"[{")

#: Outside strings, inside a value: the next byte the framer must look at.
_JSON_STRUCTURE: Final = re.compile(rb'["\[\]{}]')
#: Inside a string: its end or an escape.
_JSON_STRING_STOP: Final = re.compile(rb'["\\]')
#: Between values.
_JSON_WHITESPACE: Final = re.compile(rb"[ \t\r\n]*")


class _JsonFramer:
    """Splits a byte stream into top-level JSON values, without parsing them.

    in_forward accepts a JSON request when the connection's first byte is
    '[' or '{' (spec "Fluentd Forward Server", note). Values may follow each
    other with or without whitespace. The scanner tracks nesting and strings
    only; :func:`json.loads` validates each complete value.

    Linear and bounded: the scan resumes where the last one stopped (each byte
    is looked at once, the bytes between brackets and quotes by a regular
    expression rather than a Python loop), and the buffer never holds more
    than ``limit + 1`` bytes: the unfinished value, of at most ``limit``.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        #: The unfinished value (the bytes before it are consumed).
        self._buf = bytearray()
        self._scan = 0  # next byte of _buf to look at
        self._depth = 0
        self._in_string = False
        self._escaped = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the unfinished value held."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray, values: list[bytes]) -> None:
        """Append the values that ``data`` completes to ``values``.

        Raises:
            ValueError: the stream is not a sequence of arrays, or a value is
                over the limit; ``values`` then holds those framed before.
        """
        with memoryview(data) as whole:
            view = whole
            while view:
                # One byte past the limit is enough to know a value is too long.
                room = self._limit + 1 - len(self._buf)
                piece, view = view[:room], view[room:]
                self._buf += piece
                self._frame(values)
                if len(self._buf) > self._limit:
                    raise ValueError(f"request exceeds max_request_bytes={self._limit}")

    def _frame(self, values: list[bytes]) -> None:
        buf = self._buf
        n = len(buf)
        i = self._scan
        start = 0  # where the unfinished value begins
        while i < n:
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                    i += 1
                    continue
                found = _JSON_STRING_STOP.search(buf, i)
                if found is None:
                    i = n
                    break
                i = found.start()
                if buf[i] == 0x5C:  # backslash: the next byte is escaped
                    self._escaped = True
                else:
                    self._in_string = False
                i += 1
                continue
            if self._depth == 0:
                i = _JSON_WHITESPACE.match(buf, i).end()  # type: ignore[union-attr]
                start = i
                if i >= n:
                    break
                if buf[i] not in _JSON_FIRST_BYTES:
                    raise ValueError("JSON request is not an array")
                self._depth = 1
                i += 1
                continue
            found = _JSON_STRUCTURE.search(buf, i)
            if found is None:
                i = n
                break
            i = found.start()
            c = buf[i]
            if c == 0x22:  # quote
                self._in_string = True
            elif c == 0x5B or c == 0x7B:  # [ {
                self._depth += 1
            else:  # ] }
                self._depth -= 1
                if self._depth == 0:
                    if i + 1 - start > self._limit:
                        raise ValueError(f"request exceeds max_request_bytes={self._limit}")
                    values.append(bytes(buf[start : i + 1]))
                    start = i + 1
            i += 1
        del buf[:start]
        self._scan = i - start
