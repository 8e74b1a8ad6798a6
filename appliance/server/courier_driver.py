"""The Log Courier session: codec events to rows, replies, ordered ACKNs, keepalives.

Transport, deadlines and ordered acks are the shared
:class:`~appliance.server.connection.StreamDriver`'s; parsing is the codec's
(:mod:`appliance.protocols.courier`). This module maps one onto the other.

Mapping into ``events`` (issue 6, docs/courier.md). The codec has already
turned each event into its row values as it decoded it (issue 13: bounded
memory) and applied the strict-string rules; here they become columns:

* the record is the event's JSON object; an event that is not a JSON object
  is kept as ``{"message": <raw text>}``;
* ``tag`` is the event's ``type`` field when it is a non-empty string (Log
  Courier's ``fields: {type: ...}`` convention), else the listener's ``tag``;
  a ``type`` that is not valid UTF-8 (a lone surrogate) or is over
  ``MAX_TAG_BYTES`` also falls back to the listener's tag, counted and logged
  (``events.invalid_field``), and the event is stored;
* ``host`` is ``host.name`` (ECS mode), ``beat.hostname`` or a string
  ``host`` field; one that is not valid UTF-8 or is over ``MAX_HOST_BYTES``
  becomes null, counted and logged the same way;
* the event time is ``@timestamp`` (RFC 3339, nanoseconds kept, ASCII digits
  only, within int64 nanoseconds), else the receive time;
* ``batch_id`` is the payload's nonce in lowercase hex (32 ASCII characters),
  ``:``, and a 16-hex digest of the decompressed payload (a restarted old
  client that repeats nonces is not taken for a resend; PayloadReceived.batch_id;
  checked against ``MAX_BATCH_ID_BYTES``), so a payload resent after a
  reconnect is acked again without a second write (the writer dedupes by
  ``(protocol, source, batch_id)``).

Answers: HELO gets VERS (advertising EVNT), PING gets PONG, an unknown
message gets ``????``, all in order with the ACKNs queued before them. A
payload's final ACKN goes out only after its commit; while it waits the
driver sends an ACKN with count 0 every ``keepalive_seconds``.

:meth:`CourierSession.receive` calls no trio API, so the driver may run it in
a worker thread; :meth:`CourierSession.buffered_bytes` is the codec's count
of an unfinished message.
"""

from __future__ import annotations

from typing import Final

from appliance.config import CourierListenerConfig, settings_from
from appliance.lake.rows import RowBlock
from appliance.logs import get_logger
from appliance.protocols.courier import (
    CourierLimits,
    CourierServerConnection,
    Hello,
    PayloadReceived,
    Ping,
    UnknownMessage,
    Unsupported,
)
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.text import MAX_BATCH_ID_BYTES, text_or_error
from appliance.server.connection import Action, DriverSettings, Reply, StreamDriver, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo

__all__ = ["CourierSession", "courier_driver", "payload_block"]

log = get_logger("courier")

#: Bytes of one list slot (a pointer): what a per-row tag list adds to a block.
_LIST_SLOT_BYTES: Final = 8


def payload_block(
    payload: PayloadReceived,
    settings: CourierListenerConfig,
    info: ConnectionInfo,
    received_at_ns: int,
) -> RowBlock:
    """The rows of one payload (DESIGN §3 column meanings).

    A column whose value is the same for every row (no event named a type,
    or none a host) is passed once, not once per row.

    Raises:
        RemoteProtocolError: the batch id breaks the text rule (it cannot:
            a nonce is 16 bytes, 32 hex characters; checked all the same).
    """
    types = payload.types
    tag: str | list[str] = settings.tag
    if any(t is not None for t in types):
        tag = [settings.tag if t is None else t for t in types]
    hosts = payload.hosts if any(h is not None for h in payload.hosts) else None
    return RowBlock(
        protocol="courier",
        source=info.source,
        peer=info.peer,
        received_at_ns=received_at_ns,
        batch_id=text_or_error(payload.batch_id, "batch id (nonce)", MAX_BATCH_ID_BYTES),
        tag=tag,
        host=hosts,
        times_ns=payload.times_ns,
        records=payload.records,
        # What the codec counted for the rows, plus the per-row tag list.
        nbytes=payload.memory_bytes + (_LIST_SLOT_BYTES * len(tag) if isinstance(tag, list) else 0),
    )


class CourierSession:
    """One Log Courier connection: the codec and what its events become."""

    def __init__(self, settings: CourierListenerConfig, info: ConnectionInfo) -> None:
        self._settings = settings
        self._info = info
        self._codec = CourierServerConnection(settings_from(settings, CourierLimits))
        self._error: RemoteProtocolError | None = None

    def greeting(self) -> bytes | None:
        return None  # the client speaks first (HELO, or a payload from older clients)

    def handshake_done(self) -> bool:
        # HELO is optional (clients older than it open with JDAT or PING), so
        # there is no handshake to wait for: the idle deadline covers a
        # connection that says nothing.
        return True

    def pending_error(self) -> RemoteProtocolError | None:
        error, self._error = self._error, None
        return error

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished message the codec holds (0 between messages)."""
        return self._codec.buffered_bytes

    def receive(self, data: bytes | bytearray, received_at_ns: int) -> list[Action]:
        events = self._codec.receive_data(data)
        if events:
            try:
                self._codec.receive_data(b"")  # surfaces a violation that followed them
            except RemoteProtocolError as error:
                self._error = error
        actions: list[Action] = []
        peer = self._info.peer
        for event in events:
            if isinstance(event, PayloadReceived):
                actions.append(self._submit(event, received_at_ns))
            elif isinstance(event, Ping):
                actions.append(Reply(self._codec.pong_bytes()))
            elif isinstance(event, Hello):
                log.info(
                    "courier.hello", peer=peer, client=event.client_name, flags=event.flags.hex()
                )
                actions.append(Reply(self._codec.vers_bytes()))
            elif isinstance(event, UnknownMessage):
                log.warning(
                    "courier.unknown_message",
                    peer=peer,
                    type=event.kind.decode("ascii", "backslashreplace"),
                    length=event.length,
                )
                actions.append(Reply(self._codec.unknown_bytes()))
            elif isinstance(event, Unsupported):
                log.info("courier.unsupported", peer=peer)
        return actions

    def _submit(self, payload: PayloadReceived, received_at_ns: int) -> Submit:
        if payload.not_json:
            log.warning(
                "events.not_json",
                peer=self._info.peer,
                nonce=payload.nonce_hex,
                events=payload.not_json,
            )
        if payload.invalid_types or payload.invalid_hosts:
            # Stored all the same: the tag falls back to the listener's, the
            # host to null (module docstring).
            log.warning(
                "events.invalid_field",
                peer=self._info.peer,
                nonce=payload.nonce_hex,
                invalid_types=payload.invalid_types,
                invalid_hosts=payload.invalid_hosts,
            )
        return Submit(
            payload_block(payload, self._settings, self._info, received_at_ns),
            ack=self._codec.ack_bytes(payload),
            label=payload.nonce_hex,
            keepalive=self._codec.keepalive_bytes(payload),
        )


def courier_driver(settings: CourierListenerConfig, context: ServiceContext) -> StreamDriver:
    """The connection handler of one Log Courier listener."""
    return StreamDriver(
        lambda info: CourierSession(settings, info),
        DriverSettings.from_listener(settings, keepalive_seconds=settings.keepalive_seconds),
        context.writer,
        context.lifecycle,
        log,
    )
