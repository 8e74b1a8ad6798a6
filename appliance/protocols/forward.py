"""Fluentd forward protocol v1, server side, as a sans-IO codec.

The seed spec is ``shared/specs/forward-protocol-v1.md``; DESIGN §4 and
``docs/forward.md`` record what real peers send that the spec leaves open.

Invariants this module keeps (the h11 way):

* :meth:`ForwardServerConnection.receive_data` consumes every byte it is given
  and returns the events completed by them. A request split across reads at
  any byte gives the same events as the request in one read.
* A partial request never holds more than ``limits.max_request_bytes`` bytes,
  a decompressed ``entries`` stream never more than
  ``limits.max_decompressed_bytes``, and a request never more than
  ``limits.max_events_per_request`` events.
* Any :class:`~appliance.protocols.errors.RemoteProtocolError` moves the
  connection to ``CLOSED``; nothing is accepted afterwards.
* The codec never acknowledges anything by itself: the driver asks for
  :meth:`ForwardServerConnection.ack_bytes` once the events are committed
  (DESIGN §2, "ack only what is committed").
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgpack

from appliance.protocols.compression import (
    InvalidDataError,
    OutputLimitError,
    TruncatedError,
    gunzip,
)
from appliance.protocols.errors import LocalProtocolError, RemoteProtocolError
from appliance.protocols.forward_handshake import (
    REASON_INVALID_PING,
    Helo,
    Ping,
    Verdict,
    pong_bytes,
    refusal_bytes,
    verify_ping,
)
from appliance.protocols.limits import require_at_least_one

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "DEFAULT_MAX_EVENTS_PER_REQUEST",
    "DEFAULT_MAX_REQUEST_BYTES",
    "Chunk",
    "EventTime",
    "EventsReceived",
    "ForwardEvent",
    "ForwardLimits",
    "ForwardServerConnection",
    "ForwardState",
    "Heartbeat",
    "PingReceived",
    "gunzip_members",
]

#: Largest request (one msgpack array, or one JSON value) accepted, in bytes.
#: Fluentd's default buffer chunk is 8 MiB and Fluent Bit's about 2 MiB.
DEFAULT_MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
#: Largest decompressed ``entries`` of a CompressedPackedForward request, in bytes.
DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
#: Most events one request may carry.
DEFAULT_MAX_EVENTS_PER_REQUEST: Final = 250_000

_NS_PER_SECOND: Final = 1_000_000_000
#: Seconds beyond which an epoch time no longer fits int64 nanoseconds (year 2262).
_MAX_TIME_SECONDS: Final = (2**63 - 1) // _NS_PER_SECOND
#: EventTime is msgpack ext type 0 carrying two big-endian u32 (spec: "EventTime Ext Format").
_EVENT_TIME_EXT_TYPE: Final = 0
_EVENT_TIME: Final = struct.Struct(">II")
#: The first byte of a JSON request ('[' or '{'); in_forward picks JSON by it.
_JSON_FIRST_BYTES: Final = frozenset(b"[{")
_JSON_WHITESPACE: Final = frozenset(b" \t\r\n")


@dataclass(frozen=True, slots=True)
class ForwardLimits:
    """Limits that guard one connection against abuse (all configurable)."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    max_events_per_request: int = DEFAULT_MAX_EVENTS_PER_REQUEST

    def __post_init__(self) -> None:
        require_at_least_one(
            self, "max_request_bytes", "max_decompressed_bytes", "max_events_per_request"
        )


