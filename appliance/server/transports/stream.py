"""Byte-stream (TCP, TLS) connections in the answering loop: transport, handler, session base.

Forward, Lumberjack and Log Courier connections are a trio stream read in
chunks of ``read_size_bytes`` (a chunk is only a chunk: the codec frames
requests across them) and written with ``send_all`` under
``send_timeout_seconds``, so a peer that never reads cannot pin a task. The
listener calls :class:`StreamHandler` once per connection; it runs the
session in :class:`~appliance.server.connection.Connection` and logs the
connection's open and close lines.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import trio

from appliance.logs import StructLogger
from appliance.protocols.errors import ProtocolViolation
from appliance.server.connection import (
    DECODE_THREADS,
    BatchSink,
    Close,
    Connection,
    DriverSettings,
    PeerGone,
    Session,
    SessionDefaults,
)
from appliance.server.decode_budget import DecodeBudget
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo

__all__ = ["ByteStream", "ByteStreamSession", "StreamHandler", "close_for"]


def close_for(violation: ProtocolViolation) -> Close[bytes]:
    """The loop's :class:`~appliance.server.connection.Close` for a codec's violation."""
    return Close(violation.reason, violation.reply or None, violation.fault)


class ByteStreamSession(SessionDefaults[bytes]):
    """What every byte-stream session shares: the thread rule counts the bytes held.

    A subclass provides ``receive`` and ``buffered_bytes``, and the greeting
    or handshake its protocol has.
    """

    def decode_bytes(self, data: bytes | bytearray) -> int:
        """The bytes just read plus those held: what the read may complete and decode.

        0 when the read cannot complete a request (:meth:`completes_nothing`):
        receiving it is a copy into the codec's buffer, done on the event
        loop. A large request read in 16 KiB TLS records then costs one
        worker thread, for the read that completes it, instead of one per
        read (about 100 µs of CPU each on this machine: bench/HISTORY.md, the
        second pass on forward throughput, 2026-11-26).
        """
        if self.completes_nothing(data):
            return 0
        return len(data) + self.buffered_bytes()

    def completes_nothing(self, data: bytes | bytearray) -> bool:
        """True when ``data`` cannot complete a request (the codec knows); False if unknown."""
        return False


def _tls_reader(stream: trio.abc.Stream) -> Callable[[int], bytes] | None:
    """The ``read`` of a TLS stream's ``ssl.SSLObject``, for the records already buffered.

    trio's :class:`trio.SSLStream` returns one TLS record (16 KiB at most) per
    ``receive_some`` and passes through the scheduler each time, though one
    read of the socket (64 KiB) brought several records: a 121 KB forward
    chunk took eight trips round the answering loop. Its ``_ssl_object`` (the
    object trio's own ``receive_some`` reads,
    https://github.com/python-trio/trio/blob/60d0c2f84854ec6ef74995663dcdce3296840485/src/trio/_ssl.py,
    line 371) is
    private, so this returns None for any other stream, or should trio rename
    it: then each read is one record, as before.
    """
    if not isinstance(stream, trio.SSLStream):
        return None
    ssl_object = getattr(stream, "_ssl_object", None)
    if not isinstance(ssl_object, ssl.SSLObject):
        return None
    return ssl_object.read


class ByteStream:
    """A trio stream as the loop's transport: reads of up to ``read_size`` bytes, timed sends.

    Over TLS a read also takes the whole records already received and
    buffered (:func:`_tls_reader`), up to ``read_size`` bytes in all, without
    waiting: one trip round the answering loop per socket read instead of one
    per record (docs/performance.md#the-fourth-pass-on-forward-throughput).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        info: ConnectionInfo,
        log: StructLogger,
        *,
        read_size: int,
        send_timeout: float,
    ) -> None:
        self._stream = stream
        self._info = info
        self._log = log
        self._read_size = read_size
        self._send_timeout = send_timeout
        self._tls_read = _tls_reader(stream)

    async def receive(self) -> bytes | bytearray:
        """The next bytes the peer sent (never empty).

        Raises:
            PeerGone: the peer closed or the connection broke.
        """
        try:
            data = await self._stream.receive_some(self._read_size)
        except trio.BrokenResourceError as exc:
            if isinstance(exc.__cause__, ssl.SSLEOFError):
                raise PeerGone("peer closed without TLS close_notify") from None
            raise PeerGone(f"broken: {exc.__cause__ or exc}") from None
        if not data:
            raise PeerGone("peer closed")
        if self._tls_read is not None and len(data) < self._read_size:
            data = self._buffered_records(self._tls_read, data)
        self._info.metrics.received_bytes.inc(len(data))
        return data

    def _buffered_records(
        self, read: Callable[[int], bytes], first: bytes | bytearray
    ) -> bytes | bytearray:
        """``first`` and the TLS records behind it that need no wait, up to ``read_size`` bytes.

        Synchronous, as each of trio's own calls on the TLS object is: no
        other task (the answerer's send) runs in between. A record not yet whole, a
        ``close_notify`` (an empty read) or a TLS error ends it; the next
        ``receive_some`` waits for the rest, or reports the end or the error
        as it always did.
        """
        parts = [first]
        total = len(first)
        while total < self._read_size:
            try:
                more = read(self._read_size - total)
            except ssl.SSLError:  # SSLWantReadError (no whole record left) and broken TLS
                break
            if not more:
                break
            parts.append(more)
            total += len(more)
        return first if len(parts) == 1 else b"".join(parts)

    async def send(self, data: bytes) -> None:
        """Send ``data`` within the send deadline.

        Raises:
            PeerGone: the peer is gone or took nothing for ``send_timeout`` seconds.
        """
        with trio.move_on_after(self._send_timeout) as scope:
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                reason = str(exc) or "closed"
                self._log.info("send.failed", peer=self._info.peer, reason=reason)
                raise PeerGone(reason) from exc
        if scope.cancelled_caught:
            self._log.warning("send.failed", peer=self._info.peer, reason="peer does not read")
            raise PeerGone("peer does not read")


