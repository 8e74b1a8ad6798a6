"""The Lumberjack (Beats) session: windows to rows, ordered acks, keepalives.

Mapping into ``events`` (issue 5, docs/lumberjack.md):

* the record is a ``D`` frame's key/value pairs or a ``J`` frame's object;
* ``tag`` is the first of the listener's ``tag_fields`` (dotted paths,
  default ``@metadata.beat`` then ``type``) whose value is a non-empty
  string, else the listener's ``tag``;
* ``host`` is ``host.name`` (Beats ≥ 6.3), ``beat.hostname`` (older Beats)
  or a string ``host`` (logstash-forwarder, v1);
* the event time is ``@timestamp`` (RFC 3339), else the receive time.

Lumberjack batches carry no globally unique id, so there is no dedupe:
``batch_id`` is empty.
"""

from __future__ import annotations

from collections.abc import Callable

from appliance.config import LumberjackListenerConfig
from appliance.fields import HOST_PATHS, first_string, paths
from appliance.lake.rows import RowBlock
from appliance.logs import get_logger
from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.lumberjack import (
    LumberjackLimits,
    LumberjackServerConnection,
    Window,
)
from appliance.records import record_json
from appliance.server.connection import Action, DriverSettings, StreamDriver, Submit
from appliance.server.context import ServiceContext
from appliance.server.listener import ConnectionInfo
from appliance.timefmt import rfc3339_ns

__all__ = ["LumberjackSession", "lumberjack_driver", "window_block"]

log = get_logger("lumberjack")


def window_block(
    window: Window,
    settings: LumberjackListenerConfig,
    info: ConnectionInfo,
    received_at_ns: int,
) -> RowBlock:
    """The rows of one complete window."""
    tag_paths = paths(settings.tag_fields)
    records = window.records
    texts = [
        text if text is not None else record_json(record)
        for record, text in zip(records, window.texts or [None] * len(records), strict=True)
    ]
    return RowBlock(
        protocol="lumberjack",
        source=info.source,
        peer=info.peer,
        received_at_ns=received_at_ns,
        batch_id=None,
        tag=[first_string(r, tag_paths) or settings.tag for r in records],
        host=[first_string(r, HOST_PATHS) for r in records],
        times_ns=[rfc3339_ns(r.get("@timestamp")) for r in records],
        records=texts,
        nbytes=sum(map(len, texts)) + 96 * len(texts),
    )


class LumberjackSession:
    """One Lumberjack connection: the codec and what its windows become."""

    def __init__(self, settings: LumberjackListenerConfig, info: ConnectionInfo) -> None:
        self._settings = settings
        self._info = info
        self._codec = LumberjackServerConnection(
            LumberjackLimits(
                max_window_size=settings.max_window_size,
                max_frame_bytes=settings.max_frame_bytes,
                max_decompressed_bytes=settings.max_decompressed_bytes,
            )
        )
        self._error: RemoteProtocolError | None = None

    def greeting(self) -> bytes | None:
        return None

    def handshake_done(self) -> bool:
        return True  # Lumberjack has no handshake beyond TLS

    def pending_error(self) -> RemoteProtocolError | None:
        error, self._error = self._error, None
        return error

    def _ack(self, window: Window) -> Callable[[], bytes]:
        # Computed when sent: acks go out in window order after each commit.
        return lambda: self._codec.ack_bytes(window)

    def receive(self, data: bytes | bytearray, received_at_ns: int) -> list[Action]:
        windows = self._codec.receive_data(data)
        if windows:
            try:
                self._codec.receive_data(b"")  # surfaces a violation that followed them
            except RemoteProtocolError as error:
                self._error = error
        return [
            Submit(
                window_block(window, self._settings, self._info, received_at_ns),
                ack=self._ack(window),
                label=f"seq {window.last_sequence}",
                keepalive=self._codec.keepalive_bytes,
            )
            for window in windows
        ]


def lumberjack_driver(settings: LumberjackListenerConfig, context: ServiceContext) -> StreamDriver:
    """The connection handler of one Lumberjack listener."""
    return StreamDriver(
        lambda info: LumberjackSession(settings, info),
        DriverSettings.from_listener(settings, keepalive_seconds=settings.keepalive_seconds),
        context.writer,
        context.lifecycle,
        log,
    )