class EventTime(int):
    """Fluentd EventTime (ext type 0): an ``int`` of epoch nanoseconds.

    An ``int`` subclass rather than a dataclass because one is built per event
    from the msgpack ext hook, on the hot path; being an ``int`` it also
    serialises inside a record as its nanoseconds (docs/table.md).
    """

    __slots__ = ()

    def __new__(cls, seconds: int, nanoseconds: int = 0) -> EventTime:
        return super().__new__(cls, seconds * _NS_PER_SECOND + nanoseconds)

    @property
    def seconds(self) -> int:
        """Whole seconds since the epoch."""
        return int(self) // _NS_PER_SECOND

    @property
    def nanoseconds(self) -> int:
        """The nanoseconds within the second."""
        return int(self) % _NS_PER_SECOND

    def to_ns(self) -> int:
        """The instant in epoch nanoseconds."""
        return int(self)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The ``chunk`` option exactly as the client sent it.

    The ack must echo the same bytes with the same msgpack type (spec:
    "Response"), so both are kept.
    """

    raw: bytes
    kind: Literal["str", "bin"] = "str"

    def text(self) -> str:
        """The chunk id as text, for the ``batch_id`` column and for logs."""
        return self.raw.decode("utf-8", "backslashreplace")


@dataclass(frozen=True, slots=True)
class EventsReceived:
    """A request that carried events (any of the four carrier modes).

    ``times_ns[i]`` is the epoch-nanosecond time of ``records[i]``, or
    ``None`` when the client sent no usable time (nil or 0: in_forward then
    uses the time of receipt, and so does the appliance). ``dropped`` counts
    invalid events that were left out, by reason.
    """

    tag: str
    mode: Literal["message", "forward", "packed", "compressed"]
    times_ns: list[int | None]
    records: list[dict[Any, Any]]
    chunk: Chunk | None
    dropped: dict[str, int] = field(default_factory=dict)
    #: True when the request came in the JSON form (the ack must be JSON too).
    json: bool = False


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A msgpack ``nil`` sent by the client to check the connection."""


@dataclass(frozen=True, slots=True)
class PingReceived:
    """The client's PING (spec "PING"): check it, then :meth:`finish_handshake`."""

    ping: Ping


ForwardEvent = EventsReceived | Heartbeat | PingReceived


class ForwardState(enum.Enum):
    """Where a connection is. Transitions: ``_TRANSITIONS`` below."""

    #: Nothing received yet: the first byte picks msgpack or JSON.
    IDLE = "idle"
    #: HELO sent (security on): the first request must be a PING.
    AWAITING_PING = "awaiting-ping"
    #: PING received: bytes are held until the verdict.
    AUTHENTICATING = "authenticating"
    TRANSPORT_MSGPACK = "transport-msgpack"
    TRANSPORT_JSON = "transport-json"
    CLOSED = "closed"


#: The state machine as data: the states each state may move to.
_TRANSITIONS: Final[dict[ForwardState, frozenset[ForwardState]]] = {
    ForwardState.IDLE: frozenset(
        {ForwardState.TRANSPORT_MSGPACK, ForwardState.TRANSPORT_JSON, ForwardState.CLOSED}
    ),
    ForwardState.AWAITING_PING: frozenset({ForwardState.AUTHENTICATING, ForwardState.CLOSED}),
    ForwardState.AUTHENTICATING: frozenset({ForwardState.TRANSPORT_MSGPACK, ForwardState.CLOSED}),
    ForwardState.TRANSPORT_MSGPACK: frozenset({ForwardState.CLOSED}),
    ForwardState.TRANSPORT_JSON: frozenset({ForwardState.CLOSED}),
    ForwardState.CLOSED: frozenset(),
}


class _InvalidEvent(Exception):
    """One event inside a valid request is unusable; it is dropped and counted."""


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EVENT_TIME_EXT_TYPE and len(data) == _EVENT_TIME.size:
        seconds, nanoseconds = _EVENT_TIME.unpack(data)
        if nanoseconds < _NS_PER_SECOND:
            return EventTime(seconds, nanoseconds)
    # Anything else stays an extension value; as an entry time it is invalid
    # ("EventTime nanoseconds out of range" included) and the event is dropped.
    return msgpack.ExtType(code, data)


def _new_unpacker(max_buffer_size: int) -> msgpack.Unpacker:
    # raw=False with surrogateescape keeps str values that are not UTF-8
    # (out_forward packs the binary entries stream as str, spec "PackedForward"):
    # their original bytes come back with .encode("utf-8", "surrogateescape").
    # strict_map_key=False: records may have integer keys.
    return msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        strict_map_key=False,
        ext_hook=_ext_hook,
        max_buffer_size=max(max_buffer_size, 1),
    )


