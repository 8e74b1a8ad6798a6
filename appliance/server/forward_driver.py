"""The trio driver of one Fluentd forward connection: reads, deadlines, ordered acks.

The driver owns the stream and the clock; the codec
(:mod:`appliance.protocols.forward`) does every bit of parsing. Two tasks
per connection:

* the reader reads under the idle deadline, feeds the codec, turns each
  request into a :class:`~appliance.lake.rows.RowBlock`, submits it to the
  writer and queues ``(ticket, ack bytes)`` on a bounded per-connection queue.
  A full writer queue or a full ack queue stops the reader: TCP backpressure.
* the acker is the only task that writes to the stream. It sends acks in
  request order, each only once its ticket says the rows are committed.

A protocol error stops the reader and is logged with its reason; acks for
requests that came before it are still sent, then the connection closes.
"""

from __future__ import annotations

import time
from typing import Final

import trio

from appliance.config import ForwardListenerConfig
from appliance.lake.rows import RowBlock
from appliance.lake.writer import CommitTicket, LakeWriter
from appliance.logs import get_logger
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.forward import (
    EventsReceived,
    ForwardServerConnection,
    ForwardState,
    Heartbeat,
)
from appliance.records import record_json
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo

__all__ = ["SEND_TIMEOUT_SECONDS", "ForwardHandler", "forward_block"]

log = get_logger("forward")

#: Seconds one send to the peer may take before the connection is dropped
#: (a client that never reads its acks must not pin a task forever).
SEND_TIMEOUT_SECONDS: Final = 60.0

_Ack = tuple[CommitTicket, bytes | None, str | None]


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


class ForwardHandler:
    """Runs forward connections for one listener (a :data:`Handler`)."""

    def __init__(
        self, settings: ForwardListenerConfig, writer: LakeWriter, lifecycle: Lifecycle
    ) -> None:
        self._settings = settings
        self._writer = writer
        self._lifecycle = lifecycle
        self._limits = settings.limits()

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        codec = ForwardServerConnection(self._limits, allow_json=True)
        send, receive = trio.open_memory_channel[_Ack](self._settings.max_pending_acks)
        log.info("connection.open", listener=info.listener, peer=info.peer, tls=info.tls)
        stats = {"requests": 0, "events": 0, "dropped": 0}
        reason = "closed"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._acker, stream, receive, info, nursery.cancel_scope)
            async with send:
                reason = await self._reader(stream, codec, send, info, stats)
        log.info(
            "connection.closed", listener=info.listener, peer=info.peer, reason=reason, **stats
        )

    async def _reader(
        self,
        stream: trio.abc.Stream,
        codec: ForwardServerConnection,
        acks: trio.MemorySendChannel[_Ack],
        info: ConnectionInfo,
        stats: dict[str, int],
    ) -> str:
        idle = self._settings.idle_timeout_seconds
        with self._lifecycle.reading():
            while True:
                data: bytes | bytearray | None = None
                with self._lifecycle.receiving() as receiving, trio.move_on_after(idle) as waiting:
                    try:
                        data = await stream.receive_some(self._settings.read_size_bytes)
                    except trio.BrokenResourceError as exc:
                        return f"broken: {exc.__cause__ or exc}"
                if receiving.cancelled_caught:
                    return "shutdown"
                if waiting.cancelled_caught:
                    log.info("connection.idle", peer=info.peer, idle_seconds=idle)
                    return f"idle for {idle}s"
                if not data:
                    return "peer closed"
                received_at_ns = time.time_ns()
                try:
                    events = codec.receive_data(data)
                    for event in events:
                        if isinstance(event, Heartbeat):
                            continue
                        await self._submit(event, codec, acks, info, stats, received_at_ns)
                    if codec.state is ForwardState.CLOSED:
                        codec.receive_data(b"")  # raises the error that closed it
                except RemoteProtocolError as exc:
                    log.warning(
                        "protocol.error", listener=info.listener, peer=info.peer, reason=exc.reason
                    )
                    return f"protocol error: {exc.reason}"
                except trio.ClosedResourceError:
                    return "shutdown"  # the writer takes no more batches

    async def _submit(
        self,
        event: EventsReceived,
        codec: ForwardServerConnection,
        acks: trio.MemorySendChannel[_Ack],
        info: ConnectionInfo,
        stats: dict[str, int],
        received_at_ns: int,
    ) -> None:
        stats["requests"] += 1
        stats["events"] += len(event.records)
        if event.dropped:
            dropped = sum(event.dropped.values())
            stats["dropped"] += dropped
            log.warning(
                "events.dropped",
                peer=info.peer,
                tag=event.tag,
                chunk=event.chunk.text() if event.chunk else None,
                dropped=dropped,
                reasons=event.dropped,
            )
        block = forward_block(event, info, received_at_ns)
        ticket = await self._writer.submit(block)
        ack = codec.ack_bytes(event.chunk, json_form=event.json) if event.chunk else None
        await acks.send((ticket, ack, block.batch_id))

    async def _acker(
        self,
        stream: trio.abc.Stream,
        acks: trio.MemoryReceiveChannel[_Ack],
        info: ConnectionInfo,
        connection: trio.CancelScope,
    ) -> None:
        async with acks:
            async for ticket, ack, chunk in acks:
                await ticket.wait()
                if ack is None:
                    continue
                with trio.move_on_after(SEND_TIMEOUT_SECONDS) as scope:
                    try:
                        await stream.send_all(ack)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        log.info("ack.unsent", peer=info.peer, chunk=chunk, reason=str(exc))
                        connection.cancel()
                        return
                if scope.cancelled_caught:
                    log.warning(
                        "ack.unsent", peer=info.peer, chunk=chunk, reason="peer does not read"
                    )
                    connection.cancel()
                    return
