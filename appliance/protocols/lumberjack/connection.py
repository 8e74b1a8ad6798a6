"""Lumberjack v1 and v2 (Beats), server side, as a sans-IO codec.

v1 (frames ``W``, ``D``, ``C``, ``A``) is specified in ``PROTOCOL.md`` of
https://github.com/elastic/logstash-forwarder; v2, what Beats speak, adds
``J`` (a JSON event), as https://github.com/elastic/go-lumber implements it.
``docs/lumberjack.md`` records what real peers need.

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
* The first frame fixes the connection's version; a frame of the other
  version is an error, as is data outside a window (in v1 the last ``W``
  stands: data after a complete window opens the next one of the same size),
  an unknown frame type, invalid zlib, a frame cut short inside a ``C``
  payload, or invalid JSON. Each closes the connection and ends the events
  returned with a :class:`~appliance.protocols.errors.ProtocolViolation`; no
  exception leaves the codec.

Ack rule (docs/lumberjack.md): a window is acked with the **highest**
sequence among its data frames (Logstash's ``V2Batch.getHighestSequence``),
not the count and not the last frame's: clients that number across windows
(pylogbeat) wait for exactly that number, and a window whose sequences wrap
past 2**32 - 1 or go backwards is still acked by its highest. An empty window
(``W 0``) acks the last sequence acknowledged so far (0 before any). A run of
``W 0`` frames comes out as one empty :class:`Window` with ``acks`` = the run's
length, answered by that many acks: one object however many frames.

Events (docs/decisions.md#strict-strings): the codec keeps no parsed record. A
data frame becomes its record's JSON text plus the three values the table
needs from it, so a window holds little more than its bytes:

* ``tag``: the first non-empty string at one of ``tag_fields`` (dotted
  paths, default ``@metadata.beat`` then ``type``); ``host``: the first at
  :data:`appliance.blocks.fields.HOST_PATHS`. Each must be valid UTF-8 of at most
  :data:`~appliance.blocks.text.MAX_TAG_BYTES` /
  :data:`~appliance.blocks.text.MAX_HOST_BYTES`; one that is not is
  *not* a protocol error (the record itself is fine and is kept whole): the
  event gets None there, which the session turns into the listener's ``tag``
  / a null host, and the window counts it (``invalid_tags``,
  ``invalid_hosts``) for the session to log.
* the event time: ``@timestamp`` through :func:`appliance.blocks.timefmt.rfc3339_ns`
  (ASCII digits, int64 nanoseconds); anything else, a non-string included,
  is None = the receive time.
* the JSON text: a ``J`` frame's JSON as sent (orjson validates it: strict
  UTF-8, no lone surrogate escapes, so it is always storable); a ``D``
  frame's pairs rendered by :func:`appliance.blocks.records.record_json`. ``D``
  keys and values are bytes on the wire: one that is valid UTF-8 is text,
  a value that is not becomes ``{"$binary": "<base64>"}`` and a key that is
  not is written with backslash escapes, the convention of
  :mod:`appliance.blocks.records` for msgpack binaries. Nothing is lost and the
  text is valid UTF-8; such a value is not a string, so it never becomes
  the tag, host or time. (logstash-forwarder ships file lines as they are,
  Latin-1 included: refusing them would stall that client for good.)

Limits (bytes are counted as parsed, that is after decompression):

* ``max_window_size`` events per window; ``max_window_bytes`` bytes of data
  frames per window; ``max_frame_bytes`` per frame, also for a frame still
  incomplete in the buffer;
* a ``C`` frame read off the wire shares, with every ``C`` frame nested in
  it: ``max_decompressed_bytes`` of zlib output; :data:`MAX_WINDOWS_PER_C_FRAME`
  ``W`` frames; and a budget of *items* (a frame is one item, a ``D`` pair
  one, a nested ``C`` frame :data:`NESTED_C_FRAME_ITEMS`) of
  :data:`C_FRAME_BASE_ITEMS` plus :data:`C_FRAME_ITEMS_PER_BYTE` per byte of
  its compressed payload. Real clients number their frames, so zlib cannot
  shrink a frame below about 1.7 bytes (bench: 2048 identical ``{}`` events
  take 2.2 bytes a frame), while an attacker's repeated empty frames shrink
  a thousandfold: the budget keeps the parse work of a compressed frame
  within a small factor of the bytes that carried it. Nesting is at most
  :data:`MAX_COMPRESSION_DEPTH` deep.

Work and memory: parsing is linear in the bytes received (a ``D`` frame
that arrives in pieces is scanned once, resuming where the last read
stopped; ``J`` and ``C`` frames are parsed once they are whole; a frame
that cannot fit the frame limit or what is left of the window's is refused
as soon as its length fields show it, before its bytes are buffered). The codec holds the unfinished
frame (at most ``max_frame_bytes``) and the unfinished window's events.
An event costs its JSON text (a ``str``: one byte per character, four when
it holds one character past U+FFFF), the copies of its tag and host (shared
between the events that repeat them), and at most
:data:`EVENT_OVERHEAD_BYTES` of list slots, object headers, sequence and
time. So a window of B bytes and N events holds at most
``WINDOW_MEMORY_FACTOR * B + EVENT_OVERHEAD_BYTES * N`` bytes (tested with
tracemalloc): measured about 2 B for typical Beats events, about 12 B for the
smallest frames (10-byte ``D`` frames, where the per-event overhead is all
there is), never more than ``WINDOW_MEMORY_FACTOR * max_window_bytes +
EVENT_OVERHEAD_BYTES * max_window_size`` (ASCII JSON: about a third of
that). Parsing one ``J`` frame briefly holds its record as Python objects
(up to about 40 times the frame's bytes for pathological JSON such as
``[[],[],...]``; orjson offers no object limit), dropped before the next
frame; a ``D`` frame's pairs likewise (about 10 times). A ``J`` frame is one
record, so it is at most ``RECORD_MAX_BYTES`` (16 MiB, refused from its
length field on) and holds at most ``RECORD_MAX_VALUES`` objects and arrays
(counted as ``{`` and ``[`` bytes before parsing): one frame's objects take
at most a few hundred MiB, whatever ``max_frame_bytes`` is.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

import orjson

from appliance import defaults
from appliance.blocks.errors import InvalidText
from appliance.blocks.fields import HOST_PATHS, first_string, paths
from appliance.blocks.records import record_json
from appliance.blocks.text import MAX_HOST_BYTES, MAX_TAG_BYTES, check_text
from appliance.blocks.timecache import Rfc3339Cache
from appliance.blocks.timefmt import rfc3339_ns
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation, RemoteProtocolError
from appliance.protocols.lumberjack.budget import (
    C_FRAME_BASE_ITEMS,
    C_FRAME_ITEMS_PER_BYTE,
    MAX_COMPRESSION_DEPTH,
    MAX_WINDOWS_PER_C_FRAME,
    NESTED_C_FRAME_ITEMS,
    _Budget,
)
from appliance.protocols.lumberjack.events import (
    LumberjackEvent,
    LumberjackLimits,
    Window,
)
from appliance.protocols.lumberjack.frames import (
    _A,
    _C,
    _D,
    _DATA_HEADER,
    _HEADER,
    _J,
    _SEQUENCE_AND_LENGTH,
    _U32,
    _V2,
    _VERSIONS,
    _W,
    _d_key,
    _d_value,
    _frame_min_bytes,
)
from appliance.protocols.lumberjack.state import _TRANSITIONS, LumberjackState

__all__ = ["LumberjackServerConnection"]


#: The longest ``@timestamp`` text that can be a time: rfc3339_ns reads at most
#: 64 characters (appliance/blocks/timefmt.py); longer ones are not kept for it.
_MAX_STAMP_CHARS: Final = 64
#: Distinct tag and host strings a connection keeps to share between events.
_MAX_SHARED_STRINGS: Final = 256


def _two_level(
    paths: Sequence[tuple[str, ...]],
) -> tuple[tuple[str, str | None], ...] | None:
    """Key paths of one or two keys as (key, key below or None); None if one is deeper."""
    if not all(1 <= len(path) <= 2 for path in paths):
        return None
    return tuple((path[0], path[1] if len(path) == 2 else None) for path in paths)


def _beats_shape(
    paths: tuple[tuple[str, str | None], ...] | None,
) -> tuple[str, str, str] | None:
    """(a, b, c) for the paths ``a.b`` then ``c``, the shape of the default tag fields."""
    if paths is None or len(paths) != 2:
        return None
    (a, b), (c, none) = paths
    return (a, b, c) if b is not None and none is None else None


# The inline loop of _json_frames walks these three paths, unrolled.
assert HOST_PATHS == (("host", "name"), ("beat", "hostname"), ("host",))


class _Incomplete(Exception):
    """The buffer ends inside a frame."""


class LumberjackServerConnection:
    """The server side of one Lumberjack connection, with no I/O.

    Feed it bytes with :meth:`receive_data`; it returns completed windows.
    Ask :meth:`ack_bytes` for a window's ack once its events are committed,
    and :meth:`keepalive_bytes` while they wait.
    """

    def __init__(
        self,
        limits: LumberjackLimits | None = None,
        *,
        tag_fields: Sequence[str] = defaults.LUMBERJACK_TAG_FIELDS,
    ) -> None:
        self.limits = limits or LumberjackLimits()
        self._tag_paths = paths(tag_fields)
        #: The tag paths as (key, key below or None) when none is deeper (the
        #: inline loop of :meth:`_json_frames`), else None.
        self._two_level_tag_paths = _two_level(self._tag_paths)
        #: (a, b, c) when the tag paths are ``a.b`` then ``c`` (the default's shape).
        self._beats_tag_keys = _beats_shape(self._two_level_tag_paths)
        #: This connection's RFC 3339 prefixes (appliance/blocks/timecache.py), bounded.
        self._times = Rfc3339Cache()
        self._state = LumberjackState.IDLE
        self._buffer = bytearray()
        self.version: int | None = None
        self._window_size = 0
        self._pending = Window(0)  # the unfinished window's events (version set on completion)
        self._window_bytes = 0
        #: ``W 0`` frames since the last window returned (one object for a run).
        self._empty_windows = 0
        self._invalid_tags = 0
        self._invalid_hosts = 0
        #: Where the scan of an outer ``D`` frame cut short stopped: (offset, pairs left).
        self._d_scan: tuple[int, int] | None = None
        #: Validated tag and host strings, shared by the events that repeat them.
        self._shared: dict[str, str] = {}
        self._last_acked = 0
        # Measures of the work done so far, for tests and metrics (the work
        # must stay linear in the bytes received).
        #: Length, count and sequence fields read.
        self.fields_read = 0
        #: zlib streams started (one per ``C`` frame, nested ones included).
        self.streams_inflated = 0
        #: Bytes of zlib output.
        self.bytes_inflated = 0

    @property
    def state(self) -> LumberjackState:
        """The connection's current state."""
        return self._state

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished frame or window held: 0 between windows."""
        return len(self._buffer) + self._window_bytes

    @property
    def frame_bytes(self) -> int:
        """Bytes of an unfinished frame held: 0 between frames."""
        return len(self._buffer)

    def completes_nothing(self, data: bytes | bytearray) -> bool:
        """True when receiving ``data`` cannot complete a frame: it only fills the buffer.

        The unfinished frame (held, or at the start of ``data``) tells the
        fewest bytes it can take: a ``C`` or ``J`` frame its length, a ``D``
        frame being scanned 8 bytes for each pair still to come (two length
        fields). Reads that leave it short complete nothing: the driver takes
        them on the event loop, without a worker thread
        (appliance/server/connection.py). False whenever it cannot tell.
        """
        if self._state is LumberjackState.CLOSED or not data:
            return False
        held = len(self._buffer)
        if held and self._d_scan is not None:
            offset, left = self._d_scan
            return held + len(data) < offset + 8 * left
        head = self._buffer if held else data
        need = _frame_min_bytes(head)
        return need > 0 and held + len(data) < need

    def _move(self, new: LumberjackState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise LocalProtocolError(f"no transition from {self._state.value} to {new.value}")
        self._state = new

    def _fail(self, reason: str) -> RemoteProtocolError:
        if self._state is not LumberjackState.CLOSED:
            self._move(LumberjackState.CLOSED)
        self._pending = Window(0)
        self._window_bytes = 0
        return RemoteProtocolError(reason)

    def receive_data(self, data: bytes | bytearray) -> list[LumberjackEvent]:
        """Take bytes read from the peer; return the windows they complete.

        When ``data`` breaks the protocol or a limit, the last event is a
        :class:`ProtocolViolation` and the connection is ``CLOSED``; the
        windows completed before it are returned.

        Raises:
            LocalProtocolError: called after the connection closed.
        """
        if self._state is LumberjackState.CLOSED:
            raise LocalProtocolError("receive_data on a closed lumberjack connection")
        self._buffer += data
        windows: list[Window] = []
        try:
            try:
                consumed = self._frames(memoryview(self._buffer), windows, depth=0, budget=None)
            finally:
                self._flush_empty_windows(windows)
            del self._buffer[:consumed]
            # Each frame type refuses an over-long frame from its header; this
            # is the backstop for the buffer as a whole.
            if len(self._buffer) > self.limits.max_frame_bytes + _DATA_HEADER:
                raise self._fail(f"frame exceeds max_frame_bytes={self.limits.max_frame_bytes}")
        except RemoteProtocolError as error:
            # Not clear(): the error's traceback still holds memoryviews of
            # the old buffer, and a bytearray with exports cannot be resized.
            self._buffer = bytearray()
            self._d_scan = None
            return [*windows, ProtocolViolation.of(error)]
        events: list[LumberjackEvent] = list(windows)
        return events

    # -- frames ----------------------------------------------------------------

    def _frames(
        self, view: memoryview, windows: list[Window], *, depth: int, budget: _Budget | None
    ) -> int:
        """Parse whole frames from ``view``; returns the bytes consumed.

        Outer frames (``budget`` None) may stop anywhere (more bytes will
        come); frames inside a ``C`` payload must be whole.
        """
        offset = 0
        while offset < len(view):
            if self._state is LumberjackState.IN_WINDOW and self.version == 2:
                offset = self._json_frames(view, offset, windows, budget)
                if offset == len(view):
                    break
            try:
                offset += self._frame(view[offset:], windows, depth, budget)
            except _Incomplete:
                if budget is None:
                    return offset
                raise self._fail("frame cut short inside a compressed frame") from None
        return offset

    def _json_frames(
        self, view: memoryview, offset: int, windows: list[Window], budget: _Budget | None
    ) -> int:
        """Take the whole v2 ``J`` frames from ``offset`` on in one loop; where they end.

        The Beats hot path (a window of J frames, usually inside one C
        frame): the checks of :meth:`_frame` and :meth:`_data_json`, and what
        :meth:`_event` does, inline. It stops, leaving the rest to
        :meth:`_frame`, at the first frame that is not a whole J frame within
        every limit (another type, a cut-short or over-long frame, a full
        window or budget), or when the window is complete; :meth:`_frame`
        then reads that frame as always, and fails it with the usual reason
        if it breaks a rule. The run's events join the window at its end, the
        ``@timestamp`` strings all at once (:class:`~appliance.blocks.timecache.Rfc3339Cache`);
        a frame that is not a JSON object fails the connection as
        :meth:`_data_json` fails it, which drops the unfinished window anyway.
        tests/appliance/protocols/test_lumberjack_fast.py holds this loop to
        :meth:`_frame`'s frame-by-frame path: the same windows and violations.
        """
        if self._state is not LumberjackState.IN_WINDOW:
            return offset
        size = len(view)
        # Frames longer than a record may hold values are counted by _data_json.
        max_frame = min(self.limits.max_frame_bytes, defaults.RECORD_MAX_VALUES)
        max_window = self.limits.max_window_bytes
        unpack = _SEQUENCE_AND_LENGTH.unpack_from
        loads, decode_error = orjson.loads, orjson.JSONDecodeError
        tag_paths, shared = self._two_level_tag_paths, self._shared
        if tag_paths is None:
            return self._json_frames_by_event(view, offset, windows, budget)
        beats_tag = self._beats_tag_keys
        wanted = self._window_size - len(self._pending.texts)
        window_bytes = self._window_bytes
        sequences: list[int] = []
        texts: list[str] = []
        tags: list[str | None] = []
        hosts: list[str | None] = []
        stamps: list[object] = []
        invalid_tags = invalid_hosts = 0
        found: Any
        host: Any
        stamp: Any
        while wanted and size - offset >= _DATA_HEADER:
            if view[offset] != _V2 or view[offset + 1] != _J:
                break
            if budget is not None and budget.items < 1:
                break
            sequence, length = unpack(view, offset + _HEADER)
            frame = _DATA_HEADER + length
            if length > max_frame or offset + frame > size:
                break
            if window_bytes + frame > max_window:
                break
            self.fields_read += 2
            if budget is not None:
                budget.items -= 1
            raw = view[offset + _DATA_HEADER : offset + frame]
            try:
                record = loads(raw)
            except decode_error as exc:
                raise self._fail(f"J frame {sequence} is not valid JSON: {exc}") from None
            if type(record) is not dict:
                raise self._fail(f"J frame {sequence} is not a JSON object")
            # orjson validated the bytes as UTF-8; the validated text is the record.
            texts.append(str(raw, "utf-8"))
            sequences.append(sequence)
            # Only a short str can be a time (rfc3339_ns: None for anything
            # else); nothing else of the record outlives this frame's parse.
            stamp = record.get("@timestamp")
            stamps.append(stamp if type(stamp) is str and len(stamp) <= _MAX_STAMP_CHARS else None)
            # first_string (appliance/blocks/fields.py) over paths of one or two
            # keys; orjson's dicts are exactly dict, so type() is isinstance().
            if beats_tag is not None:
                # The default tag fields, "@metadata.beat" then "type", unrolled.
                found = record.get(beats_tag[0])
                found = found.get(beats_tag[1]) if type(found) is dict else None
                if type(found) is not str or not found:
                    found = record.get(beats_tag[2])
                    if type(found) is not str or not found:
                        found = None
            else:
                for first, second in tag_paths:
                    found = record.get(first)
                    if second is not None:
                        found = found.get(second) if type(found) is dict else None
                    if type(found) is str and found:
                        break
                else:
                    found = None
            if found is not None:
                known = shared.get(found)
                if known is None:
                    known, ok = self._shared_text(found, "tag", MAX_TAG_BYTES)
                    invalid_tags += not ok
                found = known
            tags.append(found)
            # HOST_PATHS, unrolled: host.name, beat.hostname, a string host.
            host = record.get("host")
            found = host.get("name") if type(host) is dict else None
            if type(found) is not str or not found:
                found = record.get("beat")
                found = found.get("hostname") if type(found) is dict else None
                if type(found) is not str or not found:
                    found = host if type(host) is str and host else None
            if found is not None:
                known = shared.get(found)
                if known is None:
                    known, ok = self._shared_text(found, "host", MAX_HOST_BYTES)
                    invalid_hosts += not ok
                found = known
            hosts.append(found)
            window_bytes += frame
            offset += frame
            wanted -= 1
        if sequences:
            pending = self._pending
            pending.sequences.extend(sequences)
            pending.texts.extend(texts)
            pending.tags.extend(tags)
            pending.hosts.extend(hosts)
            pending.times_ns.extend(self._times.times_ns(stamps))
            self._invalid_tags += invalid_tags
            self._invalid_hosts += invalid_hosts
            self._window_bytes = window_bytes
            if not wanted:
                self._complete_window(windows)
        return offset

    def _json_frames_by_event(
        self, view: memoryview, offset: int, windows: list[Window], budget: _Budget | None
    ) -> int:
        """:meth:`_json_frames` for tag fields deeper than two keys: :meth:`_event` per frame."""
        size = len(view)
        max_frame = min(self.limits.max_frame_bytes, defaults.RECORD_MAX_VALUES)
        max_window = self.limits.max_window_bytes
        unpack = _SEQUENCE_AND_LENGTH.unpack_from
        loads, in_window = orjson.loads, LumberjackState.IN_WINDOW
        while self._state is in_window and size - offset >= _DATA_HEADER:
            if view[offset] != _V2 or view[offset + 1] != _J:
                break
            if budget is not None and budget.items < 1:
                break
            sequence, length = unpack(view, offset + _HEADER)
            frame = _DATA_HEADER + length
            if length > max_frame or offset + frame > size:
                break
            if self._window_bytes + frame > max_window:
                break
            self.fields_read += 2
            if budget is not None:
                budget.items -= 1
            raw = view[offset + _DATA_HEADER : offset + frame]
            try:
                record = loads(raw)
            except orjson.JSONDecodeError as exc:
                raise self._fail(f"J frame {sequence} is not valid JSON: {exc}") from None
            if type(record) is not dict:
                raise self._fail(f"J frame {sequence} is not a JSON object")
            self._event(sequence, record, str(raw, "utf-8"), frame, windows)
            offset += frame
        return offset

    def _need(self, view: memoryview, n: int) -> None:
        if len(view) < n:
            raise _Incomplete

    def _spend(self, budget: _Budget | None, items: int) -> None:
        if budget is None:
            return
        budget.items -= items
        if budget.items < 0:
            allowed = C_FRAME_BASE_ITEMS + C_FRAME_ITEMS_PER_BYTE * budget.compressed
            raise self._fail(
                f"C frame of {budget.compressed} bytes holds more than {allowed} frames and pairs"
            )

    def _frame(
        self, view: memoryview, windows: list[Window], depth: int, budget: _Budget | None
    ) -> int:
        self._need(view, _HEADER)
        version = _VERSIONS.get(view[0])
        if version is None:
            raise self._fail(f"unknown protocol version byte {view[0]:#04x}")
        if self.version is None:
            self.version = version
        elif version != self.version:
            raise self._fail(f"v{version} frame on a v{self.version} connection")
        kind = view[1]
        self._spend(budget, 1)
        if kind == _W:
            return self._window(view, windows, version, budget)
        if kind == _D and version == 1:
            return self._data_v1(view, windows, budget)
        if kind == _J and version == 2:
            return self._data_json(view, windows)
        if kind == _C:
            return self._compressed(view, windows, depth, budget)
        raise self._fail(f"unknown frame type {bytes([kind])!r} for v{version}")

    def _u32(self, view: memoryview, offset: int) -> int:
        self._need(view, offset + 4)
        self.fields_read += 1
        return int(_U32.unpack_from(view, offset)[0])

    def _window(
        self, view: memoryview, windows: list[Window], version: int, budget: _Budget | None
    ) -> int:
        size = self._u32(view, _HEADER)
        if self._state is LumberjackState.IN_WINDOW:
            raise self._fail(
                f"new window before the last one was complete "
                f"({len(self._pending.texts)} of {self._window_size} events)"
            )
        if size > self.limits.max_window_size:
            raise self._fail(
                f"window of {size} events exceeds max_window_size={self.limits.max_window_size}"
            )
        if budget is not None:
            budget.windows -= 1
            if budget.windows < 0:
                raise self._fail(f"C frame holds more than {MAX_WINDOWS_PER_C_FRAME} windows")
        self._window_size = size
        if size > 0:
            self._move(LumberjackState.IN_WINDOW)
            return _HEADER + 4
        # An empty window still wants its ack, as soon as the windows before it
        # are acked; a run of them is one object that takes one ack per frame.
        self._move(LumberjackState.AWAITING_WINDOW)
        self._empty_windows += 1
        return _HEADER + 4

    def _flush_empty_windows(self, windows: list[Window]) -> None:
        """The run of ``W 0`` frames since the last window, as one window."""
        if self._empty_windows:
            assert self.version is not None
            windows.append(Window(self.version, acks=self._empty_windows))
            self._empty_windows = 0

    def _length(self, view: memoryview, offset: int, what: str) -> int:
        length = self._u32(view, offset)
        if length > self.limits.max_frame_bytes:
            raise self._fail(
                f"{what} of {length} bytes exceeds max_frame_bytes={self.limits.max_frame_bytes}"
            )
        return length

    def _open_data(self, sequence: int) -> None:
        """A data frame's header arrived: it must belong to a window."""
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

    def _window_room(self, frame_bytes: int) -> None:
        """Refuse a data frame that would take the window past ``max_window_bytes``."""
        if self._window_bytes + frame_bytes > self.limits.max_window_bytes:
            raise self._fail(
                f"window exceeds max_window_bytes={self.limits.max_window_bytes} "
                f"({len(self._pending.texts)} events held)"
            )

    def _data_v1(self, view: memoryview, windows: list[Window], budget: _Budget | None) -> int:
        sequence = self._u32(view, _HEADER)
        pairs = self._u32(view, _HEADER + 4)
        self._open_data(sequence)
        self._spend(budget, pairs)  # before the scan: a false count fails at once
        end = self._d_frame_end(view, pairs, outer=budget is None)
        record: dict[str, Any] = {}
        offset = _DATA_HEADER
        for _ in range(pairs):
            # The scan checked every length: no bounds checks here.
            key_length = int(_U32.unpack_from(view, offset)[0])
            key = view[offset + 4 : offset + 4 + key_length]
            offset += 4 + key_length
            value_length = int(_U32.unpack_from(view, offset)[0])
            value = view[offset + 4 : offset + 4 + value_length]
            offset += 4 + value_length
            record[_d_key(key)] = _d_value(value)
        self._event(sequence, record, record_json(record), end, windows)
        return end

    def _d_frame_end(self, view: memoryview, pairs: int, *, outer: bool) -> int:
        """Where the ``D`` frame at the start of ``view`` ends; checks every length.

        An outer frame cut short keeps the scan's position, and the next
        read resumes there: a frame that arrives in many pieces is scanned
        once, not once per piece (which was quadratic).
        """
        offset, left = _DATA_HEADER, pairs
        if outer and self._d_scan is not None:
            offset, left = self._d_scan
        # Two length fields per pair, read inline: this loop is the hot path of
        # a D frame (a pair is as little as 8 bytes).
        frame_limit = self.limits.max_frame_bytes
        limit = min(frame_limit, self.limits.max_window_bytes - self._window_bytes)
        size = len(view)
        unpack = _U32.unpack_from
        pair, scanning = offset, left
        while left:
            pair = offset
            if offset + 4 > size:
                break  # the key's length is cut short
            key_end = offset + 4 + unpack(view, offset)[0]
            if key_end + 4 > limit:
                offset = key_end + 4  # over a limit whatever follows
                break
            if key_end + 4 > size:
                break  # the key or the value's length is cut short
            value_end = key_end + 4 + unpack(view, key_end)[0]
            if value_end > limit:
                offset = value_end
                break
            if value_end > size:
                break  # the value is cut short
            offset = value_end
            left -= 1
        self.fields_read += 2 * (scanning - left) + (2 if left else 0)
        # A scan stopped by a limit moved ``offset`` past it; a frame with no
        # pairs (10 bytes) is checked here too.
        if offset > frame_limit:
            raise self._fail(f"D frame exceeds max_frame_bytes={frame_limit}")
        self._window_room(offset)
        if left:
            if outer:
                # The next read resumes at the pair cut short: reading its two
                # length fields again is all that is done twice.
                self._d_scan = (pair, left)
            raise _Incomplete
        self._d_scan = None
        return offset

    def _data_json(self, view: memoryview, windows: list[Window]) -> int:
        sequence = self._u32(view, _HEADER)
        length = self._length(view, _HEADER + 4, "J frame")
        if length > defaults.RECORD_MAX_BYTES:
            # Its text is the record: one over the record limit is never stored,
            # so it is refused before it is buffered or parsed (docs/limits.md).
            raise self._fail(
                f"J frame {sequence} of {length} bytes is over the record limit of "
                f"{defaults.RECORD_MAX_BYTES} (RECORD_MAX_BYTES)"
            )
        self._open_data(sequence)
        end = _DATA_HEADER + length
        self._window_room(end)
        self._need(view, end)
        raw = view[_DATA_HEADER:end]
        if length > defaults.RECORD_MAX_VALUES:
            # Only a frame this long can hold more objects and arrays than a
            # record may hold values; counted as bytes before parsing (those
            # inside strings too, so the count errs on the safe side): orjson
            # builds some 40 bytes a byte of ``[[],[],...]`` and has no limit.
            text = raw.tobytes()
            if text.count(b"{") + text.count(b"[") > defaults.RECORD_MAX_VALUES:
                raise self._fail(
                    f"J frame {sequence} holds more than {defaults.RECORD_MAX_VALUES} "
                    "JSON objects and arrays (RECORD_MAX_VALUES)"
                )
        try:
            # orjson: strict RFC 8259 (no NaN, valid UTF-8, no lone surrogate
            # escapes, bounded nesting), and several times faster than the
            # stdlib on the hot path.
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise self._fail(f"J frame {sequence} is not valid JSON: {exc}") from None
        if type(record) is not dict:
            raise self._fail(f"J frame {sequence} is not a JSON object")
        # The validated text is kept as the record: no second encoding.
        self._event(sequence, record, str(raw, "utf-8"), end, windows)
        return end

    def _compressed(
        self, view: memoryview, windows: list[Window], depth: int, budget: _Budget | None
    ) -> int:
        length = self._length(view, _HEADER, "C frame")
        end = _HEADER + 4 + length
        self._need(view, end)
        if depth >= MAX_COMPRESSION_DEPTH:
            raise self._fail(f"C frames nested deeper than {MAX_COMPRESSION_DEPTH}")
        if budget is None:
            budget = _Budget(length, self.limits.max_decompressed_bytes)
        else:
            self._spend(budget, NESTED_C_FRAME_ITEMS - 1)  # one was spent as a frame
        payload = self._inflate(view[_HEADER + 4 : end], budget)
        self._frames(memoryview(payload), windows, depth=depth + 1, budget=budget)
        return end

    def _inflate(self, data: memoryview, budget: _Budget) -> bytes:
        limit = budget.decompressed
        self.streams_inflated += 1
        decompressor = zlib.decompressobj()
        try:
            # Bounded: a zlib bomb stops at the limit without inflating further.
            out = decompressor.decompress(data, limit + 1)
        except zlib.error as exc:
            raise self._fail(f"C frame is not valid zlib: {exc}") from None
        self.bytes_inflated += len(out)
        if len(out) > limit:
            raise self._fail(
                "C frame decompresses past "
                f"max_decompressed_bytes={self.limits.max_decompressed_bytes}"
            )
        if not decompressor.eof:
            raise self._fail("C frame's zlib stream is truncated")
        budget.decompressed -= len(out)
        return out

    # -- events ----------------------------------------------------------------

    def _shared_text(self, value: str | None, what: str, limit: int) -> tuple[str | None, bool]:
        """``value`` if storable (the shared copy when seen before); False when it is not."""
        if value is None:
            return None, True
        shared = self._shared.get(value)
        if shared is not None:
            return shared, True
        try:
            check_text(value, what, limit)
        except InvalidText:
            return None, False
        if len(self._shared) < _MAX_SHARED_STRINGS:
            self._shared[value] = value
        return value, True

    def _event(
        self,
        sequence: int,
        record: dict[str, Any],
        text: str,
        nbytes: int,
        windows: list[Window],
    ) -> None:
        tag, tag_ok = self._shared_text(first_string(record, self._tag_paths), "tag", MAX_TAG_BYTES)
        host, host_ok = self._shared_text(first_string(record, HOST_PATHS), "host", MAX_HOST_BYTES)
        pending = self._pending
        pending.sequences.append(sequence)
        pending.texts.append(text)
        pending.tags.append(tag)
        pending.hosts.append(host)
        pending.times_ns.append(rfc3339_ns(record.get("@timestamp")))
        self._invalid_tags += not tag_ok
        self._invalid_hosts += not host_ok
        self._window_bytes += nbytes
        if len(pending.texts) == self._window_size:
            self._complete_window(windows)

    def _complete_window(self, windows: list[Window]) -> None:
        """The pending window is whole: return it and await the next ``W``."""
        pending = self._pending
        assert self.version is not None
        self._flush_empty_windows(windows)
        windows.append(
            replace(
                pending,
                version=self.version,
                nbytes=self._window_bytes,
                invalid_tags=self._invalid_tags,
                invalid_hosts=self._invalid_hosts,
            )
        )
        self._pending = Window(0)
        self._window_bytes = self._invalid_tags = self._invalid_hosts = 0
        self._move(LumberjackState.AWAITING_WINDOW)

    # -- answers ---------------------------------------------------------------

    def _ack(self, sequence: int) -> bytes:
        version = self.version or 2
        return bytes([ord(str(version)), _A]) + _U32.pack(sequence & 0xFFFFFFFF)

    # The answers touch only ``_last_acked`` and ``version``, which parsing
    # never writes after the first frame: the driver may call them while
    # :meth:`receive_data` runs in a worker thread.

    def ack_bytes(self, window: Window) -> bytes:
        """The ack of ``window``, to send once its events are committed.

        Windows must be acked in the order they were returned.
        """
        return self.ack_bytes_for(window.highest_sequence, window.acks)

    def ack_bytes_for(self, highest_sequence: int | None, acks: int = 1) -> bytes:
        """The ack of a window whose highest sequence is ``highest_sequence`` (None: empty).

        What :meth:`ack_bytes` sends, for a caller that keeps only these two
        numbers of the window until its commit.
        """
        if highest_sequence is not None:
            self._last_acked = highest_sequence
        return self._ack(self._last_acked) * acks

    def keepalive_bytes(self) -> bytes:
        """An ack that acknowledges nothing new, sent while a window waits.

        v2 sends sequence 0, as go-lumber and Logstash do (Beats and pylogbeat
        keep waiting); v1 clients get the last sequence already acknowledged.
        """
        return self._ack(0 if self.version == 2 else self._last_acked)
