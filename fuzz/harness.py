"""What every fuzz target shares: the input layout, the session driver and the row checks.

A target's input is a few header bytes and a payload (fuzz/README.md):

* byte 0: flags. :data:`BYTEWISE` feeds the payload one byte per read,
  :data:`SMALL_LIMITS` gives the codec tiny limits (so the limit paths are
  reached with short inputs), :data:`BYTEARRAY` passes ``bytearray`` reads
  (what trio's SSLStream returns); the low five bits are the target's own.
* bytes 1-2 and 3-4: two cut points (big-endian u16, taken modulo the
  payload's length + 1): the payload reaches the session in up to three
  reads, split where the fuzzer chose.
* the rest: the bytes the peer sends.

:func:`drive` does what the answering loop (``appliance.server.connection``)
does with a session, minus the socket and the clock: it feeds the reads, runs
the actions in order (an ``Await`` runs to completion at once), materialises
every ack and keepalive, and stops where the loop would close the
connection (a ``Close``, a refused block).
Each block goes through :func:`check_rows`: ``check_block``, then, for a
block it accepts, ``blocks_to_arrow`` and the live tail's rendering; at the
end the accepted blocks are converted together (:func:`check_group`), as the
writer converts a commit group.

Whatever escapes is a finding: the fuzzer reports it as a crash. A
``Close`` (the peer's fault, that connection closes) and ``BlockRefused``
from ``check_block`` (the connection closes, nothing is acked) are the
expected ends. With ``FUZZ_STRICT_BLOCKS=1`` in the
environment a refused block is a finding too: the codecs are meant to refuse
bad strings themselves, so a block that reaches ``check_block`` and fails
means a codec let a value through.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from appliance.blocks.block import RowBlock
from appliance.blocks.checks import check_block
from appliance.blocks.errors import BlockRefused
from appliance.lake.arrow import blocks_to_arrow
from appliance.logs import configure
from appliance.protocols.websocket_messages import TailFilter
from appliance.rows.websocket import tail_events_json
from appliance.server.connection import Action, Arrival, Await, Close, Reply, Submit
from appliance.server.listener import ConnectionInfo

__all__ = [
    "BYTEARRAY",
    "BYTEWISE",
    "BYTEWISE_MAX_BYTES",
    "FRAME_SEPARATOR",
    "HEADER_BYTES",
    "PEER",
    "PEER_ADDRESS",
    "PEER_PORT",
    "RECEIVED_AT_NS",
    "SMALL_LIMITS",
    "STRICT_BLOCKS",
    "TARGETS",
    "FuzzInput",
    "Session",
    "check_group",
    "check_rows",
    "connection_info",
    "drive",
    "fuzz_main",
    "run_await",
    "split_frames",
]

#: Every fuzz target, by name: ``fuzz/fuzz_<name>.py``, its seeds in
#: ``fuzz/corpus/<name>``, its crashes in ``fuzz/crashes/<name>`` (the Makefile's
#: FUZZ_TARGETS and fuzz/make_corpus.py's TARGETS list the same names).
TARGETS: Final = (
    "forward",
    "lumberjack",
    "courier",
    "logjam",
    "websocket",
    "wal",
    "proxy",
    "forward_fast",
)
#: Flag: one read per payload byte (at most :data:`BYTEWISE_MAX_BYTES` of payload).
BYTEWISE: Final = 0x80
#: Flag: the codec gets tiny limits (each target says which).
SMALL_LIMITS: Final = 0x40
#: Flag: reads are ``bytearray`` rather than ``bytes``.
BYTEARRAY: Final = 0x20
#: Longest payload fed a byte at a time (a read per byte is slow; longer ones are cut).
BYTEWISE_MAX_BYTES: Final = 4096
#: Flags byte and two u16 cut points.
HEADER_BYTES: Final = 5
#: Splits a payload into frames or messages (Logjam, WebSocket): four bytes
#: that occur in no seed's own data.
FRAME_SEPARATOR: Final = b"\xfe|\xfe|"
#: A fixed receive time (2026-01-01T00:00:00Z), so a run is reproducible.
RECEIVED_AT_NS: Final = 1_767_225_600 * 1_000_000_000
#: The peer every session sees (TEST-NET-1): its address, port, and name in rows and logs.
PEER_ADDRESS: Final = "192.0.2.7"
PEER_PORT: Final = 40000
PEER: Final = f"{PEER_ADDRESS}:{PEER_PORT}"
#: A refused block is a finding too (module docstring).
STRICT_BLOCKS: Final = os.environ.get("FUZZ_STRICT_BLOCKS", "") == "1"


@dataclass(frozen=True, slots=True)
class FuzzInput:
    """One fuzz input taken apart (module docstring)."""

    flags: int
    cut_a: int
    cut_b: int
    payload: bytes

    @classmethod
    def parse(cls, data: bytes) -> FuzzInput:
        """Header and payload; a short input is padded with zero bytes."""
        head = data[:HEADER_BYTES].ljust(HEADER_BYTES, b"\0")
        return cls(
            flags=head[0],
            cut_a=int.from_bytes(head[1:3], "big"),
            cut_b=int.from_bytes(head[3:5], "big"),
            payload=bytes(data[HEADER_BYTES:]),
        )

    def has(self, flag: int) -> bool:
        """Whether ``flag`` is set."""
        return bool(self.flags & flag)

    def reads(self) -> list[bytes | bytearray]:
        """The payload as the reads the session gets (never an empty read: the
        driver takes an empty read for the peer closing)."""
        payload = self.payload
        pieces: list[bytes]
        if self.has(BYTEWISE) and len(payload) <= BYTEWISE_MAX_BYTES:
            pieces = [payload[i : i + 1] for i in range(len(payload))]
        else:
            n = len(payload)
            a, b = sorted((self.cut_a % (n + 1), self.cut_b % (n + 1)))
            pieces = [p for p in (payload[:a], payload[a:b], payload[b:]) if p]
        if self.has(BYTEARRAY):
            return [bytearray(p) for p in pieces]
        return list(pieces)


def split_frames(payload: bytes, most: int) -> list[bytes]:
    """``payload`` cut at every :data:`FRAME_SEPARATOR`, at most ``most`` pieces
    (the rest joins the last one)."""
    return payload.split(FRAME_SEPARATOR, most - 1)


def connection_info(source: str = "anonymous") -> ConnectionInfo:
    """The ConnectionInfo of the fuzzed connection."""
    return ConnectionInfo("fuzz", PEER_ADDRESS, PEER_PORT, tls=True, source=source)


class Session(Protocol):
    """What :func:`drive` needs of a session (``appliance.server.connection.Session``)."""

    def receive(self, data: bytes | bytearray, arrival: Arrival) -> Sequence[Action[bytes]]: ...

    def decode_bytes(self, data: bytes | bytearray) -> int: ...

    def greeting(self) -> bytes | None: ...

    def handshake_done(self) -> bool: ...

    def buffered_bytes(self) -> int: ...


def check_rows(block: RowBlock) -> bool:
    """Run a block through what the writer and the live tail do with it.

    Returns False when ``check_block`` refuses it (the driver then closes the
    connection); True once the block has been converted to Arrow and rendered
    for the tail. Anything else raised is a finding.
    """
    try:
        check_block(block)
    except BlockRefused as exc:
        if STRICT_BLOCKS:
            raise AssertionError(f"a codec let through a block check_block refuses: {exc}") from exc
        return False
    table = blocks_to_arrow([block])
    assert table.num_rows == block.rows, (table.num_rows, block.rows)
    texts = tail_events_json(block, TailFilter().rows(block))
    assert len(texts) == block.rows
    return True


def _materialize(value: bytes | Callable[[], bytes] | None) -> None:
    data = value() if callable(value) else value
    assert data is None or isinstance(data, bytes), type(data)


def run_await(action: Await[bytes]) -> Sequence[Action[bytes]]:
    """Run an ``Await`` to completion without an event loop.

    The fuzz targets replace what such work awaits (a worker thread) with a
    direct call, so the coroutine finishes at its first step; one that
    suspends would need trio, and is a harness bug.
    """
    coroutine = action.run()
    assert isinstance(coroutine, Coroutine), type(coroutine)
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: Sequence[Action[bytes]] = done.value
        return result
    coroutine.close()
    raise RuntimeError("an Await suspended: the fuzz harness runs it without an event loop")


def _run_actions(actions: Sequence[Action[bytes]], stored: list[RowBlock]) -> bool:
    """The loop's ``_carry_out``; False when the connection closes (a Close, a refused block)."""
    queue = list(actions)
    while queue:
        action = queue.pop(0)
        if isinstance(action, Await):
            queue[:0] = run_await(action)
            continue
        if isinstance(action, Reply):
            assert isinstance(action.data, bytes), type(action.data)
            continue
        if isinstance(action, Close):
            assert action.reply is None or isinstance(action.reply, bytes), type(action.reply)
            assert not queue, "a Close is the session's last action"
            return False
        assert isinstance(action, Submit), type(action)
        if not check_rows(action.block):
            return False
        stored.append(action.block)
        _materialize(action.ack)
        _materialize(action.keepalive)
    return True


