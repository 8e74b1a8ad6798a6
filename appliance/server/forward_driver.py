"""The Fluentd forward session: codec events to rows, acks and logs.

Transport, deadlines and ordered acks are the shared
:class:`~appliance.server.connection.StreamDriver`'s; parsing is the codec's
(:mod:`appliance.protocols.forward`). This module maps one onto the other.
"""

from __future__ import annotations

from appliance.config import ForwardListenerConfig
from appliance.lake.rows import RowBlock
from appliance.lake.writer import LakeWriter
from appliance.logs import get_logger
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.forward import (
    EventsReceived,
    ForwardServerConnection,
    ForwardState,
    Heartbeat,
)
from appliance.records import record_json
from appliance.server.connection import Action, DriverSettings, StreamDriver, Submit
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo

__all__ = ["ForwardSession", "forward_block", "forward_driver"]

log = get_logger("forward")


def forward_block(event: EventsReceived, info: ConnectionInfo, received_at_ns: int) -> RowBlock:
    """The rows of one forward request (DESIGN §3 column meanings)."""
    records = [record_json(r) for r in event.records]
    return RowBlock(
        protocol="forward",
        source=info.source,
        peer=info.peer,
        received_at_ns=received_at_ns,
        batch_id=event.chunk.text() if event.chunk is not None else None,
        tag=event.tag,
        host=None,
        times_ns=event.times_ns,
        records=records,
        nbytes=sum(map(len, records)) + 64 * len(records),
    )


class ForwardSession:
    """One forward connection: the codec and what its events become."""

    def __init__(self, settings: ForwardListenerConfig, info: ConnectionInfo) -> None:
        self._codec = ForwardServerConnection(settings.limits(), allow_json=True)
        self._info = info
        self._error: RemoteProtocolError | None = None

    def greeting(self) -> bytes | None:
        return None

    def pending_error(self) -> RemoteProtocolError | None:
        error, self._error = self._error, None
        return error

    def receive(self, data: bytes | bytearray, received_at_ns: int) -> list[Action]:
        events = self._codec.receive_data(data)
        if self._codec.state is ForwardState.CLOSED:
            try:
                self._codec.receive_data(b"")  # raises the error that closed it
            except RemoteProtocolError as error:
                self._error = error
        actions: list[Action] = []
        for event in events:
            if isinstance(event, Heartbeat):
                continue
            chunk = event.chunk.text() if event.chunk is not None else None
            if event.dropped:
                log.warning(
                    "events.dropped",
                    peer=self._info.peer,
                    tag=event.tag,
                    chunk=chunk,
                    dropped=sum(event.dropped.values()),
                    reasons=event.dropped,
                )
            ack = self._codec.ack_bytes(event.chunk, json_form=event.json) if event.chunk else None
            actions.append(Submit(forward_block(event, self._info, received_at_ns), ack, chunk))
        return actions


def forward_driver(
    settings: ForwardListenerConfig, writer: LakeWriter, lifecycle: Lifecycle
) -> StreamDriver:
    """The connection handler of one forward listener."""
    return StreamDriver(
        lambda info: ForwardSession(settings, info),
        DriverSettings(
            idle_timeout_seconds=settings.idle_timeout_seconds,
            max_pending_acks=settings.max_pending_acks,
            read_size_bytes=settings.read_size_bytes,
        ),
        writer,
        lifecycle,
        log,
    )
