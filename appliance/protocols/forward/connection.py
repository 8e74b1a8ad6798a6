"""Fluentd forward protocol v1, server side, as a sans-IO codec.

The specification is Fluentd's "Forward Protocol Specification v1"
(https://github.com/fluent/fluentd/wiki/Forward-Protocol-Specification-v1);
``docs/forward.md`` records what real peers send that it leaves open.

Invariants this module keeps (the h11 way):

* :meth:`ForwardServerConnection.receive_data` consumes every byte it is given
  and returns the events completed by them. A request split across reads at
  any byte gives the same events as the request in one read.
* A partial request never holds more than ``limits.max_request_bytes`` bytes
  (:data:`MAX_PING_BYTES` before the handshake's PONG), a decompressed
  ``entries`` stream (gzip or zstd) never more than
  ``limits.max_decompressed_bytes``, and a request never more than
  ``limits.max_events_per_request`` events.
* A violation moves the connection to ``CLOSED`` and ends the events
  :meth:`ForwardServerConnection.receive_data` returns as a
  :class:`~appliance.protocols.errors.ProtocolViolation` (with the answer to
  send, if any); nothing is accepted afterwards. The peer's bytes cause no
  exception.
* The codec never acknowledges anything by itself: the driver asks for
  :meth:`ForwardServerConnection.ack_bytes` once the events are committed
  (docs/decisions.md#acknowledge-only-what-is-durable). A request the codec cannot read
  whole is a violation, so it is never acked.

Strict strings (appliance/blocks/text.py; a violation for the request,
which is then not acked):

* ``tag``: valid UTF-8 (a msgpack str that is not, or a JSON ``"\\ud800"``,
  is refused) of at most ``MAX_TAG_BYTES``.
* ``chunk`` (str or bin; the ``batch_id`` column): 1 to ``MAX_BATCH_ID_BYTES``
  bytes. The ack echoes the exact bytes with the msgpack type they came in.
  :meth:`Chunk.text` is the chunk decoded as UTF-8, or, for a chunk that is
  not valid UTF-8 (a random binary id), ``"hex:"`` and its lowercase hex: so
  such a chunk may be at most :data:`MAX_BINARY_CHUNK_BYTES` bytes, and its
  text always fits the column. (Real clients send base64 text, which never
  holds ``:``, so the two forms cannot meet.) In the JSON form the chunk must
  be a valid UTF-8 string.
* the PING's ``client_hostname`` (the ``host`` column): see
  :mod:`appliance.protocols.forward.handshake`.

Reading whole requests: a request is framed with msgpack's skipping parser
(no Python objects) and decoded only once complete. An ``entries`` stream
(PackedForward, after gunzip or unzstd for CompressedPackedForward with
``compressed: "gzip"`` or ``"zstd"``) that is not valid msgpack, ends inside
an entry, or is gzip or zstd data without its ``compressed`` label, fails the
request, as Fluentd and Fluent Bit close without an ack;
single unusable entries inside a readable stream (record not a map, a bad
time, an entry that is not ``[time, record]``) are dropped and counted.

Memory (docs/forward.md, "Memory: records, slices and the decode budget"; measured
in tests/appliance/protocols/test_forward_hardening.py and test_forward_limits.py):

* a partial request is held as raw bytes only: in the framer's and the
  decoder's buffers, so at most about four times its size (each buffer grows
  by doubling; about 1.1 to 1.4 times with 64 to 256 KiB reads). The buffers
  are replaced after a large request, so an idle connection does not keep
  them. Before the PONG all this is bounded by :data:`MAX_PING_BYTES`.
* before it builds anything for a complete request, the codec asks its
  gate (:mod:`appliance.protocols.decode_gate`; the server's decode budget)
  for the request's worst-case cost, a pure function of its size and kind
  (:func:`request_kind`, :func:`appliance.defaults.forward_request_cost`).
  The gate may put the request off: it stays as bytes, the events before it
  are returned, and :meth:`ForwardServerConnection.resume` decodes it later.
* decoding builds at most about :data:`DECODE_MEMORY_FACTOR` bytes of Python
  objects per msgpack byte decoded at once (chains of one-entry maps, a dict
  for every two bytes; 112 measured); everyday records take 5 to 20. So an
  entries stream over ``slice_bytes`` (:class:`DecodeLimits`) is decoded a
  slice at a time: each slice's records become their JSON text
  (``EventsReceived.texts``; ``records`` stays empty) before the next is
  built; unless its whole decode takes no more than its reported cost
  (:func:`~appliance.protocols.forward.fast.decodes_whole`: up to about
  2.4 MiB), when it is decoded in one pass, its records likewise kept only
  as text. Every msgpack length a header claims is bounded by the bytes being
  decoded (:func:`_decode_options`), and nothing is built before the bytes
  that hold it have arrived. The JSON form builds at most about 50 bytes per
  byte (chains of ``{"":...}``; ``json.loads`` refuses nesting past about 1000).

Records (:class:`DecodeLimits`; docs/forward.md, "Records"): a record far
larger than any shipper sends refuses its request at its first excess. A
map or array longer than ``max_record_values``, or a str, bin or ext longer
than ``max_record_bytes``, at its header; a record's values as they are
counted (:class:`_ValueCounter`: entries streams over ``max_record_values``
bytes, the only ones that can hold such a record, and Message and Forward
mode requests, whose records count together); an entry
over ``max_record_bytes`` once decoded, and its JSON text once rendered.

CPU per byte is linear: the msgpack framer and the JSON framer look at each
byte once, gunzip never copies the input after a member, unzstd reads it in
place (:mod:`appliance.protocols.compression`), and each request is decoded once.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgpack

from appliance import defaults
from appliance.blocks.errors import InvalidText
from appliance.blocks.records import records_json
from appliance.blocks.text import MAX_BATCH_ID_BYTES, MAX_TAG_BYTES, check_text
from appliance.protocols.decode_gate import Admit, DecodeGate, always
from appliance.protocols.errors import (
    Fault,
    LocalProtocolError,
    ProtocolViolation,
    RemoteProtocolError,
)
from appliance.protocols.forward.decoding import (
    _MAX_TIME_SECONDS,
    _bounded_options,
    _count,
    _decode_options,
    _InvalidEvent,
    _new_framer,
    _time_ns,
    _TooManyValues,
    _ValueCounter,
)
from appliance.protocols.forward.decompress import _DECOMPRESSORS, _MAGICS
from appliance.protocols.forward.events import (
    _NS_PER_SECOND,
    MAX_BINARY_CHUNK_BYTES,
    Chunk,
    DecodeLimits,
    EventsReceived,
    EventTime,
    ForwardEvent,
    ForwardLimits,
    Heartbeat,
    PingReceived,
)
from appliance.protocols.forward.fast import (
    TextAllowance as _TextAllowance,
)
from appliance.protocols.forward.fast import (
    decodes_whole,
    fast_entries,
    fast_path_size,
    oversized,
    texts_within,
)
from appliance.protocols.forward.handshake import (
    REASON_INVALID_PING,
    Helo,
    InvalidPing,
    Ping,
    Verdict,
    pong_bytes,
    refusal_bytes,
    verify_ping,
)
from appliance.protocols.forward.head import (
    _HEAD_KEPT_BYTES,
    REQUEST_HEAD_BYTES,
    packed_request_min_bytes,
    request_kind,
)
from appliance.protocols.forward.json_framer import _JSON_FIRST_BYTES, _JsonFramer
from appliance.protocols.forward.state import _BEFORE_PONG, _TRANSITIONS, ForwardState

__all__ = [
    "FAST_PATH_PAUSE_REQUESTS",
    "MAX_PING_BYTES",
    "ForwardServerConnection",
]

#: Requests a connection decodes with the general path only after the fast
#: path (appliance/protocols/forward/fast.py) decoded one and missed: a client whose
#: records the fast path cannot take would otherwise pay for both on every
#: chunk. Then the fast path is tried again (the client's data may change).
FAST_PATH_PAUSE_REQUESTS: Final = 64
#: Bytes a connection may send before the handshake's PONG (security on): the
#: PING, and anything sent after it while it is checked. A PING is six short
#: strings (a 255-byte hostname, two 128-byte hex digests, a salt and a
#: username), so an unauthenticated peer cannot make the server hold or
#: decode more than this.
MAX_PING_BYTES: Final = 4096
#: Bytes asked of the gate beyond what a slice's texts overran their allowance
#: by, so that a stream of such texts asks once a MiB, not once a slice.
_TEXT_TOP_UP_BYTES: Final = 1024 * 1024
#: Unpacker buffers that grew past this many bytes are replaced once empty.
_UNPACKER_KEEP_BYTES: Final = 64 * 1024


class ForwardServerConnection:
    """The server side of one forward connection, with no I/O.

    Feed it whatever the transport read with :meth:`receive_data`; it returns
    the completed events. Ask :meth:`ack_bytes` for the bytes of an ack once
    the events of a chunk are committed.

    With ``helo`` (security on) the connection opens with the handshake: send
    :meth:`helo_bytes`, wait for :class:`PingReceived`, check it, and answer
    with :meth:`finish_handshake`. Requests before the PING are refused, and
    bytes after it are held until the verdict; before the PONG at most
    :data:`MAX_PING_BYTES` are taken.

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
        gate: DecodeGate = always,
        decode_limits: DecodeLimits | None = None,
    ) -> None:
        self.limits = limits or ForwardLimits()
        self.decode_limits = decode_limits or DecodeLimits()
        self._gate = gate
        self._helo = helo
        self._allow_json = allow_json and helo is None
        self._state = ForwardState.IDLE if helo is None else ForwardState.AWAITING_PING
        self._ping: Ping | None = None
        # Both unpackers are fed every byte; the framer finds where each
        # request ends, then the decoder builds it. Before the PONG the framer
        # lets no request past MAX_PING_BYTES, so the PING needs no options
        # of its own.
        self._buffer_limit = max(self.limits.max_request_bytes, MAX_PING_BYTES)
        self._options = _decode_options(self.limits.max_request_bytes)
        # No array longer than a request's events or a record's values, no map
        # longer than a record's values: refused at the header, by the framer.
        self._options["max_array_len"] = min(
            self._options["max_array_len"],
            max(self.decode_limits.max_record_values, self.limits.max_events_per_request),
        )
        self._options["max_map_len"] = min(
            self._options["max_map_len"], self.decode_limits.max_record_values
        )
        #: Values of the request being decoded (a Message or Forward mode
        #: request holds its records: they count together).
        self._values = _ValueCounter(self.decode_limits.max_record_values, "request")
        self._framer = _new_framer(self._buffer_limit, self._options)
        self._decoder = self._new_decoder()
        #: Bytes fed to both unpackers, and the framer's tell() at the end of
        #: the last complete request: the difference is the unfinished
        #: request (or, while AUTHENTICATING, everything held since the PING).
        self._fed = 0
        self._framed = 0
        #: Most bytes the unpackers have had to buffer at once (they never shrink).
        self._buffered_high = 0
        #: The first bytes of the unfinished request (at most _HEAD_KEPT_BYTES):
        #: enough to read its declared size (:meth:`completes_nothing`) and its
        #: kind (:func:`request_kind`).
        self._head = bytearray()
        #: Where ``_head`` starts (a position in the bytes fed): it describes the
        #: unfinished request only while this equals ``_framed``.
        self._head_at = 0
        self._json = _JsonFramer(self.limits.max_request_bytes)
        #: PackedForward requests left to decode without trying the fast path.
        self._fast_pause = 0
        #: The cost of the request the gate put off (framed, not yet decoded;
        #: :meth:`resume` decodes it), or 0.
        self._waiting = 0
        #: While a request waits: the bytes fed after it that the read which
        #: framed it held (to tell the kinds of the requests behind it), with
        #: the position of their first byte.
        self._after: tuple[int, bytes] = (0, b"")
        #: While a request waits: bytes received but not yet fed (a read's rest).
        self._backlog = bytearray()
        #: The JSON values framed and not yet decoded (while one waits: it and
        #: those after it), and the framing error that came after them.
        self._json_values: list[bytes] = []
        self._json_error: str | None = None

    def _new_decoder(self) -> msgpack.Unpacker:
        """The unpacker that builds a request, fed the same bytes as the framer but
        asked for an object only once the framer has found its end; it counts the
        values it builds (:class:`_ValueCounter`)."""
        return msgpack.Unpacker(
            max_buffer_size=max(self._buffer_limit, 1),
            list_hook=self._values.on_list,
            object_hook=self._values.on_map,
            **self._options,
        )

    @property
    def state(self) -> ForwardState:
        """The connection's current state."""
        return self._state

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished request held (0 between requests).

        While AUTHENTICATING: every byte received after the PING. While a
        request waits for the gate: the bytes received after it.
        """
        return self._fed - self._framed + self._json.buffered_bytes + len(self._backlog)

    @property
    def deferred_cost(self) -> int:
        """The cost of the request the gate answered :attr:`Admit.LATER`, or 0.

        Until it is 0 again the codec takes no more bytes: call
        :meth:`resume` once the gate will let that much through.
        """
        return self._waiting

    def completes_nothing(self, data: bytes | bytearray) -> bool:
        """True when receiving ``data`` cannot complete a request: it only fills the buffer.

        A PackedForward request (spec "PackedForward Mode") declares its
        entries' length in the header of its second element, so from the
        request's first bytes (held, or at the start of ``data``) the codec
        knows the fewest bytes it can take (:func:`packed_request_min_bytes`).
        Reads that leave it short complete nothing: the driver takes them on
        the event loop, without a worker thread (appliance/server/connection.py).
        False whenever it cannot tell: other modes, JSON, the handshake.
        """
        if self._state is not ForwardState.TRANSPORT_MSGPACK or not data or self._waiting:
            return False
        held = self._fed - self._framed
        if held and self._head_at != self._framed:
            # Requests were taken from the buffer since the head was kept (the
            # handshake's verdict drains what came after the PING): no head.
            return False
        head = self._head if held else b""
        if len(head) < REQUEST_HEAD_BYTES:
            head = bytes(head) + bytes(data[: REQUEST_HEAD_BYTES - len(head)])
        need = packed_request_min_bytes(head)
        return need > 0 and held + len(data) < need

    def _move(self, new: ForwardState) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise LocalProtocolError(f"no transition from {self._state.value} to {new.value}")
        self._state = new

    def _fail(self, reason: str, reply: bytes = b"") -> RemoteProtocolError:
        if self._state is not ForwardState.CLOSED:
            self._move(ForwardState.CLOSED)
        # Nothing more is read: free what the connection held.
        self._framer = self._decoder = _new_framer(1, {})
        self._fed = self._framed = self._waiting = 0
        self._head = bytearray()
        self._json = _JsonFramer(self.limits.max_request_bytes)
        self._after = (0, b"")
        self._backlog = bytearray()
        self._json_values = []
        self._json_error = None
        return RemoteProtocolError(reason, reply=reply)

    def _text(self, value: str, what: str, limit: int) -> str:
        try:
            return check_text(value, what, limit)
        except InvalidText as exc:
            raise self._fail(exc.reason) from None

    def receive_data(self, data: bytes | bytearray) -> list[ForwardEvent]:
        """Take bytes read from the peer; return the events they complete.

        When ``data`` breaks the protocol, the last event is a
        :class:`ProtocolViolation` and the connection is ``CLOSED``; the
        requests before it are returned (they may still be committed and
        acked). A PING followed by a violation is dropped (it is not checked).

        When the gate puts a request off (:attr:`deferred_cost`), the
        events before it are returned and the rest of ``data`` is kept:
        :meth:`resume` goes on from there.

        Raises:
            LocalProtocolError: called after the connection closed, or while
                a request waits for :meth:`resume`.
        """
        if self._state is ForwardState.CLOSED:
            raise LocalProtocolError("receive_data on a closed forward connection")
        if self._waiting:
            raise LocalProtocolError("receive_data while a request waits for resume()")
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
            self._violation(error, events)
        return events

    def resume(self) -> list[ForwardEvent]:
        """Decode the request the gate put off, and what came after it; the events.

        The gate is asked again for it (the caller has made room). It may
        put off this request again, or one behind it.

        Raises:
            LocalProtocolError: no request waits, or the connection closed.
        """
        if self._state is ForwardState.CLOSED or not self._waiting:
            raise LocalProtocolError("resume() without a request waiting")
        events: list[ForwardEvent] = []
        try:
            if self._state is ForwardState.TRANSPORT_JSON:
                self._decode_json_values(events)
            else:
                start, after = self._after
                with memoryview(after) as piece:
                    self._drain(events, piece, start)
                if not self._waiting and self._backlog:
                    backlog, self._backlog = bytes(self._backlog), bytearray()
                    self._receive_msgpack(backlog, events)
        except RemoteProtocolError as error:
            self._violation(error, events)
        return events

    @staticmethod
    def _violation(error: RemoteProtocolError, events: list[ForwardEvent]) -> None:
        # A PING whose read also broke a rule is not worth checking.
        if events and isinstance(events[-1], PingReceived):
            events.pop()
        events.append(ProtocolViolation.of(error))

    def _admit(self, cost: int) -> bool:
        """Ask the gate for ``cost``: True to decode now, False when it is put off.

        Raises:
            RemoteProtocolError: the gate refuses the request.
        """
        admission = self._gate(cost)
        if admission is Admit.GO:
            self._waiting = 0
            return True
        if admission is Admit.LATER:
            self._waiting = max(cost, 1)
            return False
        raise self._fail(admission)

    # -- msgpack -----------------------------------------------------------

    def _request_limit(self) -> int:
        if self._state in _BEFORE_PONG:
            return min(MAX_PING_BYTES, self.limits.max_request_bytes)
        return self.limits.max_request_bytes

    def _over_limit(self, limit: int) -> RemoteProtocolError:
        if self._state is ForwardState.AWAITING_PING:
            reason = f"{REASON_INVALID_PING}: PING exceeds {limit} bytes"
            return self._fail(reason, refusal_bytes(REASON_INVALID_PING))
        if self._state is ForwardState.AUTHENTICATING:
            reason = f"more than {limit} bytes sent before the PONG"
            return self._fail(reason, refusal_bytes(reason))
        return self._fail(f"request exceeds max_request_bytes={limit}")

    def _receive_msgpack(self, data: bytes | bytearray, events: list[ForwardEvent]) -> None:
        with memoryview(data) as whole:
            view = whole
            while view:
                if self._waiting:
                    # A request waits for the gate: keep the rest, in order.
                    self._backlog += view
                    break
                # Take no more than the unfinished request may still grow by:
                # then nothing past the limit is ever held.
                limit = self._request_limit()
                room = limit - (self._fed - self._framed)
                if room <= 0:
                    raise self._over_limit(limit)
                piece, view = view[:room], view[room:]
                self._framer.feed(piece)
                self._decoder.feed(piece)
                started = self._fed
                self._fed += len(piece)
                self._buffered_high = max(self._buffered_high, self._fed - self._framed)
                self._drain(events, piece, started)
                self._keep_head(piece, started)
        if (
            self._fed == self._framed
            and not self._waiting
            and self._buffered_high > _UNPACKER_KEEP_BYTES
        ):
            # msgpack's buffers never shrink: drop them after a large request.
            self._framer = _new_framer(self._buffer_limit, self._options)
            self._decoder = self._new_decoder()
            self._fed = self._framed = self._buffered_high = self._head_at = 0

    def _keep_head(self, piece: memoryview, started: int) -> None:
        """Keep the first bytes of the unfinished request; ``piece`` was fed from ``started``."""
        if self._framed >= started:
            # The unfinished request (if any) starts inside this piece.
            begin = self._framed - started
            self._head = bytearray(piece[begin : begin + _HEAD_KEPT_BYTES])
            self._head_at = self._framed
        elif len(self._head) < _HEAD_KEPT_BYTES:
            self._head += piece[: _HEAD_KEPT_BYTES - len(self._head)]

    def _request_head(self, start: int, piece: memoryview, started: int) -> bytes:
        """The first bytes of the request that begins at ``start`` (b"": not known)."""
        if start >= started:
            begin = start - started
            return bytes(piece[begin : begin + _HEAD_KEPT_BYTES])
        if self._head_at != start:
            return b""
        head = bytes(self._head)
        if len(head) < _HEAD_KEPT_BYTES and self._head_at + len(head) == started:
            head += bytes(piece[: _HEAD_KEPT_BYTES - len(head)])
        return head

    def _request_cost(self, start: int, size: int, piece: memoryview, started: int) -> int:
        """The worst-case memory decoding the request of ``size`` bytes at ``start`` takes."""
        if self._state is ForwardState.AWAITING_PING:
            kind = "msgpack"  # a PING, or refused as no PING: nothing is decompressed
        else:
            kind = request_kind(self._request_head(start, piece, started), size)
        return defaults.forward_request_cost(
            size,
            kind,
            max_decompressed_bytes=self.limits.max_decompressed_bytes,
            max_events=self.limits.max_events_per_request,
        )

    def _drain(self, events: list[ForwardEvent], piece: memoryview, started: int) -> None:
        """Decode the complete requests buffered (none while a PING is being checked).

        ``piece``: the bytes last fed, from position ``started`` (they tell
        the kind of the requests that begin in them). Each request is
        framed, its cost asked of the gate, then built; when the gate puts
        it off, draining stops until :meth:`resume`.
        """
        while self._state in (ForwardState.TRANSPORT_MSGPACK, ForwardState.AWAITING_PING):
            cost = self._waiting
            if not cost:
                start = self._framed
                try:
                    self._framer.skip()
                except msgpack.OutOfData:
                    return
                except ValueError as exc:
                    # FormatError (such as 0xc1), StackError (nested too deep),
                    # or a length over the limits.
                    raise self._fail(f"request is not valid msgpack: {exc}") from None
                self._framed = self._framer.tell()
                cost = self._request_cost(start, self._framed - start, piece, started)
            if not self._admit(cost):
                # Framed, not built: the bytes after it stay in both unpackers;
                # keep those of this piece, to tell the next requests' kinds.
                begin = max(self._framed - started, 0)
                self._after = (started + begin, bytes(piece[begin:]))
                return
            self._after = (0, b"")
            self._values.count = 0
            try:
                # Complete by the framer's word: this never runs out of data.
                obj = self._decoder.unpack()
            except _TooManyValues as exc:
                raise self._fail(str(exc)) from None
            except (ValueError, TypeError) as exc:
                # What the framer cannot see: an unhashable map key (TypeError).
                raise self._fail(f"request is not valid msgpack: {exc}") from None
            if self._state is ForwardState.AWAITING_PING:
                events.append(self._ping_request(obj))
            else:
                events.append(self._request(obj, json_form=False))

    # -- handshake -------------------------------------------------------------

    def helo_bytes(self) -> bytes:
        """The HELO to send first (spec "HELO")."""
        if self._helo is None:
            raise LocalProtocolError("this connection has no handshake")
        return self._helo.to_bytes()

    def _ping_request(self, obj: Any) -> PingReceived:
        try:
            ping = Ping.from_message(obj)
        except InvalidPing as exc:
            # in_forward answers anything but a PING with this PONG and closes.
            raise self._fail(
                f"{REASON_INVALID_PING}: {exc.reason}", refusal_bytes(REASON_INVALID_PING)
            ) from None
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
        """The PONG for ``verdict`` (always sent), and the events of the bytes held meanwhile.

        A refused verdict's events are one :class:`ProtocolViolation`: the
        PONG false goes out, then the connection closes.
        """
        if self._state is not ForwardState.AUTHENTICATING or self._ping is None:
            raise LocalProtocolError("finish_handshake without a PING being checked")
        assert self._helo is not None
        pong = pong_bytes(verdict, self._ping, server_hostname=server_hostname,
                          nonce=self._helo.nonce)  # fmt: skip
        if not verdict.ok:
            return pong, [ProtocolViolation.of(self._fail(verdict.reason))]
        self._move(ForwardState.TRANSPORT_MSGPACK)
        events: list[ForwardEvent] = []
        try:
            # Nothing new is fed: the requests held since the PING are in the
            # unpackers (the first one's head is kept, the others' kinds unknown).
            self._drain(events, memoryview(b""), self._fed)
        except RemoteProtocolError as error:
            events.append(ProtocolViolation.of(error))
        return pong, events

    def refuse(self, reason: str, fault: Fault = "peer") -> ProtocolViolation:
        """Close the handshake with a PONG false carrying ``reason`` (policy refusals)."""
        return ProtocolViolation.of(self._fail(reason, refusal_bytes(reason)), fault)

    # -- JSON ----------------------------------------------------------------

    def _receive_json(self, data: bytes | bytearray, events: list[ForwardEvent]) -> None:
        values: list[bytes] = []
        try:
            self._json.feed(data, values)
        except ValueError as exc:
            # The values framed before the violation are still requests.
            self._json_error = str(exc)
        self._json_values = values
        self._decode_json_values(events)

    def _decode_json_values(self, events: list[ForwardEvent]) -> None:
        """Decode the JSON values framed, each once the gate lets it; then any framing error."""
        values = self._json_values
        while values:
            raw = values[0]
            cost = self._waiting or defaults.forward_request_cost(
                len(raw),
                "json",
                max_decompressed_bytes=self.limits.max_decompressed_bytes,
                max_events=self.limits.max_events_per_request,
            )
            if not self._admit(cost):
                return
            del values[0]
            # Counted before parsing, as bytes (those inside strings too, so
            # the count errs on the safe side): a record of more containers
            # than a record may hold values is refused before it is built.
            containers = raw.count(b"{") + raw.count(b"[")
            if containers > self.decode_limits.max_record_values:
                raise self._fail(
                    f"JSON request holds more than {self.decode_limits.max_record_values} "
                    "objects and arrays (RECORD_MAX_VALUES)"
                )
            try:
                # Strictly UTF-8 (json.loads would also guess UTF-16 or -32).
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as exc:
                # UnicodeDecodeError is a ValueError; RecursionError: arrays
                # nested deeper than the interpreter allows.
                raise self._fail(f"request is not valid JSON: {exc}") from None
            events.append(self._request(obj, json_form=True))
        error, self._json_error = self._json_error, None
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
        tag = self._text(tag, "tag", MAX_TAG_BYTES)
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
        chunk = self._chunk(option, json_form)
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        self._entry(second, obj[2], times, records, dropped)
        return EventsReceived(tag, "message", times, records, chunk, dropped, json_form)

    def _option(self, obj: list[Any], index: int) -> dict[Any, Any]:
        if len(obj) <= index or obj[index] is None:
            return {}
        option = obj[index]
        if type(option) is not dict:
            raise self._fail("option is not a map")
        return option

    def _chunk(self, option: dict[Any, Any], json_form: bool) -> Chunk | None:
        """The ``chunk`` option, checked (module docstring, "Strict strings")."""
        chunk = option.get("chunk")
        if chunk is None:
            return None
        if type(chunk) is str:
            if json_form:
                # No original bytes behind a JSON string: it must be text.
                raw = self._text(chunk, "chunk", MAX_BATCH_ID_BYTES).encode("utf-8")
            else:
                # The wire bytes, also when they are not UTF-8 (surrogateescape
                # gives them back exactly).
                raw = chunk.encode("utf-8", "surrogateescape")
            result = Chunk(raw, "str")
        elif type(chunk) is bytes:
            result = Chunk(chunk, "bin")
        else:
            raise self._fail("chunk option is not a string")
        if not result.raw:
            raise self._fail("chunk option is empty")
        if len(result.raw) > MAX_BATCH_ID_BYTES:
            raise self._fail(
                f"chunk is {len(result.raw)} bytes, over the limit of {MAX_BATCH_ID_BYTES}"
            )
        if not _is_utf8(result.raw) and len(result.raw) > MAX_BINARY_CHUNK_BYTES:
            raise self._fail(
                f"chunk is not UTF-8 and {len(result.raw)} bytes, over the limit of "
                f"{MAX_BINARY_CHUNK_BYTES} for a binary chunk (stored as hex)"
            )
        text = result.text()
        self._text(text, "chunk", MAX_BATCH_ID_BYTES)
        return result

    def _forward(
        self, tag: str, entries: list[Any], option: dict[Any, Any], json_form: bool
    ) -> EventsReceived:
        if len(entries) > self.limits.max_events_per_request:
            raise self._fail(
                f"request carries {len(entries)} events, "
                f"over max_events_per_request={self.limits.max_events_per_request}"
            )
        chunk = self._chunk(option, json_form)
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        for entry in entries:
            self._array_entry(entry, times, records, dropped)
        return EventsReceived(tag, "forward", times, records, chunk, dropped, json_form)

    def _packed(self, tag: str, entries: bytes | str, option: dict[Any, Any]) -> EventsReceived:
        chunk = self._chunk(option, json_form=False)
        if type(entries) is str:
            stream = entries.encode("utf-8", "surrogateescape")
        else:
            assert isinstance(entries, bytes)
            stream = entries
        compressed = option.get("compressed")
        mode: Literal["packed", "compressed"] = "packed"
        # Spec "Option": compressed is "gzip"; Fluentd >= 1.19 also sends
        # "zstd" (docs/forward.md). Absent or "text" (what Fluentd itself
        # sends for uncompressed chunks) means plain msgpack.
        decompress = _DECOMPRESSORS.get(compressed) if type(compressed) is str else None
        if decompress is not None:
            mode = "compressed"
            try:
                stream = decompress(stream, self.limits.max_decompressed_bytes)
            except RemoteProtocolError as exc:
                raise self._fail(exc.reason) from None
        elif compressed not in (None, "text"):
            raise self._fail(f"unsupported compression {compressed!r}")
        else:
            for name, magic in _MAGICS.items():
                if stream.startswith(magic):
                    # 0x1f and 0x28 are integers, never an entry: these are
                    # compressed events the client forgot to label. Reading them
                    # as msgpack would drop the whole chunk as "invalid entries"
                    # and ack it.
                    raise self._fail(f"entries are {name} data but compressed is {compressed!r}")
        limits, decode = self.limits, self.decode_limits
        n = len(stream)
        size = fast_path_size(stream, option.get("size"), limits.max_events_per_request)
        if self._fast_pause:
            self._fast_pause -= 1
        elif size is not None:
            fast = fast_entries(stream, size, decode, max_events=limits.max_events_per_request)
            if fast is not None:
                fast_times, fast_records, texts = fast
                return EventsReceived(tag, mode, fast_times, fast_records, chunk, texts=texts)
            # A miss after a decode: the client's records are not of the plain shape.
            self._fast_pause = FAST_PATH_PAUSE_REQUESTS
        dropped: dict[str, int] = {}
        times: list[int | None] = []
        records: list[dict[Any, Any]] = []
        if n <= decode.slice_bytes:
            self._decode_entries(stream, times, records, dropped)
            return EventsReceived(tag, mode, times, records, chunk, dropped)
        if decodes_whole(n, decode, limits.max_events_per_request):
            # One pass (its whole-decode memory is within its cost), the
            # records kept only as text, as from slices.
            self._decode_entries(stream, times, records, dropped)
            texts = records_json(records)
            records.clear()
            verdict = texts_within(texts, n, decode.max_record_values, decode.max_record_bytes)
            if isinstance(verdict, str):
                raise self._fail(verdict)
            if verdict:
                return EventsReceived(tag, mode, times, records, chunk, dropped, texts=texts)
            # A record that may hold more values than allowed: count them.
            del texts
            times.clear()
            dropped.clear()
        rendered: list[str] = []
        self._decode_slices(stream, times, rendered, dropped)
        return EventsReceived(tag, mode, times, records, chunk, dropped, texts=rendered)

    def _decode_entries(
        self,
        stream: bytes,
        times: list[int | None],
        records: list[dict[Any, Any]],
        dropped: dict[str, int],
    ) -> None:
        """Decode a MessagePackEventStream whole; a stream that cannot be read whole fails.

        This is the hot path of PackedForward (bench/RESULTS.md): the common
        ``[EventTime | int, map]`` entry is handled inline, everything else by
        :meth:`_array_entry`, which counts the reasons for dropping. Only for
        a stream of at most ``slice_bytes`` (:meth:`_decode_slices` takes the
        others): it cannot hold a record over the record limits.
        """
        # Read from a BytesIO (which shares ``stream``) rather than feed():
        # the unpacker then buffers one entry at a time, not a second copy.
        unpacker = msgpack.Unpacker(
            io.BytesIO(stream), max_buffer_size=max(len(stream), 1), **_decode_options(len(stream))
        )
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
        except (ValueError, TypeError) as exc:
            # FormatError, StackError, a length over the limits, or an
            # unhashable map key (TypeError): the rest of the chunk is lost,
            # so none of it may be acked.
            # msgpack's FormatError and StackError carry no message: name them.
            raise self._fail(
                f"entries stream is not valid msgpack: {str(exc) or type(exc).__name__}"
            ) from None
        if end != len(stream):
            raise self._fail(f"entries stream ends inside an entry ({len(stream) - end} bytes)")

    def _decode_slices(
        self,
        stream: bytes,
        times: list[int | None],
        texts: list[str],
        dropped: dict[str, int],
    ) -> None:
        """:meth:`_decode_entries` for a stream over ``slice_bytes`` (module docstring, "Memory").

        The records go to ``texts`` as JSON a slice at a time; only the
        slice being decoded is ever held as objects. Each record's values
        are counted while it is decoded (:class:`_ValueCounter`; in a stream
        long enough to hold a record over the limit), its bytes
        checked once it is, and its text once rendered, so a record over a
        limit refuses the request at its first excess.
        """
        n = len(stream)
        decode = self.decode_limits
        counter = _ValueCounter(decode.max_record_values, "a record")
        # A record counts at most a value a byte: only a stream longer than
        # max_record_values can hold one over it, and only then is it counted.
        hooks: dict[str, Any] = (
            {"list_hook": counter.on_list, "object_hook": counter.on_map}
            if n > decode.max_record_values
            else {}
        )
        unpacker = msgpack.Unpacker(
            io.BytesIO(stream),
            max_buffer_size=max(n, 1),
            **hooks,
            **_bounded_options(n, decode, decode.max_record_values),
        )
        limit = self.limits.max_events_per_request
        allowance = _TextAllowance(n)
        records: list[dict[Any, Any]] = []  # the slice being decoded
        seen = 0
        end = 0  # where the last complete entry ends (tell() also counts a partial one)
        slice_end = decode.slice_bytes  # where the slice being decoded is full
        try:
            for entry in unpacker:
                start, end = end, unpacker.tell()
                counter.count = 0  # the next record's
                seen += 1
                if seen > limit:
                    raise self._fail(f"request carries over max_events_per_request={limit} events")
                if end - start > decode.max_record_bytes:
                    raise self._fail(
                        f"an entry of {end - start} bytes is over the record limit "
                        f"of {decode.max_record_bytes} (RECORD_MAX_BYTES)"
                    )
                if start >= slice_end:
                    # The entries before this one fill a slice: keep only their text.
                    self._render(records, texts, allowance)
                    slice_end = start + decode.slice_bytes
                if type(entry) is list and len(entry) == 2:
                    time, record = entry
                    if type(record) is dict:
                        if type(time) is EventTime:
                            times.append(int(time))
                            records.append(record)
                            continue
                        if type(time) is int and 0 < time <= _MAX_TIME_SECONDS:
                            times.append(time * _NS_PER_SECOND)
                            records.append(record)
                            continue
                self._array_entry(entry, times, records, dropped)
        except _TooManyValues as exc:
            raise self._fail(str(exc)) from None
        except (ValueError, TypeError) as exc:
            detail = str(exc) or type(exc).__name__
            if "exceeds max_" in detail:
                # A header claims more than a record may hold (msgpack's message).
                raise self._fail(
                    f"a record is over the record limits (RECORD_MAX_VALUES, "
                    f"RECORD_MAX_BYTES): {detail}"
                ) from None
            raise self._fail(f"entries stream is not valid msgpack: {detail}") from None
        if end != n:
            raise self._fail(f"entries stream ends inside an entry ({n - end} bytes)")
        self._render(records, texts, allowance)

    def _render(
        self, records: list[dict[Any, Any]], texts: list[str], allowance: _TextAllowance
    ) -> None:
        """The JSON text of a slice's ``records`` onto ``texts``; ``records`` emptied.

        Refuses the request when a record's text is over ``max_record_bytes``.
        Texts that take more memory than the stream's cost reserved for them
        (:class:`~appliance.protocols.forward.fast.TextAllowance`) are kept
        only once the gate grants the excess at once; otherwise the request
        is refused (its client resends it later).
        """
        rendered = records_json(records)
        records.clear()
        problem = oversized(rendered, self.decode_limits.max_record_bytes)
        if problem is not None:
            raise self._fail(problem)
        excess = allowance.spend(rendered)
        if excess:
            more = excess + _TEXT_TOP_UP_BYTES
            admission = self._gate(more)
            if admission is not Admit.GO:
                raise self._fail(
                    admission
                    if isinstance(admission, str)
                    else f"decode budget busy: the records' JSON text needs {more} bytes more "
                    "than reserved (decode_budget_bytes)"
                )
            allowance.add(more)
        texts += rendered

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
        request gets its ack as JSON, as in_forward does (its chunk is text).
        """
        if json_form:
            return json.dumps({"ack": chunk.text()}).encode()
        # Built by hand so the chunk keeps its msgpack type and its exact
        # bytes even when a str chunk is not valid UTF-8.
        header = _str_header(len(chunk.raw)) if chunk.kind == "str" else _bin_header(len(chunk.raw))
        return b"\x81\xa3ack" + header + chunk.raw


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
