"""Log Courier, server side, as a sans-IO codec.

The first spec is ``docs/Protocol.md`` in
https://github.com/driskell/log-courier (PING, PONG, JDAT, ACKN, ``????``);
the current protocol, as the Go client and server there speak it, adds the
HELO/VERS handshake and the streamed EVNT message. ``docs/courier.md`` cites
the code each rule comes from.

Every message is ``type (4 bytes) | length (u32, big-endian) | body``:

* ``HELO`` (client): up to 32 bytes of flags, version and client id; the
  server answers ``VERS`` in the Go layout, advertising EVNT;
* ``PING`` (client, empty) -> ``PONG`` (server, empty);
* ``JDAT`` (client): a 16-byte nonce, then a zlib stream of events, each a
  u32 length and that many bytes of JSON;
* ``EVNT`` (client): length ``0xFFFFFFFF``, a nonce, then the same zlib
  stream; the message ends where the zlib stream ends;
* ``ACKN`` (server): the nonce and the count of events acknowledged so far;
* ``????``: the answer to a message type the receiver does not know.

HELO layouts (every body length 0..32 is read, never a crash):
0 and 9..32 bytes are the Go layout zero-padded to 32, as the Go receiver
reads any body up to 32 bytes (``protocolhelo.go``; the Go client sends 32,
the Ruby client since v2.7.2 sends 20 in the same layout); 1..8 bytes are the
compact layout of the Ruby client v2.7.0/v2.7.1 (flags, major, minor, patch
as single bytes, client id), zero-padded to 8. Over 32 bytes is refused.

Events become rows here, one at a time (to bound memory): as soon as
an event's bytes are complete it is decoded, turned into its JSON record text
(:func:`appliance.blocks.records.record_json`, valid UTF-8), and only that text and
the three fields the rows need are kept; the decoded object is dropped. The
rules for those fields (docs/decisions.md#strict-strings):

* ``type`` (the tag) and ``host`` (``host.name``, ``beat.hostname`` or
  ``host``) are taken when they are non-empty strings that are valid UTF-8
  (a JSON ``"\ud800"`` escape is not) within
  :data:`~appliance.blocks.text.MAX_TAG_BYTES` /
  :data:`~appliance.blocks.text.MAX_HOST_BYTES`. A value that breaks the
  rule is not an error for the payload: that field alone falls back (the
  listener's tag, a null host) and is counted in ``invalid_types`` /
  ``invalid_hosts``; the record text keeps the value under the records
  convention (a lone surrogate becomes ``{"$binary": ...}``). Log Courier
  already keeps per-event fallbacks (not-JSON events), so one odd field never
  costs the client its payload, and the client cannot fix it by resending.
* ``@timestamp`` goes through :func:`appliance.blocks.timefmt.rfc3339_ns`: ASCII
  digits only, int64 nanoseconds only; anything else (``²``, Arabic-Indic
  digits, Go's zero time ``0001-01-01T00:00:00Z``) keeps the event with the
  receive time (docs/table.md, "Times").
* An event that is not a JSON object is kept as ``{"message": <raw>}`` and
  counted in ``not_json``; raw bytes that are not UTF-8 become
  ``{"$binary": ...}`` there (records convention), so every record text is
  valid UTF-8.
* The nonce is the batch id as 32 lowercase hex characters (16 raw bytes are
  not text); the session checks it with the shared text rule.

Invariants this module keeps (the h11 way):

* :meth:`CourierServerConnection.receive_data` consumes every byte it is
  given and returns the events completed by them, in order. Input split at
  any byte gives the same events as the input in one piece.
* Payload bodies are inflated as they arrive and never buffered compressed.
  The codec holds at most one message header, a nonce, a HELO body, one
  partial event (``limits.max_event_bytes``), the Python objects of the one
  event being decoded (briefly; at most about 25x that event's bytes, for a
  JSON array of empty objects), and the kept rows of the payload in
  progress. Those
  rows are counted as they are made (:attr:`PayloadReceived.memory_bytes`:
  ``sys.getsizeof`` of each record text plus :data:`EVENT_OVERHEAD_BYTES` per
  event and each distinct tag/host string once) and bounded by
  ``limits.max_payload_memory_bytes`` and ``limits.max_events``. ASCII JSON
  events hold their text plus about 130 bytes each: 1.1x the decompressed
  bytes for 1 KiB events, 1.3x at 400 bytes, 1.6x at 200. What grows more is
  hostile or broken (empty events, about 36x; raw control bytes that become
  six-character escapes, times four once one character lies outside the BMP
  and Python stores 4 bytes per character, about 24x), and the memory limit
  (by default twice the decompressed cap) cuts it off. Each decompressed byte
  is copied and decoded a bounded number of times: work is linear in what
  zlib produces, and each event is decoded exactly once.
* :attr:`CourierServerConnection.buffered_bytes` is 0 between messages and
  positive while one is unfinished (for the driver's request deadline).
* A violation moves the connection to ``CLOSED`` and ends the events
  :meth:`~CourierServerConnection.receive_data` returns as a
  :class:`~appliance.protocols.errors.ProtocolViolation`; nothing is
  accepted afterwards. No exception escapes
  :meth:`~CourierServerConnection.receive_data` for any input.
* The codec never acknowledges anything by itself: the driver asks for
  :meth:`CourierServerConnection.ack_bytes` once a payload is committed, and
  for :meth:`CourierServerConnection.keepalive_bytes` (an ACKN that
  acknowledges nothing) while it waits.
"""

