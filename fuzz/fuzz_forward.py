"""Fuzz target: Fluentd forward, through ``ForwardSession`` (with and without the handshake).

Run: ``python fuzz/fuzz_forward.py [libFuzzer flags] CORPUS_DIR...`` (fuzz/README.md).
Without atheris, :func:`run_one` runs one input (tests/fuzz).

The input is fuzz/harness.py's layout; the target's own flag bits:

* ``0x01`` security on: the session sends a HELO and the first request must
  be a PING; the PING goes through the session's real ``_authenticate``
  (failure limiter, verdict, PONG, the bytes held meanwhile), with the
  credential look-up answered by :class:`_Store`;
* ``0x02`` security "users" (a username and password are checked too);
* ``0x04`` accept any well-formed PING: the real verdict is computed, then
  replaced by a success, so hostnames and usernames the fuzzer invents reach
  the ``host`` and ``source`` columns (a digest it cannot forge would stop
  them at the handshake otherwise);
* ``0x08`` the source network admits clients without a username;
* ``0x10`` the peer is in no client network and anonymous sources are refused;
  together with ``0x08`` instead: the credential store is unavailable (every
  look-up raises ``AuthError``); together with ``0x04`` instead: the peer's
  address has failed too often already (the limiter throttles it).

The HELO's nonce and auth salt are zero bytes (``os.urandom`` is replaced in
the driver module while a run lasts), so seeds can carry a PING whose digest
is right: fuzz/make_corpus.py signs them with :data:`SHARED_KEY`.

Limits: the listener's defaults, but ``max_decompressed_bytes`` of 1 MiB (a
64 KiB input could otherwise inflate to the 64 MiB default and decode for
seconds); with ``SMALL_LIMITS`` a 300-byte request, 4 KiB decompressed, 8
events.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

if not __package__:  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz.instrument import instrumented

with instrumented(__name__):
    from appliance.config import ForwardListenerConfig
    from appliance.protocols.forward.handshake import Verdict
    from appliance.server.sessions import forward as forward_session
    from appliance.server.sessions.forward import ForwardSession, _Security
    from auth.errors import AuthError
    from auth.policy import SourcePolicy
    from auth.ratelimit import GuessLimiter, GuessRules, LimiterSettings
    from fuzz.harness import SMALL_LIMITS, FuzzInput, connection_info, drive, fuzz_main

#: The shared key the seeds' PINGs are signed with.
SHARED_KEY: Final = b"fuzz-shared-key"
#: The one user the store knows, and its password.
USERNAME: Final = "fuzz"
PASSWORD: Final = b"fuzz-password"
#: The PONG's server hostname.
SERVER_HOSTNAME: Final = "appliance.fuzz"

SECURITY: Final = 0x01
USERS: Final = 0x02
ACCEPT_ANY_PING: Final = 0x04
ALLOW_ANONYMOUS_USER: Final = 0x08
UNKNOWN_NETWORK: Final = 0x10

_DEFAULT: Final = ForwardListenerConfig(max_decompressed_bytes=1024 * 1024)
_SMALL: Final = ForwardListenerConfig(
    max_request_bytes=300, max_decompressed_bytes=4096, max_events_per_request=8
)


@dataclass(frozen=True, slots=True)
class _Store:
    """A credential store with one network, one key and one user (no database)."""

    known_network: bool
    allow_anonymous: bool
    available: bool = True

    def resolve_source(self, address: str) -> SourcePolicy:
        if not self.available:
            raise AuthError("the auth database is unavailable (fuzz)")
        if not self.known_network:
            return SourcePolicy(network=None, shared_keys=(SHARED_KEY,))
        return SourcePolicy(
            network="192.0.2.0/24",
            shared_keys=(SHARED_KEY,),
            allow_anonymous=self.allow_anonymous,
        )

    def password_of(self, username: str) -> bytes | None:
        return PASSWORD if username == USERNAME else None

    def note_login(self, username: str | None, address: str) -> None:
        return None

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        return None

    def record_audit(
        self,
        action: str,
        target: str,
        *,
        actor: str | None,
        detail: str = "",
        source_address: str | None = None,
    ) -> None:
        return None


class _AcceptAnyPing(ForwardSession):
    """The real session, whose verdict becomes a success after it was computed."""

    def _verdict(self, username: str, address: str) -> Verdict:
        real = super()._verdict(username, address)
        security = self._security
        assert security is not None
        user = username if security.users_required and username else None
        return Verdict(True, shared_key=real.shared_key or SHARED_KEY, username=user)


async def _run_sync(fn: Any, *args: Any, **_: Any) -> Any:
    """``trio.to_thread.run_sync`` without a thread: the credential look-up runs inline."""
    return fn(*args)


def _zero_bytes(n: int) -> bytes:
    return b"\0" * n


@contextmanager
def _no_threads_no_randomness() -> Iterator[None]:
    """The driver module's ``trio`` and ``os``, replaced for one run (restored after)."""
    namespace = vars(forward_session)
    saved = namespace["trio"], namespace["os"]
    namespace["trio"] = SimpleNamespace(to_thread=SimpleNamespace(run_sync=_run_sync))
    namespace["os"] = SimpleNamespace(urandom=_zero_bytes)
    try:
        yield
    finally:
        namespace["trio"], namespace["os"] = saved


def run_one(data: bytes) -> None:
    """One input through the forward session, its rows and Arrow (fuzz/harness.py)."""
    fuzz = FuzzInput.parse(data)
    settings = _SMALL if fuzz.has(SMALL_LIMITS) else _DEFAULT
    if fuzz.has(USERS):
        settings = replace(settings, security="users")
    elif fuzz.has(SECURITY):
        settings = replace(settings, security="shared_key")
    info = connection_info()
    unknown = fuzz.has(UNKNOWN_NETWORK)
    unavailable = unknown and fuzz.has(ALLOW_ANONYMOUS_USER)
    throttled = unknown and fuzz.has(ACCEPT_ANY_PING)
    # A clock that stands still: a throttled address stays throttled for the run.
    limiter = GuessLimiter(GuessRules.of(LimiterSettings()), clock=lambda: 0.0)
    if throttled:
        for _ in range(limiter.rules.address.free_failures + 1):
            limiter.record_failure(info.address, "")
    with _no_threads_no_randomness():
        security = None
        if settings.security != "off":
            security = _Security(
                store=_Store(
                    known_network=not unknown or unavailable or throttled,
                    allow_anonymous=fuzz.has(ALLOW_ANONYMOUS_USER),
                    available=not unavailable,
                ),
                limiter=limiter,
                users_required=settings.security == "users",
                allow_anonymous_source=not unknown or unavailable or throttled,
                server_hostname=SERVER_HOSTNAME,
                thread_limiter=None,  # type: ignore[arg-type]  # _run_sync takes no limiter
            )
        kind = _AcceptAnyPing if fuzz.has(ACCEPT_ANY_PING) else ForwardSession
        drive(kind(settings, info, security), fuzz.reads())


if __name__ == "__main__":
    fuzz_main(run_one)
