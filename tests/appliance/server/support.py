"""What the driver tests share: a stand-in writer, handler factories and stream helpers.

The writer here resolves tickets when the test says so: the driver tests are
about ordering, deadlines, keepalives and closes. The real writer against a
real table is tested in tests/appliance/lake and end to end elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
from appliance.lake.writer import CommitTicket
from appliance.server.connection import Arrival
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo


def arrival(time_ns: int = 10**18) -> Arrival:
    """When a unit handed straight to a session (no loop) arrived."""
    return Arrival(time_ns, 0.0)


#: What a driver returns: the handler a listener calls for each connection.
Handler = Callable[[Any, ConnectionInfo], Any]
ClientStream = trio.StapledStream[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]


class StandInWriter:
    """Records submitted blocks; the test commits them with :meth:`commit`.

    With ``resolve_empty``, a block with no rows resolves at once, like the
    real writer. A block the real writer would refuse raises ``BlockRefused``
    here too (the same :func:`check_block`). :meth:`refuse` refuses a queued
    block; :meth:`close` refuses those still unresolved.
    """

    def __init__(self, *, resolve_empty: bool = False) -> None:
        self.resolve_empty = resolve_empty
        self.blocks: list[RowBlock] = []
        self.tickets: list[CommitTicket] = []
        self.submitted = trio.Event()

    async def submit(self, block: RowBlock) -> CommitTicket:
        ticket = CommitTicket()
        check_block(block)
        if self.resolve_empty and block.rows == 0:
            ticket._resolve()
            return ticket
        self.blocks.append(block)
        self.tickets.append(ticket)
        self.submitted.set()
        self.submitted = trio.Event()
        return ticket

    def commit(self, index: int) -> None:
        self.tickets[index]._resolve()

    def refuse(self, index: int, reason: str = "cannot be stored") -> None:
        self.tickets[index]._refuse(BlockRefused(reason))

    def close(self) -> None:
        for ticket in self.tickets:
            if not ticket.done:
                ticket._refuse(BlockRefused("the writer closed"))

    async def wait_blocks(self, count: int) -> None:
        while len(self.blocks) < count:
            await self.submitted.wait()


def handler_factory(
    driver: Callable[[Any, ServiceContext], Handler], config_type: Callable[..., Any]
) -> Callable[..., Handler]:
    """``handler_for(writer, lifecycle=None, **settings)``: ``driver`` with a listener
    config of ``config_type(**settings)`` and a context around ``writer``."""

    def handler_for(writer: Any, lifecycle: Lifecycle | None = None, **settings: Any) -> Handler:
        context = ServiceContext(writer, lifecycle or Lifecycle())
        return driver(config_type(**settings), context)

    return handler_for


@asynccontextmanager
async def serving(handler: Handler, info: ConnectionInfo) -> AsyncIterator[ClientStream]:
    """The client end of an in-memory stream that ``handler`` serves until the block ends."""
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, server, info)
        yield client


async def receive_within(stream: trio.abc.ReceiveStream, seconds: float) -> bytes:
    """Every byte that arrives within ``seconds`` (of the autojump clock), or until closed."""
    received = b""
    with trio.move_on_after(seconds):
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            received += data
    return received


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = b""
    with trio.fail_after(60):
        while len(data) < size:
            chunk = await stream.receive_some(size - len(data))
            assert chunk, f"closed after {len(data)} of {size} bytes"
            data += chunk
    return data