from __future__ import annotations

import hashlib
import json
import json.scanner
import re
import sys
import zlib
from collections.abc import Callable
from typing import Any, Final, Literal

from appliance import __version__
from appliance.blocks.fields import HOST_PATHS, first_string
from appliance.blocks.records import record_json
from appliance.blocks.timecache import Rfc3339Cache
from appliance.blocks.timefmt import rfc3339_ns
from appliance.protocols.courier.events import (
    NONCE_BYTES,
    CourierEvent,
    CourierLimits,
    Hello,
    PayloadReceived,
    Ping,
    UnknownMessage,
    Unsupported,
)
from appliance.protocols.courier.payload import EVENT_OVERHEAD_BYTES, _Rows, _string_field
from appliance.protocols.courier.state import _TRANSITIONS, CourierState, _Phase
from appliance.protocols.courier.wire import (
    _COMPACT_HELLO,
    _HEADER,
    _SERVER_TYPES,
    _U32,
    _WIDE_HELLO,
    FLAG_SUPPORTS_EVNT,
    MAX_COMPACT_HELLO_BYTES,
    MAX_HELLO_BYTES,
    SERVER_ID,
    STREAMED_LENGTH,
    encode_message,
)
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation, RemoteProtocolError

__all__ = ["CourierServerConnection"]


#: Bytes of the content digest in a batch id (:attr:`PayloadReceived.batch_id`).
_CONTENT_DIGEST_BYTES: Final = 8

#: Output asked of zlib per call, in bytes: bounds the memory one call may take.
_INFLATE_STEP_BYTES: Final = 256 * 1024
#: JSON text to a value; events are UTF-8 (no encoding sniffing as json.loads(bytes) does).
_json_decode: Final = json.JSONDecoder().decode
#: A decoder's scanner: ``_json_decode(text)`` is ``_json_scan(text, 0)[0]``
#: for text that starts with a value and ends with it or JSON whitespace.
#: ``JSONDecoder.decode`` is that plus a regex match for the whitespace on
#: either side, and raises ``StopIteration`` as a ValueError
#: (https://github.com/python/cpython/blob/v3.11.7/Lib/json/decoder.py#L332-L355);
#: the fast loop calls the scanner for text that starts with ``{``.
_json_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed names the scanner class as its argument
)
#: What JSON calls whitespace (RFC 8259 section 2; ``json.decoder.WHITESPACE``).
_JSON_WHITESPACE: Final = " \t\n\r"
#: Where an event names its tag: Log Courier's ``fields: {type: ...}`` convention.
_TYPE_PATH: Final = (("type",),)
#: The longest ``@timestamp`` a run keeps until its end: ``rfc3339_ns`` reads no
#: longer text (appliance/blocks/timefmt.py), so a longer one is None at once.
_MAX_TIME_TEXT: Final = 64