def check_group(blocks: Sequence[RowBlock]) -> None:
    """Blocks ``check_block`` accepted, converted together, as the writer's commit group is."""
    if len(blocks) > 1:
        table = blocks_to_arrow(blocks)
        assert table.num_rows == sum(b.rows for b in blocks), table.num_rows


def drive(session: Session, reads: Sequence[bytes | bytearray]) -> None:
    """Feed ``reads`` to ``session`` as the answering loop would, until it closes;
    then convert every stored block as one commit group."""
    stored: list[RowBlock] = []
    _drive(session, reads, stored)
    check_group(stored)


def _drive(session: Session, reads: Sequence[bytes | bytearray], stored: list[RowBlock]) -> None:
    greeting = session.greeting()
    assert greeting is None or isinstance(greeting, bytes)
    for data in reads:
        session.handshake_done()
        cost = session.decode_bytes(data)
        # 0: the session says the read completes nothing (the loop takes it inline).
        assert cost == 0 or cost >= len(data), (cost, len(data))
        actions = session.receive(data, Arrival(RECEIVED_AT_NS, 0.0))
        if cost == 0:
            assert all(isinstance(a, Close) for a in actions), actions
        if not _run_actions(actions, stored):
            return
        held = session.buffered_bytes()
        assert isinstance(held, int), type(held)
        assert held >= 0, held


def fuzz_main(test_one_input: Callable[[bytes], None]) -> None:
    """Run ``test_one_input`` under atheris with ``sys.argv``'s libFuzzer flags.

    The appliance's log lines are formatted as in production (the formatter
    sees every field the peer's bytes put in a line) and written to
    ``os.devnull``.
    """
    import atheris  # only the fuzzing entry point needs it

    configure("info")
    for handler in logging.getLogger("appliance").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