def gunzip_members(data: bytes, limit: int) -> bytes:
    """Decompress one or several concatenated gzip members, at most ``limit`` bytes out.

    Spec "CompressedPackedForward": entries "MAY be a concatenated binary of
    multiple gzip binary strings". Decompression is streamed and stops as soon
    as the output would pass ``limit``, so a gzip bomb costs at most ``limit``.

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


def _time_ns(value: Any) -> int | None:
    """Epoch nanoseconds of an event time, ``None`` for "use the receive time"."""
    kind = type(value)
    if kind is EventTime:
        return int(value)
    if kind is msgpack.ExtType and value.code == _EVENT_TIME_EXT_TYPE and len(value.data) == 8:
        raise _InvalidEvent("EventTime nanoseconds out of range")  # _ext_hook refused it
    if kind is int:
        if value == 0:
            return None
        if abs(value) > _MAX_TIME_SECONDS:
            raise _InvalidEvent("time out of range")
        return int(value) * _NS_PER_SECOND
    if value is None:
        return None
    if kind is float:
        if not math.isfinite(value) or abs(value) > _MAX_TIME_SECONDS:
            raise _InvalidEvent("time out of range")
        if value == 0:
            return None
        seconds = math.floor(value)
        return int(seconds * _NS_PER_SECOND + round((value - seconds) * _NS_PER_SECOND))
    if kind is list and len(value) == 2 and type(value[1]) is dict and type(value[0]) is not list:
        # Fluent Bit 2.1+ sends [[time, metadata], record]: the time is the
        # first element; the metadata map is not kept (docs/forward.md).
        return _time_ns(value[0])
    raise _InvalidEvent(f"time is not an integer or EventTime ({kind.__name__})")


def _count(dropped: dict[str, int], reason: str) -> None:
    dropped[reason] = dropped.get(reason, 0) + 1


class ForwardServerConnection:
    """The server side of one forward connection, with no I/O.

    Feed it whatever the transport read with :meth:`receive_data`; it returns
    the completed events. Ask :meth:`ack_bytes` for the bytes of an ack once
    the events of a chunk are committed.

    With ``helo`` (security on) the connection opens with the handshake: send
    :meth:`helo_bytes`, wait for :class:`PingReceived`, check it, and answer
    with :meth:`finish_handshake`. Requests before the PING are refused, and
    bytes after it are held until the verdict.

    Args:
        limits: the size limits of this connection.
        allow_json: accept in_forward's single-event JSON form (never with a
            handshake, spec "Fluentd Forward Server").
        helo: the HELO to open with (its nonce and auth salt), or None.
    """

    def __init__(
        self,
        limits: ForwardLimits | None = None,
        *,
        allow_json: bool = True,
        helo: Helo | None = None,
    ) -> None:
        self.limits = limits or ForwardLimits()
        self._helo = helo
        self._allow_json = allow_json and helo is None
        self._state = ForwardState.IDLE if helo is None else ForwardState.AWAITING_PING
        self._ping: Ping | None = None
        self._unpacker = _new_unpacker(self.limits.max_request_bytes)
        self._fed = 0
        #: Stream offset where the request being received began. The unpacker's
        #: own tell() is no measure: it advances inside a partial request.
        self._request_start = 0
        self._json = _JsonFramer(self.limits.max_request_bytes)
        self._pending_error: RemoteProtocolError | None = None

    @property
    def state(self) -> ForwardState:
        """The connection's current state."""
        return self._state

    def _move(self, new: ForwardState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise LocalProtocolError(f"no transition from {self._state.value} to {new.value}")
        self._state = new

    def _fail(self, reason: str) -> RemoteProtocolError:
        if self._state is not ForwardState.CLOSED:
            self._move(ForwardState.CLOSED)
        return RemoteProtocolError(reason)

    def receive_data(self, data: bytes | bytearray) -> list[ForwardEvent]:
        """Take bytes read from the peer; return the events they complete.

        When ``data`` holds complete requests followed by a violation, the
        requests are returned (they may still be committed and acked) and the
        connection is ``CLOSED``: the next call raises the pending error.

        Raises:
            RemoteProtocolError: the peer broke the protocol or a limit; the
                connection is now ``CLOSED`` and must be closed.
            LocalProtocolError: called after the connection closed.
        """
        if self._pending_error is not None:
            error, self._pending_error = self._pending_error, None
            raise error
        if self._state is ForwardState.CLOSED:
            raise LocalProtocolError("receive_data on a closed forward connection")
        if not data:
            return []
        if self._state is ForwardState.IDLE:
            if data[0] in _JSON_FIRST_BYTES and self._allow_json:
                self._move(ForwardState.TRANSPORT_JSON)
            else:
                self._move(ForwardState.TRANSPORT_MSGPACK)
        events: list[ForwardEvent] = []
        try:
            if self._state is ForwardState.TRANSPORT_JSON:
                self._receive_json(data, events)
            else:
                self._receive_msgpack(data, events)
        except RemoteProtocolError as error:
            if not events:
                raise
            self._pending_error = error
        return events

    # -- msgpack -----------------------------------------------------------

    def _receive_msgpack(self, data: bytes | bytearray, events: list[ForwardEvent]) -> None:
        view = memoryview(data)
        limit = self.limits.max_request_bytes
        while view:
            # Feed no more than fits: the unpacker's buffer then holds at most
            # one partial request, and a full buffer means an oversized request.
            room = limit - (self._fed - self._request_start)
            if room <= 0:
                raise self._fail(f"request exceeds max_request_bytes={limit}")
            piece, view = view[:room], view[room:]
            self._unpacker.feed(piece)
            self._fed += len(piece)
            self._drain(events)

    def _drain(self, events: list[ForwardEvent]) -> None:
        """Decode the complete requests buffered (none while a PING is being checked)."""
        if self._state is ForwardState.AUTHENTICATING:
            return
        try:
            for obj in self._unpacker:
                self._request_start = self._unpacker.tell()
                if self._state is ForwardState.AWAITING_PING:
                    events.append(self._ping_request(obj))
                    return
                events.append(self._request(obj, json_form=False))
        except (ValueError, TypeError) as exc:
            # msgpack's FormatError/StackError/ExtraData are ValueErrors;
            # an unhashable map key is a TypeError.
            raise self._fail(f"request is not valid msgpack: {exc}") from None

    # -- handshake -------------------------------------------------------------

    def helo_bytes(self) -> bytes:
        """The HELO to send first (spec "HELO")."""
        if self._helo is None:
            raise LocalProtocolError("this connection has no handshake")
        return self._helo.to_bytes()

    def _ping_request(self, obj: Any) -> PingReceived:
        ping = Ping.parse(obj)
        if ping is None:
            # in_forward answers anything but a PING with this PONG and closes.
            error = self._fail(f"{REASON_INVALID_PING}: expected PING before any request")
            error.reply = refusal_bytes(REASON_INVALID_PING)
            raise error
        self._move(ForwardState.AUTHENTICATING)
        self._ping = ping
        return PingReceived(ping)

    def check_ping(
        self,
        *,
        shared_keys: Sequence[bytes],
        users_required: bool,
        password: bytes | None,
        allowed_users: frozenset[str] | None = None,
        allow_anonymous: bool = False,
    ) -> Verdict:
        """Verify the received PING with this connection's nonce and auth salt."""
        if self._ping is None or self._helo is None:
            raise LocalProtocolError("check_ping before a PING was received")
        return verify_ping(
            self._ping,
            nonce=self._helo.nonce,
            auth_salt=self._helo.auth_salt,
            shared_keys=shared_keys,
            users_required=users_required,
            password=password,
            allowed_users=allowed_users,
            allow_anonymous=allow_anonymous,
        )

    def finish_handshake(
        self, verdict: Verdict, server_hostname: str
    ) -> tuple[bytes, list[ForwardEvent]]:
        """The PONG for ``verdict``, and the events of the bytes held meanwhile.

        Raises:
            RemoteProtocolError: the verdict is a refusal; its ``reply`` is the
                PONG false to send before closing.
        """
        if self._state is not ForwardState.AUTHENTICATING or self._ping is None:
            raise LocalProtocolError("finish_handshake without a PING being checked")
        assert self._helo is not None
        pong = pong_bytes(verdict, self._ping, server_hostname=server_hostname,
                          nonce=self._helo.nonce)  # fmt: skip
        if not verdict.ok:
            self._move(ForwardState.CLOSED)
            raise RemoteProtocolError(verdict.reason, reply=pong)
        self._move(ForwardState.TRANSPORT_MSGPACK)
        events: list[ForwardEvent] = []
        try:
            self._drain(events)
        except RemoteProtocolError as error:
            self._pending_error = error
        return pong, events

    def refuse(self, reason: str) -> RemoteProtocolError:
        """Close the handshake with a PONG false carrying ``reason`` (policy refusals)."""
        error = self._fail(reason)
        error.reply = refusal_bytes(reason)
        return error

    # -- JSON ----------------------------------------------------------------

    def _receive_json(self, data: bytes | bytearray, events: list[ForwardEvent]) -> None:
        values: list[bytes] = []
        error: str | None = None
        try:
            self._json.feed(data, values)
        except ValueError as exc:
            # The values framed before the violation are still requests.
            error = str(exc)
        for raw in values:
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                # RecursionError: arrays nested deeper than the interpreter allows.
                raise self._fail(f"request is not valid JSON: {exc}") from None
            events.append(self._request(obj, json_form=True))
        if error is not None:
            raise self._fail(error)

    # -- requests ------------------------------------------------------------

    def _request(self, obj: Any, *, json_form: bool) -> ForwardEvent:
        """Classify one decoded request (spec "Grammar")."""
        if obj is None:
            return Heartbeat()
        if type(obj) is not list:
            raise self._fail(f"request is not an array ({type(obj).__name__})")
        if len(obj) < 2:
            raise self._fail(f"request array has {len(obj)} element(s), at least 2 needed")
        tag = obj[0]
        if type(tag) is not str:
            raise self._fail("tag is not a string")
        second = obj[1]
        kind = type(second)
        if kind is list:
            option = self._option(obj, 2)
            return self._forward(tag, second, option, json_form)
        if kind is bytes or kind is str:
            if json_form:
                raise self._fail("PackedForward entries cannot come in the JSON form")
            option = self._option(obj, 2)
            return self._packed(tag, second, option)
        # Message mode: [tag, time, record, option?]. The spec says the server
        # detects the mode by the second element: anything else is a time.
        option = self._option(obj, 3)
        if len(obj) < 3:
            raise self._fail("Message mode request has no record")
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        self._entry(second, obj[2], times, records, dropped)
        return EventsReceived(
            tag, "message", times, records, self._chunk(option), dropped, json_form
        )

    def _option(self, obj: list[Any], index: int) -> dict[Any, Any]:
        if len(obj) <= index or obj[index] is None:
            return {}
        option = obj[index]
        if type(option) is not dict:
            raise self._fail("option is not a map")
        return option

    def _chunk(self, option: dict[Any, Any]) -> Chunk | None:
        chunk = option.get("chunk")
        if chunk is None:
            return None
        if type(chunk) is str:
            return Chunk(chunk.encode("utf-8", "surrogateescape"), "str")
        if type(chunk) is bytes:
            return Chunk(chunk, "bin")
        raise self._fail("chunk option is not a string")

    def _forward(
        self, tag: str, entries: list[Any], option: dict[Any, Any], json_form: bool
    ) -> EventsReceived:
        if len(entries) > self.limits.max_events_per_request:
            raise self._fail(
                f"request carries {len(entries)} events, "
                f"over max_events_per_request={self.limits.max_events_per_request}"
            )
        chunk = self._chunk(option)
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        for entry in entries:
            self._array_entry(entry, times, records, dropped)
        return EventsReceived(tag, "forward", times, records, chunk, dropped, json_form)

    def _packed(self, tag: str, entries: bytes | str, option: dict[Any, Any]) -> EventsReceived:
        chunk = self._chunk(option)
        stream = entries.encode("utf-8", "surrogateescape") if type(entries) is str else entries
        assert isinstance(stream, bytes)
        compressed = option.get("compressed")
        mode: Literal["packed", "compressed"] = "packed"
        # Spec "Option": compressed is "gzip"; absent or "text" (what Fluentd
        # itself sends for uncompressed chunks) means plain msgpack.
        if compressed == "gzip":
            mode = "compressed"
            try:
                stream = gunzip_members(stream, self.limits.max_decompressed_bytes)
            except RemoteProtocolError as exc:
                raise self._fail(exc.reason) from None
        elif compressed not in (None, "text"):
            raise self._fail(f"unsupported compression {compressed!r}")
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        self._decode_entries(stream, times, records, dropped)
        return EventsReceived(tag, mode, times, records, chunk, dropped)

    def _decode_entries(
        self,
        stream: bytes,
        times: list[int | None],
        records: list[dict[Any, Any]],
        dropped: dict[str, int],
    ) -> None:
        """Decode a MessagePackEventStream; a corrupt tail is counted, not fatal.

        This is the hot path of PackedForward (bench/RESULTS.md): the common
        ``[EventTime | int, map]`` entry is handled inline, everything else by
        :meth:`_array_entry`, which counts the reasons for dropping.
        """
        unpacker = _new_unpacker(len(stream))
        unpacker.feed(stream)
        limit = self.limits.max_events_per_request
        seen = 0
        end = 0  # where the last complete entry ends (tell() also counts a partial one)
        append_time = times.append
        append_record = records.append
        try:
            for entry in unpacker:
                end = unpacker.tell()
                seen += 1
                if seen > limit:
                    raise self._fail(f"request carries over max_events_per_request={limit} events")
                if type(entry) is list and len(entry) == 2:
                    time, record = entry
                    if type(record) is dict:
                        if type(time) is EventTime:
                            append_time(int(time))
                            append_record(record)
                            continue
                        if type(time) is int and 0 < time <= _MAX_TIME_SECONDS:
                            append_time(time * _NS_PER_SECOND)
                            append_record(record)
                            continue
                self._array_entry(entry, times, records, dropped)
        except (ValueError, TypeError):
            _count(dropped, "entries stream is not valid msgpack")
            return
        if end != len(stream):
            _count(dropped, "entries stream ends inside an entry")

    @staticmethod
    def _array_entry(
        entry: Any,
        times: list[int | None],
        records: list[dict[Any, Any]],
        dropped: dict[str, int],
    ) -> None:
        if type(entry) is not list or len(entry) < 2:
            _count(dropped, "entry is not a [time, record] array")
            return
        ForwardServerConnection._entry(entry[0], entry[1], times, records, dropped)

    @staticmethod
    def _entry(
        time: Any,
        record: Any,
        times: list[int | None],
        records: list[dict[Any, Any]],
        dropped: dict[str, int],
    ) -> None:
        if type(record) is not dict:
            _count(dropped, "record is not a map")
            return
        try:
            ns = _time_ns(time)
        except _InvalidEvent as exc:
            _count(dropped, str(exc))
            return
        times.append(ns)
        records.append(record)

    # -- answers -------------------------------------------------------------

    def ack_bytes(self, chunk: Chunk, *, json_form: bool = False) -> bytes:
        """The bytes of ``{"ack": chunk}``, echoing the chunk exactly (spec "Response").

        Call it only once the events of the chunk are committed. A JSON-form
        request gets its ack as JSON, as in_forward does.
        """
        if json_form:
            return json.dumps({"ack": chunk.text()}).encode()
        # Built by hand so the chunk keeps its msgpack type and its exact
        # bytes even when a str chunk is not valid UTF-8.
        header = _str_header(len(chunk.raw)) if chunk.kind == "str" else _bin_header(len(chunk.raw))
        return b"\x81\xa3ack" + header + chunk.raw


def _str_header(n: int) -> bytes:
    if n < 32:
        return bytes([0xA0 | n])
    if n < 2**8:
        return b"\xd9" + struct.pack(">B", n)
    if n < 2**16:
        return b"\xda" + struct.pack(">H", n)
    return b"\xdb" + struct.pack(">I", n)


def _bin_header(n: int) -> bytes:
    if n < 2**8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 2**16:
        return b"\xc5" + struct.pack(">H", n)
    return b"\xc6" + struct.pack(">I", n)


class _JsonFramer:
    """Splits a byte stream into top-level JSON values, without parsing them.

    in_forward accepts a JSON request when the connection's first byte is
    '[' or '{' (spec "Fluentd Forward Server", note). Values may follow each
    other with or without whitespace. The scanner tracks nesting and strings
    only; :func:`json.loads` validates each complete value.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._scan = 0  # next byte of _buf to look at
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, data: bytes | bytearray, values: list[bytes]) -> None:
        """Append the values that ``data`` completes to ``values``.

        Raises:
            ValueError: the stream is not a sequence of arrays, or a value is
                over the limit; ``values`` then holds those framed before.
        """
        self._buf += data
        buf = self._buf
        start = 0
        i = self._scan
        n = len(buf)
        while i < n:
            c = buf[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == 0x5C:  # backslash
                    self._escaped = True
                elif c == 0x22:
                    self._in_string = False
            elif c == 0x22:
                if self._depth == 0:
                    raise ValueError("JSON request is not an array")
                self._in_string = True
            elif c == 0x5B or c == 0x7B:
                if self._depth == 0:
                    start = i
                self._depth += 1
            elif c == 0x5D or c == 0x7D:
                self._depth -= 1
                if self._depth < 0:
                    raise ValueError("JSON request has an unbalanced bracket")
                if self._depth == 0:
                    if i + 1 - start > self._limit:
                        raise ValueError(f"request exceeds max_request_bytes={self._limit}")
                    values.append(bytes(buf[start : i + 1]))
                    start = i + 1
            elif self._depth == 0:
                if c not in _JSON_WHITESPACE:
                    raise ValueError("JSON request is not an array")
                start = i + 1
            i += 1
        del buf[:start]
        self._scan = i - start
        if len(buf) > self._limit:
            raise ValueError(f"request exceeds max_request_bytes={self._limit}")