class StreamHandler:
    """The connection handler of one byte-stream listener (a listener ``Handler``).

    ``decode_budget``: the process's decode budget, for sessions whose codec
    asks it before decoding (forward); None for the others.
    """

    def __init__(
        self,
        session_factory: Callable[[ConnectionInfo], Session[bytes | bytearray, bytes]],
        settings: DriverSettings,
        sink: BatchSink,
        lifecycle: Lifecycle,
        log: StructLogger,
        decode_budget: DecodeBudget | None = None,
    ) -> None:
        self._new_session = session_factory
        self._settings = settings
        self._sink = sink
        self._lifecycle = lifecycle
        self._log = log
        self._decode_budget = decode_budget
        self._decode_threads: trio.CapacityLimiter | None = None

    async def __call__(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        settings = self._settings
        if self._decode_threads is None:
            self._decode_threads = trio.CapacityLimiter(DECODE_THREADS)
        transport = ByteStream(stream, info, self._log, read_size=settings.read_size_bytes,
                               send_timeout=settings.send_timeout_seconds)  # fmt: skip
        connection = Connection(
            transport, self._new_session(info), self._sink, settings,
            lifecycle=self._lifecycle, log=self._log, info=info,
            decode_threads=self._decode_threads, decode_budget=self._decode_budget,
        )  # fmt: skip
        self._log.info(
            "connection.open", listener=info.listener, peer=info.peer, tls=info.tls,
            source=info.source,
        )  # fmt: skip
        ending = await connection.run()
        tally = connection.tally
        self._log.info(
            "connection.closed", listener=info.listener, peer=info.peer, reason=ending.reason,
            batches=tally.batches, events=tally.events,
        )  # fmt: skip
