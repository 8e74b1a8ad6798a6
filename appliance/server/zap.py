"""The ZAP handler of a Logjam listener's ZeroMQ context: CURVE keys checked in the auth database.

Every CURVE handshake of the context reaches it (``inproc://zeromq.zap.01``);
the client's key is looked up in a worker thread at every handshake (so a
revoked key is refused from its next connection on), failures are rate
limited per address, and the key's name becomes the messages' ``User-Id``
and so the rows' ``source``.

ZeroMQ authenticates a connection once, and libzmq cannot disconnect one
peer of a ROUTER or PULL socket. So each key accepted here is registered in
the service's open connections (:mod:`appliance.server.revocation`) with the
same look-up as its check; once it fails (the key was revoked), the key's
name joins the listener's revoked user ids, and the sessions drop every
message whose ``User-Id`` is one of them (docs/logjam.md, "CURVE"). An
accepted key stays registered until it is revoked or the listener stops (a
key's peers cannot be seen to leave): at most one entry per authorised key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Final

import trio
import zmq
import zmq.auth
from zmq.utils import z85

from appliance.logs import get_logger
from appliance.metrics import NULL_LISTENER, ListenerMetrics
from appliance.server.listener import ANONYMOUS
from appliance.server.revocation import Credential, Guard, OpenConnections, Revoked
from appliance.server.transports.zeromq import Pump
from auth.errors import AuthError
from auth.ratelimit import FailureLimiter

__all__ = ["ZapHandler"]

log = get_logger("logjam")

#: Most frames of a ZAP request read (a count): libzmq sends 7 for CURVE.
_ZAP_MAX_FRAMES: Final = 16


class ZapHandler(zmq.auth.Authenticator):
    """The context's ZAP handler: CURVE keys checked in the auth database at every handshake.

    zmq.auth's :class:`~zmq.auth.Authenticator` speaks ZAP; this subclass is
    driven by a trio task (:meth:`serve`), looks the key up in a worker thread,
    and names the peer by its key's name (the ZAP user id, which becomes the
    message's ``User-Id`` property and so the row's ``source``).

    With ``connections``, every key it accepts is checked again there with
    ``lookup``, and the name of a key found revoked is added to ``revoked``.
    """

    def __init__(
        self,
        zctx: zmq.Context[zmq.Socket[bytes]],
        lookup: Callable[[str], str | None],
        *,
        listener: str,
        auth_threads: trio.CapacityLimiter,
        failures: FailureLimiter,
        metrics: ListenerMetrics = NULL_LISTENER,
        connections: OpenConnections | None = None,
        revoked: set[str] | None = None,
    ) -> None:
        super().__init__(context=zctx, log=logging.getLogger("appliance.logjam.zap"))
        self._lookup = lookup
        self._listener = listener
        self._auth_threads = auth_threads
        self._failures = failures
        self._metrics = metrics
        self._address = ""
        self._names: dict[bytes, str] = {}
        self._connections = connections
        #: The user ids (key names) whose messages the sessions drop.
        self.revoked: set[str] = revoked if revoked is not None else set()
        #: Each accepted key's entry in ``connections``, by public key (Z85).
        self._guards: dict[str, Guard] = {}
        self.configure_curve_callback(domain=listener, credentials_provider=self)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    async def callback(self, domain: str, key: bytes) -> bool:
        """Whether the Z85 public ``key`` belongs to an active CURVE key."""
        address = self._address
        public_key = key.decode("ascii")
        wait = self._failures.begin(address)  # counted before the look-up
        if wait > 0:
            log.warning("curve.refused", listener=self._listener, peer=address,
                        reason=f"failure backoff, {wait:.1f}s left")  # fmt: skip
            self._metrics.auth("curve", "throttled")
            return False
        try:
            name = await trio.to_thread.run_sync(
                self._lookup, public_key, limiter=self._auth_threads
            )
        except AuthError as exc:
            self._failures.release(address)
            log.error("curve.lookup_failed", listener=self._listener, peer=address, reason=str(exc))
            self._metrics.auth("curve", "unavailable")
            return False
        if name is None:
            backoff = self._failures.failure(address)
            log.warning("curve.refused", listener=self._listener, peer=address,
                        public_key=public_key, reason="unknown or revoked key",
                        backoff_seconds=round(backoff, 3))  # fmt: skip
            self._metrics.auth("curve", "failure")
            return False
        self._failures.success(address)
        self._metrics.auth("curve", "success")
        self._names[z85.decode(key)] = name
        self._watch(public_key, name, address)
        log.info("curve.accepted", listener=self._listener, peer=address, source=name)
        return True

    def _watch(self, public_key: str, name: str, address: str) -> None:
        """Check the accepted key again for as long as the listener runs."""
        connections = self._connections
        if connections is None:
            return
        known = self._guards.get(public_key)
        if known is not None and known.open:
            known.peer = address  # the key's latest connection, for the log
            return

        def close() -> None:
            # libzmq cannot drop the peer: its messages are refused from now on.
            self.revoked.add(name)
            connections.discard(guard)

        guard = connections.add(self._listener, address, close)
        guard.add(Credential(f"curve:{name}", ("curve", public_key),
                             partial(self._recheck, public_key, name)))  # fmt: skip
        self._guards[public_key] = guard

    def _recheck(self, public_key: str, name: str) -> Revoked | None:
        """The handshake's look-up again (blocking: the revocation pass's worker thread)."""
        if self._lookup(public_key) == name:
            return None
        return Revoked(f"curve:{name}", "CURVE key revoked")

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._names.pop(client_public_key, ANONYMOUS)

    def start(self) -> None:
        """Bind the handler (inproc), so every CURVE handshake of the context reaches it."""
        super().start()
        assert self.zap_socket is not None
        self.zap_socket.set(zmq.LINGER, 0)

    def stop(self) -> None:
        """Close the handler; its keys are checked no more (the listener's sockets are closed)."""
        if self._connections is not None:
            for guard in self._guards.values():
                self._connections.discard(guard)
        self._guards.clear()
        super().stop()

    async def serve(self) -> None:
        """Answer ZAP requests until cancelled (:meth:`start` has bound the handler)."""
        assert self.zap_socket is not None
        pump = Pump(self.zap_socket, max_frames=_ZAP_MAX_FRAMES)
        try:
            while True:
                frames = await pump.receive()
                if pump.truncated:  # libzmq's own requests never are
                    await pump.discard_rest()
                await self.handle_zap_message([f.bytes for f in frames])
        finally:
            trio.lowlevel.notify_closing(self.zap_socket.FD)