def _server_version() -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", __version__)[:3]]
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2])


class CourierServerConnection:
    """The server side of one Log Courier connection, with no I/O.

    Feed it whatever the transport read with :meth:`receive_data`; it
    returns the completed events. Answer them with :meth:`vers_bytes`,
    :meth:`pong_bytes`, :meth:`unknown_bytes`, and a payload with
    :meth:`ack_bytes` once its events are committed.

    Args:
        limits: the size limits of this connection.
        server_version: the version VERS reports (default: the appliance's).
    """

    def __init__(
        self,
        limits: CourierLimits | None = None,
        *,
        server_version: tuple[int, int, int] | None = None,
    ) -> None:
        self.limits = limits or CourierLimits()
        self._server_version = server_version or _server_version()
        self._state = CourierState.IDLE
        #: The client's HELO; None for a client that skipped the handshake.
        self.hello: Hello | None = None
        # The message being received.
        self._phase = _Phase.HEADER
        self._small = bytearray()  # header, HELO body or nonce, as it arrives
        self._need = _HEADER.size
        self._kind = b""
        self._length = 0
        self._remaining = 0  # body bytes still to come (JDAT, TRAILER, SKIP)
        self._message_bytes = 0  # wire bytes of the current message taken so far
        # The payload being received.
        self._nonce = b""
        self._digest = hashlib.blake2b(digest_size=_CONTENT_DIGEST_BYTES)
        self._inflater: Any = None  # zlib.Decompress; typeshed names it privately
        self._compressed = 0
        self._decompressed = 0
        self._pending = bytearray()  # decompressed bytes of an incomplete event
        self._rows = _Rows()
        self._times = Rfc3339Cache()
        #: Read events in one loop (:meth:`_split_events`); False reads each by
        #: :meth:`_event`, the path the loop is held to (tests only).
        self.fast = True

    @property
    def state(self) -> CourierState:
        """The connection's current state."""
        return self._state

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished message this codec holds; 0 between messages.

        A partial header counts its bytes. Once a header is read, the
        message's wire bytes taken so far count (header, nonce, HELO body,
        compressed or skipped body), plus for a payload the bytes inflated so
        far (its kept rows and partial event): so the count is positive until
        the message ends, and a payload's count follows what it holds. 0 once
        the connection is closed.
        """
        if self._state is CourierState.CLOSED:
            return 0
        if self._phase is _Phase.HEADER:
            return len(self._small)
        if self._phase is _Phase.INFLATE or self._phase is _Phase.TRAILER:
            return self._message_bytes + self._decompressed
        return self._message_bytes

    @property
    def supports_evnt(self) -> bool:
        """This server accepts EVNT, so VERS says so (docs/courier.md)."""
        return True

    def _move(self, new: CourierState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise LocalProtocolError(f"no transition from {self._state.value} to {new.value}")
        self._state = new

    def _open(self) -> None:
        if self._state is CourierState.IDLE:
            self._move(CourierState.OPEN)

    def _fail(self, reason: str) -> RemoteProtocolError:
        if self._state is not CourierState.CLOSED:
            self._move(CourierState.CLOSED)
        self._inflater = None
        self._pending = bytearray()
        self._rows = _Rows()
        return RemoteProtocolError(reason)

    # -- input -----------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> list[CourierEvent]:
        """Take bytes read from the peer; return the events they complete.

        When ``data`` breaks the protocol or a limit, the last event is a
        :class:`ProtocolViolation` and the connection is ``CLOSED``; the
        events before it are returned (complete payloads may still be
        committed and acked).

        Raises:
            LocalProtocolError: called after the connection closed.
        """
        if self._state is CourierState.CLOSED:
            raise LocalProtocolError("receive_data on a closed courier connection")
        events: list[CourierEvent] = []
        try:
            self._receive(memoryview(data), events)
        except RemoteProtocolError as error:
            events.append(ProtocolViolation.of(error))
        return events

    def _receive(self, view: memoryview, events: list[CourierEvent]) -> None:
        while view:
            phase = self._phase
            if phase is _Phase.INFLATE:
                view = self._inflate_some(view, events)
            elif phase is _Phase.TRAILER or phase is _Phase.SKIP:
                take = min(self._remaining, len(view))
                view = view[take:]
                self._remaining -= take
                self._message_bytes += take
                if self._remaining == 0:
                    self._body_done(events)
            else:
                take = min(self._need - len(self._small), len(view))
                self._small += view[:take]
                view = view[take:]
                self._message_bytes += take  # ignored in the HEADER phase
                if len(self._small) == self._need:
                    small = bytes(self._small)
                    self._small.clear()
                    self._fixed_part(small, events)

    def _fixed_part(self, data: bytes, events: list[CourierEvent]) -> None:
        """A header, HELO body or nonce has arrived whole."""
        if self._phase is _Phase.HEADER:
            self._header(data, events)
        elif self._phase is _Phase.HELLO:
            self._hello(data, events)
        else:
            self._start_inflate(data)

    def _expect(self, phase: _Phase, need: int) -> None:
        self._phase = phase
        self._need = need

    def _header(self, data: bytes, events: list[CourierEvent]) -> None:
        kind, length = _HEADER.unpack(data)
        self._kind, self._length = kind, length
        self._message_bytes = _HEADER.size  # counted from here if a body follows
        if kind == b"JDAT" or kind == b"EVNT":
            self._payload_header(kind, length)
        elif kind == b"PING":
            self._empty(kind, length)
            self._open()
            events.append(Ping())
        elif kind == b"????":
            self._empty(kind, length)
            events.append(Unsupported())
        elif kind == b"HELO":
            if self._state is not CourierState.IDLE:
                raise self._fail("HELO after the connection was already open")
            if length > MAX_HELLO_BYTES:
                raise self._fail(f"HELO body of {length} bytes exceeds {MAX_HELLO_BYTES}")
            if length == 0:
                self._hello(b"", events)
            else:
                self._expect(_Phase.HELLO, length)
        elif kind in _SERVER_TYPES:
            raise self._fail(f"{kind.decode('ascii')} is a server message, sent by the client")
        else:
            self._unknown(kind, length, events)

    def _empty(self, kind: bytes, length: int) -> None:
        if length != 0:
            name = kind.decode("ascii")
            raise self._fail(f"{name} must have an empty body, not {length} bytes")

    def _hello(self, body: bytes, events: list[CourierEvent]) -> None:
        # Every length 0..MAX_HELLO_BYTES maps to one layout and is padded to
        # its full size first, so unpacking cannot fail (9..19 bytes
        # used to raise struct.error).
        if 0 < len(body) <= MAX_COMPACT_HELLO_BYTES:
            compact = body.ljust(_COMPACT_HELLO.size, b"\x00")
            flags, major, minor, patch, client = _COMPACT_HELLO.unpack(compact)
            hello = Hello(bytes([flags, 0, 0, 0]), (major, minor, patch), client)
        else:
            wide = body.ljust(_WIDE_HELLO.size, b"\x00")
            flag_bytes, major, minor, patch, client = _WIDE_HELLO.unpack(wide)
            hello = Hello(flag_bytes, (major, minor, patch), client)
        self.hello = hello
        self._open()
        self._expect(_Phase.HEADER, _HEADER.size)
        events.append(hello)

    def _unknown(self, kind: bytes, length: int, events: list[CourierEvent]) -> None:
        if length == STREAMED_LENGTH:
            # A streamed message of a type we cannot parse has no known end.
            raise self._fail(f"unknown streamed message {kind!r}: its end cannot be found")
        if length > self.limits.max_payload_bytes:
            raise self._fail(
                f"unknown message {kind!r} of {length} bytes exceeds "
                f"max_payload_bytes={self.limits.max_payload_bytes}"
            )
        if length == 0:
            events.append(UnknownMessage(kind, 0))
            return
        self._phase = _Phase.SKIP
        self._remaining = length

    def _payload_header(self, kind: bytes, length: int) -> None:
        if kind == b"EVNT":
            if length != STREAMED_LENGTH:
                raise self._fail(f"EVNT length must be {STREAMED_LENGTH:#x}, not {length}")
        else:
            if length == STREAMED_LENGTH or length > self.limits.max_payload_bytes:
                raise self._fail(
                    f"JDAT of {length} bytes exceeds "
                    f"max_payload_bytes={self.limits.max_payload_bytes}"
                )
            if length <= NONCE_BYTES:
                raise self._fail(f"JDAT of {length} bytes is too short for a nonce and zlib data")
            self._remaining = length - NONCE_BYTES
        self._open()
        self._expect(_Phase.NONCE, NONCE_BYTES)

    def _start_inflate(self, nonce: bytes) -> None:
        self._nonce = nonce
        self._digest = hashlib.blake2b(digest_size=_CONTENT_DIGEST_BYTES)
        self._inflater = zlib.decompressobj()
        self._compressed = 0
        self._decompressed = 0
        self._pending = bytearray()
        self._rows = _Rows()
        self._phase = _Phase.INFLATE

    def _inflate_some(self, view: memoryview, events: list[CourierEvent]) -> memoryview:
        """Feed payload bytes to zlib; returns the input left after the payload."""
        streamed = self._kind == b"EVNT"
        if streamed:
            room = self.limits.max_payload_bytes - NONCE_BYTES - self._compressed
            if room <= 0:
                raise self._fail(
                    f"EVNT exceeds max_payload_bytes={self.limits.max_payload_bytes} "
                    f"before its zlib stream ends"
                )
            chunk = view[:room]
        else:
            chunk = view[: self._remaining]
        used = self._inflate(chunk)
        self._compressed += used
        ended = bool(self._inflater.eof)
        if streamed:
            self._message_bytes += used
            if ended:
                self._payload_done(events)
            return view[used:]
        self._remaining -= len(chunk)
        self._message_bytes += len(chunk)
        if ended:
            # The Go receiver stops reading a JDAT body where its zlib stream
            # ends; bytes after it, inside the declared length, are skipped.
            self._inflater = None
            if self._remaining == 0:
                self._payload_done(events)
            else:
                self._phase = _Phase.TRAILER
        elif self._remaining == 0:
            raise self._fail("JDAT ends before its zlib stream does (truncated payload)")
        return view[len(chunk) :]

    def _inflate(self, chunk: memoryview) -> int:
        """Inflate ``chunk``; returns the bytes zlib used (fewer when its stream ended)."""
        inflater = self._inflater
        limit = self.limits.max_decompressed_bytes
        pending: bytes | memoryview = chunk
        try:
            while not inflater.eof:
                step = min(_INFLATE_STEP_BYTES, limit - self._decompressed + 1)
                out = inflater.decompress(pending, step)
                self._decompressed += len(out)
                if self._decompressed > limit:
                    raise self._fail(
                        f"payload {self._nonce.hex()} decompresses past "
                        f"max_decompressed_bytes={limit}"
                    )
                self._digest.update(out)
                self._split_events(out)
                pending = inflater.unconsumed_tail
                if not pending and len(out) < step:
                    break  # all input taken and zlib holds no more output for it
        except zlib.error as exc:
            raise self._fail(f"payload {self._nonce.hex()} does not decompress: {exc}") from None
        if inflater.eof:
            return len(chunk) - len(inflater.unused_data)
        return len(chunk)

    def _split_events(self, out: bytes) -> None:
        """Cut decompressed output into length-prefixed events, and keep each one's row.

        The common event (a UTF-8 JSON object) is read here in one loop with no
        Python call of its own: its tag and host are looked up in the
        payload's table of strings already checked, and its ``@timestamp`` is
        read with the run's others at the end (:class:`Rfc3339Cache`, which
        gives ``rfc3339_ns`` of each). Any other event goes to :meth:`_event`,
        the event-by-event path, which the fast loop is held to by a
        differential test (tests/appliance/protocols/test_courier_fast.py).
        """
        if not out:
            return
        buffer = self._pending
        buffer += out
        offset = 0
        end = len(buffer)
        limits = self.limits
        limit = limits.max_event_bytes
        if not self.fast:
            while end - offset >= 4:
                (size,) = _U32.unpack_from(buffer, offset)
                if size > limit:
                    raise self._fail(f"event of {size} bytes exceeds max_event_bytes={limit}")
                if end - offset - 4 < size:
                    break
                self._event(bytes(buffer[offset + 4 : offset + 4 + size]))
                offset += 4 + size
            del buffer[:offset]
            return
        rows = self._rows
        records = rows.records
        types = rows.types
        hosts = rows.hosts
        checked_types = rows.checked_types
        checked_hosts = rows.checked_hosts
        max_events = limits.max_events
        max_memory = limits.max_payload_memory_bytes
        view = memoryview(buffer)
        # The run's @timestamp values (a string of at most _MAX_TIME_TEXT
        # characters, else None: rfc3339_ns reads no longer one), read at the end.
        stamps: list[object] = []
        try:
            while end - offset >= 4:
                (size,) = _U32.unpack_from(buffer, offset)
                if size > limit:
                    raise self._fail(f"event of {size} bytes exceeds max_event_bytes={limit}")
                start = offset + 4
                if end - start < size:
                    break
                offset = start + size
                if len(records) >= max_events:
                    raise self._fail(
                        f"payload {self._nonce.hex()} carries more than "
                        f"max_events={max_events} events"
                    )
                try:
                    text = str(view[start:offset], "utf-8")
                    if text[:1] == "{":
                        record, stop = _json_scan(text, 0)
                        if stop != len(text) and text[stop:].strip(_JSON_WHITESPACE):
                            record = None  # "Extra data", as _json_decode says
                    else:
                        record = _json_decode(text)
                except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
                    # StopIteration: the scanner's "no value here".
                    record = None
                if type(record) is not dict:
                    # Not a JSON object: the event-by-event path keeps it as
                    # {"message": ...}; the times read so far go first, in order.
                    del record
                    self._flush_times(stamps)
                    self._event(bytes(view[start:offset]))
                    continue
                text = record_json(record)
                # Log Courier's tag: fields.type (_TYPE_PATH), as first_string reads it.
                value = record.get("type")
                if type(value) is str and value:
                    kept = checked_types.get(value)
                    if kept is None:
                        kept = _string_field(rows, value, "type")
                        if kept is not None:
                            checked_types[kept] = kept
                    types.append(kept)
                else:
                    types.append(None)
                # HOST_PATHS unrolled: host.name, beat.hostname, host.
                host = record.get("host")
                value = host.get("name") if type(host) is dict else None
                if not (type(value) is str and value):
                    beat = record.get("beat")
                    value = beat.get("hostname") if type(beat) is dict else None
                    if not (type(value) is str and value):
                        value = host
                if type(value) is str and value:
                    kept = checked_hosts.get(value)
                    if kept is None:
                        kept = _string_field(rows, value, "host")
                        if kept is not None:
                            checked_hosts[kept] = kept
                    hosts.append(kept)
                else:
                    hosts.append(None)
                stamp = record.get("@timestamp")
                del record  # the decoded object is not kept (bounded memory)
                stamps.append(
                    stamp if type(stamp) is str and len(stamp) <= _MAX_TIME_TEXT else None
                )
                records.append(text)
                rows.memory_bytes += sys.getsizeof(text) + EVENT_OVERHEAD_BYTES
                if rows.memory_bytes > max_memory:
                    raise self._fail(
                        f"payload {self._nonce.hex()} holds more than "
                        f"max_payload_memory_bytes={max_memory} as rows"
                    )
            self._flush_times(stamps)
        finally:
            view.release()
        del buffer[:offset]

    def _flush_times(self, stamps: list[object]) -> None:
        """Append the times of the run's ``stamps`` to the payload's rows, and empty ``stamps``."""
        if stamps:
            self._rows.times_ns.extend(self._times.times_ns(stamps))
            stamps.clear()

    def _event(self, raw: bytes) -> None:
        """One complete event: keep its row, drop everything else (module docstring)."""
        rows = self._rows
        limits = self.limits
        if len(rows.records) >= limits.max_events:
            raise self._fail(
                f"payload {self._nonce.hex()} carries more than "
                f"max_events={limits.max_events} events"
            )
        text: str | None
        record: object = None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            try:
                record = _json_decode(text)
            except (ValueError, RecursionError):
                # RecursionError: nesting deeper than the interpreter allows.
                record = None
        if type(record) is dict:
            rows.add(
                record_json(record),
                _string_field(rows, first_string(record, _TYPE_PATH), "type"),
                _string_field(rows, first_string(record, HOST_PATHS), "host"),
                rfc3339_ns(record.get("@timestamp")),
            )
        else:
            # Ruby's rule: kept as {"message": raw}; bytes that are not UTF-8
            # become {"$binary": ...} under the records convention.
            rows.not_json += 1
            rows.add(record_json({"message": raw if text is None else text}), None, None, None)
        del record  # the decoded object is not kept (bounded memory)
        if rows.memory_bytes > limits.max_payload_memory_bytes:
            raise self._fail(
                f"payload {self._nonce.hex()} holds more than "
                f"max_payload_memory_bytes={limits.max_payload_memory_bytes} as rows"
            )

    def _payload_done(self, events: list[CourierEvent]) -> None:
        if self._pending:
            raise self._fail(
                f"payload {self._nonce.hex()} ends inside an event "
                f"({len(self._pending)} bytes left over)"
            )
        kind: Literal["JDAT", "EVNT"] = "EVNT" if self._kind == b"EVNT" else "JDAT"
        rows, self._rows = self._rows, _Rows()
        events.append(rows.payload(self._nonce, kind, self._digest.digest()))
        self._inflater = None
        self._expect(_Phase.HEADER, _HEADER.size)

    def _body_done(self, events: list[CourierEvent]) -> None:
        """A TRAILER or SKIP phase has consumed its last byte."""
        if self._phase is _Phase.TRAILER:
            self._payload_done(events)
        else:
            events.append(UnknownMessage(self._kind, self._length))
            self._expect(_Phase.HEADER, _HEADER.size)

    # -- answers ---------------------------------------------------------------

    def vers_bytes(self) -> bytes:
        """VERS in the Go layout (32 bytes), advertising EVNT: the answer to HELO."""
        major, minor, patch = self._server_version
        flags = bytes([FLAG_SUPPORTS_EVNT if self.supports_evnt else 0, 0, 0, 0])
        return encode_message(b"VERS", _WIDE_HELLO.pack(flags, major, minor, patch, SERVER_ID))

    @staticmethod
    def pong_bytes() -> bytes:
        """PONG: the answer to PING."""
        return encode_message(b"PONG")

    @staticmethod
    def unknown_bytes() -> bytes:
        """``????``: the answer to a message type this server does not know."""
        return encode_message(b"????")

    @staticmethod
    def ackn_bytes(nonce: bytes, count: int) -> bytes:
        """ACKN: the nonce echoed exactly and a cumulative event count."""
        if len(nonce) != NONCE_BYTES:
            raise LocalProtocolError(f"a nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
        return encode_message(b"ACKN", nonce + _U32.pack(count))

    def ack_bytes(self, payload: PayloadReceived) -> bytes:
        """The final ACKN of ``payload``: call it only once its events are committed."""
        return self.ackn_bytes(payload.nonce, payload.count)

    def keepalive_bytes(self, payload: PayloadReceived) -> bytes:
        """A partial ACKN that acknowledges nothing, to send while ``payload`` waits.

        The count is 0: the appliance commits a payload whole, so before the
        commit no event of it is acknowledged. Clients ignore a count that
        is not above the last one they saw, but reset their network timeout
        on every ACKN (``payload.go``, ``publisher.go``).
        """
        return self.ackn_bytes(payload.nonce, 0)
