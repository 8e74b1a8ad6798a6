"""Open connections and the credentials that authenticated them, checked again until they close.

A credential is checked when a connection opens: a client certificate at the
TLS handshake (against the CRL), a forward user or shared key at the PING, a
bearer token at the WebSocket upgrade, a CURVE key by the ZAP handler.
Revoking one refuses the next connection; this module closes those already
open (docs/security.md, "Revocation"):

* every listener registers each open connection (:meth:`OpenConnections.watch`,
  or :meth:`OpenConnections.add` for what is no trio task of its own: a
  ZeroMQ peer), and adds each credential that authenticated it
  (:meth:`Guard.add`): an id for the logs (``token:ops``, ``user:alice``,
  ``key:dc1``, ``curve:web1``, ``cert:<serial in hex>``; never a secret) and
  a blocking check that asks what the handshake asked, as it answers now;
* :meth:`OpenConnections.recheck` runs the checks, one per distinct
  credential, in one worker thread, and closes every connection whose
  credential no longer holds, with a ``connection.revoked`` line that names
  the listener, the peer, the credential and the reason;
* the service runs it every :data:`RECHECK_INTERVAL_SECONDS`
  (:meth:`OpenConnections.run`) and at once on a reload (SIGHUP,
  ``appliance cert reload``, ``cert revoke``), after the TLS contexts and the
  CRL were read again.

How a connection closes is its listener's choice (the ``close`` of its
guard): a TCP or WebSocket connection is cancelled, so its stream closes and
nothing it had not yet answered is answered; a ZeroMQ peer, which libzmq
cannot disconnect from the ROUTER side, has its messages refused from then
on (docs/logjam.md).

A check that cannot be made (the auth database is unreachable) leaves its
connections open, is logged as ``revocation.unchecked`` and is made again at
the next pass: closing every connection during a database outage would turn
the outage into a storm of reconnections that the handshakes refuse anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

import trio

from appliance.logs import get_logger
from auth.errors import AuthError

__all__ = [
    "RECHECK_INTERVAL_SECONDS",
    "Check",
    "Credential",
    "Guard",
    "OpenConnections",
    "Revoked",
]

log = get_logger("revocation")

#: Seconds between two checks of every open connection's credentials: a
#: revoked credential's connections close within this (plus the look-ups),
#: and at once on a reload.
RECHECK_INTERVAL_SECONDS: Final = 30.0


@dataclass(frozen=True, slots=True)
class Revoked:
    """A credential that no longer holds: which one (its id, never a secret) and why."""

    credential: str
    reason: str


#: A credential's check: None while it holds, else what was revoked. Blocking
#: (a database look-up): it runs in a worker thread, and may raise AuthError.
Check = Callable[[], Revoked | None]


@dataclass(frozen=True, slots=True)
class Credential:
    """What authenticated a connection, and how to check it again.

    ``check`` may hold a secret (a bearer token, a PING's digests) in its
    closure; it is never printed, and ``id`` never holds one.
    """

    #: ``kind:name`` for the logs.
    id: str
    #: Connections whose credentials have the same key share one check per pass
    #: (a token's name, a certificate's issuer and serial); a credential checked
    #: per connection (a forward PING's digests) has a key of its own.
    key: Hashable
    check: Check = field(repr=False, compare=False)


class Guard:
    """One open connection as the registry sees it: where, what authenticated it, how it closes.

    Args:
        listener: the listener's name.
        peer: the peer's name in logs.
        close: closes the connection (it returns at once; the close may finish later).
    """

    def __init__(self, listener: str, peer: str, close: Callable[[], None]) -> None:
        self.listener = listener
        self.peer = peer
        self.credentials: list[Credential] = []
        #: Set once a credential of this connection was found revoked.
        self.revoked: Revoked | None = None
        self.open = True
        self._close = close

    def add(self, credential: Credential) -> None:
        """Check ``credential`` again at every pass, for as long as the connection is open."""
        self.credentials.append(credential)

    def revoke(self, revoked: Revoked) -> None:
        """Close the connection because ``revoked`` no longer holds (once)."""
        if self.revoked is not None:
            return
        self.revoked = revoked
        self._close()


def _run_checks(
    checks: dict[Hashable, Check], *, in_thread: bool
) -> tuple[dict[Hashable, Revoked], list[str]]:
    """Every check's outcome: the revoked credentials by key, and why checks could not be made."""
    revoked: dict[Hashable, Revoked] = {}
    failures: list[str] = []
    for key, check in checks.items():
        if in_thread:
            trio.from_thread.check_cancelled()  # a stop need not wait for every look-up
        try:
            outcome = check()
        except AuthError as exc:
            failures.append(str(exc))
            continue
        if outcome is not None:
            revoked[key] = outcome
    return revoked, failures


class OpenConnections:
    """The open connections of every listener of one service, and their credentials' checks.

    Args:
        interval: seconds between the passes of :meth:`run`.
        checks_in_thread: run the checks in a worker thread (they look things
            up in the database). False runs them on the event loop: only for
            checks that do no I/O (tests with a mock clock, which would jump
            while a thread runs).
    """

    def __init__(
        self, *, interval: float = RECHECK_INTERVAL_SECONDS, checks_in_thread: bool = True
    ) -> None:
        self.interval = interval
        self._in_thread = checks_in_thread
        self._guards: dict[str, set[Guard]] = {}
        self._passes = trio.Lock()

    def add(self, listener: str, peer: str, close: Callable[[], None]) -> Guard:
        """Register a connection that ``close`` closes; :meth:`discard` it when it ends."""
        guard = Guard(listener, peer, close)
        self._guards.setdefault(listener, set()).add(guard)
        return guard

    def discard(self, guard: Guard) -> None:
        """The connection ended: it is checked no more."""
        guard.open = False
        guards = self._guards.get(guard.listener)
        if guards is not None:
            guards.discard(guard)
            if not guards:
                del self._guards[guard.listener]

    @contextmanager
    def watch(self, listener: str, peer: str) -> Iterator[Guard]:
        """Register the connection served inside the ``with`` block, which a revocation cancels.

        The block ends normally when it was cancelled for a revocation
        (:attr:`Guard.revoked` says so); any other exception goes on.
        """
        scope = trio.CancelScope()
        guard = self.add(listener, peer, scope.cancel)
        try:
            with scope:
                yield guard
        finally:
            self.discard(guard)

    def count(self, listener: str | None = None) -> int:
        """Connections registered, of one listener or of all."""
        if listener is not None:
            return len(self._guards.get(listener, ()))
        return sum(len(guards) for guards in self._guards.values())

    async def run(self) -> None:
        """Check the connections' credentials every :attr:`interval` seconds, until cancelled."""
        while True:
            await trio.sleep(self.interval)
            await self.recheck("interval")

    async def recheck(self, trigger: str) -> int:
        """Check every open connection's credentials now and close the revoked; returns how many.

        Passes do not overlap: one asked for during another (a reload during
        the periodic pass) runs after it, with the credentials as they are then.
        """
        async with self._passes:
            pending = [
                (guard, credential)
                for guards in self._guards.values()
                for guard in guards
                if guard.revoked is None
                for credential in guard.credentials
            ]
            if not pending:
                return 0
            checks: dict[Hashable, Check] = {}
            for _, credential in pending:
                checks.setdefault(credential.key, credential.check)
            if self._in_thread:
                revoked, failures = await trio.to_thread.run_sync(
                    lambda: _run_checks(checks, in_thread=True)
                )
            else:
                revoked, failures = _run_checks(checks, in_thread=False)
            closed = 0
            for guard, credential in pending:
                outcome = revoked.get(credential.key)
                if outcome is None or not guard.open or guard.revoked is not None:
                    continue  # still good, or ended while it was checked
                log.warning(
                    "connection.revoked", listener=guard.listener, peer=guard.peer,
                    credential=outcome.credential, reason=outcome.reason, trigger=trigger,
                )  # fmt: skip
                guard.revoke(outcome)
                closed += 1
            if failures:
                log.error(
                    "revocation.unchecked", trigger=trigger, credentials=len(failures),
                    reason=failures[0], action="connections kept open; checked again next pass",
                )  # fmt: skip
            log.debug("revocation.checked", trigger=trigger, connections=self.count(),
                      credentials=len(checks), closed=closed)  # fmt: skip
            return closed
