"""Lumberjack v1 and v2 (Beats), server side, as a sans-IO codec.

The seed spec is ``shared/specs/lumberjack-protocol-v1.txt`` (v1: frames
``W``, ``D``, ``C``, ``A``); v2, what Beats speak, adds ``J`` (a JSON
event). DESIGN §4 and ``docs/lumberjack.md`` record what real peers need.

Every frame starts with a version byte (``'1'`` or ``'2'``) and a type byte:

* ``W`` window: u32 count of data frames the writer sends before it waits
  for an ack;
* ``D`` (v1) data: u32 sequence, u32 pair count, then (u32 length, key,
  u32 length, value) per pair;
* ``J`` (v2) JSON data: u32 sequence, u32 length, JSON;
* ``C`` compressed: u32 length, zlib data holding whole frames (any of the
  above, ``C`` included);
* ``A`` ack, sent by the server: u32 sequence.

Invariants:

* :meth:`LumberjackServerConnection.receive_data` consumes every byte and
  returns the windows completed by them, in order; a split at any byte gives
  the same windows.
* A window's ack carries the sequence of its last data frame, the highest
  the window saw (clients that number across windows, like pylogbeat, wait
  for exactly that number; go-lumber's count-based ack would hang them).
* The first frame fixes the connection's version; a frame of the other
  version is an error, as is data outside a window (in v1 the last ``W``
  stands: data after a complete window opens the next one of the same size),
  an unknown frame type, invalid zlib, a frame cut short inside a ``C``
  payload, or invalid JSON.
* Limits: ``max_window_size`` events per window, ``max_frame_bytes`` per
  frame, ``max_decompressed_bytes`` of output per ``C`` frame (nested ones
  included), ``MAX_COMPRESSION_DEPTH`` nested ``C`` frames.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from appliance.protocols.errors import LocalProtocolError, RemoteProtocolError
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_WINDOW_SIZE",
    "MAX_COMPRESSION_DEPTH",
    "LumberjackLimits",
    "LumberjackServerConnection",
    "LumberjackState",
    "Window",
]

#: Most events a client may announce in one window.
DEFAULT_MAX_WINDOW_SIZE: Final = 100_000
#: Largest frame, in bytes (a ``C`` frame's compressed payload; a ``J`` frame's JSON).
DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
#: Largest decompressed output of one ``C`` frame, nested frames included, in bytes.
DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 256 * 1024 * 1024
#: ``C`` frames inside ``C`` frames, at most this deep.
MAX_COMPRESSION_DEPTH: Final = 4

_VERSIONS: Final = {ord("1"): 1, ord("2"): 2}
_U32: Final = struct.Struct(">I")
_HEADER: Final = 2  # version byte, type byte
_W, _D, _J, _C, _A = (ord(c) for c in "WDJCA")


@dataclass(frozen=True, slots=True)
class LumberjackLimits:
    """Limits that guard one connection (all configurable per listener)."""

    max_window_size: int = DEFAULT_MAX_WINDOW_SIZE
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES

    def __post_init__(self) -> None:
        require_at_least_one(self, "max_window_size", "max_frame_bytes", "max_decompressed_bytes")


@dataclass(frozen=True, slots=True)
class Window:
    """A complete window: its events, in order, and the sequence its ack carries.

    An empty window (``W 0``) has no events and acks the last sequence
    acknowledged so far.
    """

    version: int
    sequences: list[int]
    records: list[dict[str, Any]]
    #: The JSON text of each event as the client sent it (``J`` frames), or
    #: None for a ``D`` frame: the record is then rendered from its pairs.
    texts: list[str | None] = field(default_factory=list)

    @property
    def last_sequence(self) -> int | None:
        """The sequence of the window's last data frame, None for an empty window."""
        return self.sequences[-1] if self.sequences else None


class LumberjackState(enum.Enum):
    """Where a connection is."""

    #: Nothing yet: the first frame's version byte fixes v1 or v2.
    IDLE = "idle"
    #: Between windows: the next frame must be ``W``.
    AWAITING_WINDOW = "awaiting-window"
    #: Inside a window: data frames until the announced count.
    IN_WINDOW = "in-window"
    CLOSED = "closed"


_TRANSITIONS: Final[dict[LumberjackState, frozenset[LumberjackState]]] = {
    LumberjackState.IDLE: frozenset({LumberjackState.IN_WINDOW, LumberjackState.AWAITING_WINDOW,
                                     LumberjackState.CLOSED}),
    LumberjackState.AWAITING_WINDOW: frozenset({LumberjackState.IN_WINDOW,
                                                LumberjackState.AWAITING_WINDOW,
                                                LumberjackState.CLOSED}),
    LumberjackState.IN_WINDOW: frozenset({LumberjackState.AWAITING_WINDOW,
                                          LumberjackState.CLOSED}),
    LumberjackState.CLOSED: frozenset(),
}  # fmt: skip


