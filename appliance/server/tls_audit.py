"""Client certificates refused at the TLS handshake, into the audit log.

The handshake runs before anything else, so a peer can cause refusals as
fast as it can connect. The audit log is a database table, so the path to it
is bounded on every side: only refusals whose reason is about the client's
certificate are recorded (a port scan's "wrong version number" is not), at
most :data:`MAX_ENTRIES_PER_MINUTE` per service, through a queue of
:data:`QUEUE_ENTRIES` that drops (and counts) when full, written by one task
in a worker thread. The ``tls.handshake_failed`` log line is kept for every
refusal either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio

from appliance.logs import get_logger
from appliance.server.listener import ConnectionInfo
from auth.errors import AuthError

__all__ = ["MAX_ENTRIES_PER_MINUTE", "QUEUE_ENTRIES", "TlsRefusalAudit", "is_certificate_refusal"]

log = get_logger("tls")

#: Audit entries written per minute at most; more are counted and dropped.
MAX_ENTRIES_PER_MINUTE: Final = 60
#: Refusals waiting for the writer task.
QUEUE_ENTRIES: Final = 256
#: Words of OpenSSL's reasons that mean the client's certificate was refused.
_CERTIFICATE_WORDS: Final = (
    "certificate",
    "unknown ca",
    "revoked",
    "expired",
    "peer did not return",
)

#: Writes one entry (the refused connection, the reason); blocking, run in a worker thread.
AuditWriter = Callable[[ConnectionInfo, str], None]


def is_certificate_refusal(reason: str) -> bool:
    """Whether an OpenSSL handshake failure is about the client's certificate."""
    lowered = reason.lower()
    return any(word in lowered for word in _CERTIFICATE_WORDS)


class TlsRefusalAudit:
    """Queues certificate refusals and writes them to the audit log, bounded."""

    def __init__(self, write: AuditWriter, threads: trio.CapacityLimiter) -> None:
        self._write = write
        self._threads = threads
        self._send, self._receive = trio.open_memory_channel[tuple[ConnectionInfo, str]](
            QUEUE_ENTRIES
        )
        self._window_start = 0.0
        self._in_window = 0
        self.dropped = 0

    def note(self, info: ConnectionInfo, reason: str) -> None:
        """Record a refusal if it is about a certificate and the budget allows (never waits)."""
        if not is_certificate_refusal(reason):
            return
        now = trio.current_time()
        if now - self._window_start >= 60:
            self._window_start, self._in_window = now, 0
        if self._in_window >= MAX_ENTRIES_PER_MINUTE:
            self.dropped += 1
            return
        try:
            self._send.send_nowait((info, reason))
        except trio.WouldBlock:
            self.dropped += 1
            return
        self._in_window += 1

    async def run(self) -> None:
        """Write queued refusals until cancelled."""
        async for info, reason in self._receive:
            try:
                await trio.to_thread.run_sync(self._write, info, reason, limiter=self._threads)
            except (AuthError, OSError) as exc:
                log.warning("tls.audit_failed", reason=str(exc))
