"""The Log Courier session: codec events to rows, replies, ordered ACKNs, keepalives.

Transport, deadlines and ordered acks are the answering loop's
(:mod:`appliance.server.connection`); parsing is the codec's
(:mod:`appliance.protocols.courier`). This module maps one onto the other.

Mapping into ``events`` (docs/courier.md) is
:mod:`appliance.rows.courier`'s. A ``type`` or host that cannot be stored
falls back to the listener's tag or null there, and is counted and logged
here (``events.invalid_field``); the event is stored.

Answers: HELO gets VERS (advertising EVNT), PING gets PONG, an unknown
message gets ``????``, all in order with the ACKNs queued before them. A
payload's final ACKN goes out only after its commit; while it waits the
loop sends an ACKN with count 0 every ``keepalive_seconds``.

:meth:`CourierSession.receive` calls no trio API, so the loop may run it in
a worker thread; :meth:`CourierSession.buffered_bytes` is the codec's count
of an unfinished message.
"""

from __future__ import annotations

from appliance.config import CourierListenerConfig, settings_from
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
from appliance.protocols.errors import ProtocolViolation, RemoteProtocolError
from appliance.rows.courier import payload_block
from appliance.server.connection import Action, Arrival, DriverSettings, Reply, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo
from appliance.server.transports.stream import ByteStreamSession, StreamHandler, close_for

__all__ = ["CourierSession", "courier_handler"]

log = get_logger("courier")


class CourierSession(ByteStreamSession):
    """One Log Courier connection: the codec and what its events become."""

    def __init__(self, settings: CourierListenerConfig, info: ConnectionInfo) -> None:
        self._settings = settings
        self._info = info
        self._codec = CourierServerConnection(settings_from(settings, CourierLimits))

    # No greeting: the client speaks first (HELO, or a payload from older
    # clients). No handshake: HELO is optional (clients older than it open
    # with JDAT or PING), so the idle deadline covers a silent connection.

    def buffered_bytes(self) -> int:
        """Bytes of an unfinished message the codec holds (0 between messages)."""
        return self._codec.buffered_bytes

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> list[Action[bytes]]:
        """The actions of the messages ``data`` completes (a violation's Close last)."""
        actions: list[Action[bytes]] = []
        peer = self._info.peer
        for event in self._codec.receive_data(data):
            if isinstance(event, ProtocolViolation):
                actions.append(close_for(event))
            elif isinstance(event, PayloadReceived):
                try:
                    actions.append(self._submit(event, arrival.time_ns))
                except RemoteProtocolError as error:  # the batch id's text rule (it cannot fail)
                    actions.append(close_for(ProtocolViolation.of(error)))
                    break
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

    def _submit(self, payload: PayloadReceived, received_at_ns: int) -> Submit[bytes]:
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
            payload_block(
                payload,
                tag=self._settings.tag,
                source=self._info.source,
                peer=self._info.peer,
                received_at_ns=received_at_ns,
            ),
            ack=self._codec.ack_bytes(payload),
            label=payload.nonce_hex,
            keepalive=self._codec.keepalive_bytes(payload),
        )


def courier_handler(settings: CourierListenerConfig, context: ServiceContext) -> StreamHandler:
    """The connection handler of one Log Courier listener."""
    return StreamHandler(
        lambda info: CourierSession(settings, info),
        DriverSettings.from_listener(settings, keepalive_seconds=settings.keepalive_seconds),
        context.writer,
        context.lifecycle,
        log,
    )