class _Incomplete(Exception):
    """The buffer ends inside a frame."""


class LumberjackServerConnection:
    """The server side of one Lumberjack connection, with no I/O.

    Feed it bytes with :meth:`receive_data`; it returns completed windows.
    Ask :meth:`ack_bytes` for a window's ack once its events are committed,
    and :meth:`keepalive_bytes` while they wait.
    """

    def __init__(self, limits: LumberjackLimits | None = None) -> None:
        self.limits = limits or LumberjackLimits()
        self._state = LumberjackState.IDLE
        self._buffer = bytearray()
        self.version: int | None = None
        self._window_size = 0
        self._sequences: list[int] = []
        self._records: list[dict[str, Any]] = []
        self._texts: list[str | None] = []
        self._last_acked = 0
        self._pending_error: RemoteProtocolError | None = None

    @property
    def state(self) -> LumberjackState:
        """The connection's current state."""
        return self._state

    def _move(self, new: LumberjackState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise LocalProtocolError(f"no transition from {self._state.value} to {new.value}")
        self._state = new

    def _fail(self, reason: str) -> RemoteProtocolError:
        if self._state is not LumberjackState.CLOSED:
            self._move(LumberjackState.CLOSED)
        return RemoteProtocolError(reason)

    def receive_data(self, data: bytes | bytearray) -> list[Window]:
        """Take bytes read from the peer; return the windows they complete.

        Windows completed before a violation in the same ``data`` are
        returned, and the violation is raised by the next call.

        Raises:
            RemoteProtocolError: the peer broke the protocol or a limit.
            LocalProtocolError: called after the connection closed.
        """
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        if self._state is LumberjackState.CLOSED:
            raise LocalProtocolError("receive_data on a closed lumberjack connection")
        self._buffer += data
        windows: list[Window] = []
        try:
            consumed = self._frames(memoryview(self._buffer), windows, depth=0, outer=True)
            del self._buffer[:consumed]
            if len(self._buffer) > self.limits.max_frame_bytes + 16:
                raise self._fail(f"frame exceeds max_frame_bytes={self.limits.max_frame_bytes}")
        except RemoteProtocolError as error:
            # Not clear(): the error's traceback still holds memoryviews of
            # the old buffer, and a bytearray with exports cannot be resized.
            self._buffer = bytearray()
            if not windows:
                raise
            self._pending_error = error
        return windows

    # -- frames ----------------------------------------------------------------

    def _frames(self, view: memoryview, windows: list[Window], *, depth: int, outer: bool) -> int:
        """Parse whole frames from ``view``; returns the bytes consumed.

        ``outer`` frames may stop anywhere (more bytes will come); frames
        inside a ``C`` payload must be whole.
        """
        offset = 0
        while offset < len(view):
            try:
                offset += self._frame(view[offset:], windows, depth)
            except _Incomplete:
                if outer:
                    return offset
                raise self._fail("frame cut short inside a compressed frame") from None
        return offset

    def _need(self, view: memoryview, n: int) -> None:
        if len(view) < n:
            raise _Incomplete

    def _frame(self, view: memoryview, windows: list[Window], depth: int) -> int:
        self._need(view, _HEADER)
        version = _VERSIONS.get(view[0])
        if version is None:
            raise self._fail(f"unknown protocol version byte {view[0]:#04x}")
        if self.version is None:
            self.version = version
        elif version != self.version:
            raise self._fail(f"v{version} frame on a v{self.version} connection")
        kind = view[1]
        if kind == _W:
            return self._window(view, windows, version)
        if kind == _D and version == 1:
            return self._data_v1(view, windows)
        if kind == _J and version == 2:
            return self._data_json(view, windows)
        if kind == _C:
            return self._compressed(view, windows, depth)
        raise self._fail(f"unknown frame type {bytes([kind])!r} for v{version}")

    def _u32(self, view: memoryview, offset: int) -> int:
        self._need(view, offset + 4)
        return int(_U32.unpack_from(view, offset)[0])

    def _window(self, view: memoryview, windows: list[Window], version: int) -> int:
        size = self._u32(view, _HEADER)
        if self._state is LumberjackState.IN_WINDOW:
            raise self._fail(
                f"new window before the last one was complete "
                f"({len(self._records)} of {self._window_size} events)"
            )
        if size > self.limits.max_window_size:
            raise self._fail(
                f"window of {size} events exceeds max_window_size={self.limits.max_window_size}"
            )
        self._window_size = size
        if size == 0:
            # An empty window still wants its ack (issue 5: "W 0 gets an immediate ack").
            self._move(LumberjackState.AWAITING_WINDOW)
            windows.append(Window(version, [], []))
        else:
            self._move(LumberjackState.IN_WINDOW)
        return _HEADER + 4

    def _length(self, view: memoryview, offset: int, what: str) -> int:
        length = self._u32(view, offset)
        if length > self.limits.max_frame_bytes:
            raise self._fail(
                f"{what} of {length} bytes exceeds max_frame_bytes={self.limits.max_frame_bytes}"
            )
        return length

    def _data_v1(self, view: memoryview, windows: list[Window]) -> int:
        sequence = self._u32(view, _HEADER)
        pairs = self._u32(view, _HEADER + 4)
        offset = _HEADER + 8
        record: dict[str, Any] = {}
        for _ in range(pairs):
            key_length = self._length(view, offset, "D frame key")
            self._need(view, offset + 4 + key_length)
            key = bytes(view[offset + 4 : offset + 4 + key_length])
            offset += 4 + key_length
            value_length = self._length(view, offset, "D frame value")
            self._need(view, offset + 4 + value_length)
            value = bytes(view[offset + 4 : offset + 4 + value_length])
            offset += 4 + value_length
            if offset > self.limits.max_frame_bytes:
                raise self._fail(f"D frame exceeds max_frame_bytes={self.limits.max_frame_bytes}")
            record[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        self._event(sequence, record, windows)
        return offset

    def _data_json(self, view: memoryview, windows: list[Window]) -> int:
        sequence = self._u32(view, _HEADER)
        length = self._length(view, _HEADER + 4, "J frame")
        end = _HEADER + 8 + length
        self._need(view, end)
        raw = bytes(view[_HEADER + 8 : end])
        try:
            # orjson: strict RFC 8259 (no NaN, valid UTF-8, bounded nesting), and
            # several times faster than the stdlib on the hot path.
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise self._fail(f"J frame {sequence} is not valid JSON: {exc}") from None
        if type(record) is not dict:
            raise self._fail(f"J frame {sequence} is not a JSON object")
        # The validated text is kept as the record: no second encoding.
        self._event(sequence, record, windows, raw.decode("utf-8"))
        return end

    def _compressed(self, view: memoryview, windows: list[Window], depth: int) -> int:
        length = self._length(view, _HEADER, "C frame")
        end = _HEADER + 4 + length
        self._need(view, end)
        if depth >= MAX_COMPRESSION_DEPTH:
            raise self._fail(f"C frames nested deeper than {MAX_COMPRESSION_DEPTH}")
        payload = self._inflate(bytes(view[_HEADER + 4 : end]))
        self._frames(memoryview(payload), windows, depth=depth + 1, outer=False)
        return end

    def _inflate(self, data: bytes) -> bytes:
        limit = self.limits.max_decompressed_bytes
        decompressor = zlib.decompressobj()
        try:
            out = decompressor.decompress(data, limit + 1)
        except zlib.error as exc:
            raise self._fail(f"C frame is not valid zlib: {exc}") from None
        if len(out) > limit:
            raise self._fail(f"C frame decompresses past max_decompressed_bytes={limit}")
        if not decompressor.eof:
            raise self._fail("C frame's zlib stream is truncated")
        return out

    def _event(
        self,
        sequence: int,
        record: dict[str, Any],
        windows: list[Window],
        text: str | None = None,
    ) -> None:
        if (
            self._state is LumberjackState.AWAITING_WINDOW
            and self.version == 1
            and self._window_size > 0
        ):
            # A v1 window size stands until the next W: npm lumberjack-protocol
            # announces it once per connection and then sends D frames only.
            self._move(LumberjackState.IN_WINDOW)
        if self._state is not LumberjackState.IN_WINDOW:
            raise self._fail(f"data frame {sequence} outside a window (no W frame first)")
        self._sequences.append(sequence)
        self._records.append(record)
        self._texts.append(text)
        if len(self._records) == self._window_size:
            assert self.version is not None
            windows.append(Window(self.version, self._sequences, self._records, self._texts))
            self._sequences, self._records, self._texts = [], [], []
            self._move(LumberjackState.AWAITING_WINDOW)

    # -- answers ---------------------------------------------------------------

    def _ack(self, sequence: int) -> bytes:
        version = self.version or 2
        return bytes([ord(str(version)), _A]) + _U32.pack(sequence & 0xFFFFFFFF)

    def ack_bytes(self, window: Window) -> bytes:
        """The ack of ``window``, to send once its events are committed.

        Windows must be acked in the order they were returned.
        """
        last = window.last_sequence
        if last is not None:
            self._last_acked = last
        return self._ack(self._last_acked)

    def keepalive_bytes(self) -> bytes:
        """An ack that acknowledges nothing new, sent while a window waits.

        v2 sends sequence 0, as go-lumber and Logstash do (Beats and pylogbeat
        keep waiting); v1 clients get the last sequence already acknowledged.
        """
        return self._ack(0 if self.version == 2 else self._last_acked)
