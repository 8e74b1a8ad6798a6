"""Guessing a forward password is slow whatever else the client does.

In-process sessions over memory streams first: a login between guesses
resets nothing, listeners share their counts, the user is looked up only
once the shared key matched. Then a real ``appliance serve`` with
``workers = 2``: the guesses land on either worker (the kernel picks), and
each is refused once the pair's free failures are spent, whichever worker
answers.

Every wait is an hour (``failed_handshake_backoff_seconds``): a slow
machine cannot outlast one, so no outcome depends on speed.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest

from appliance.config import ForwardListenerConfig
from appliance.protocols.forward.handshake import password_digest, ping_digest
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.listener import ConnectionInfo
from appliance.server.sessions.forward import forward_handler
from auth.policy import SourcePolicy
from tests.appliance.server.sessions.test_forward import read_message, served
from tests.appliance.server.support import StandInWriter
from tests.appliance.test_supervisor import wait_for
from tests.support.cli import run_cli
from tests.support.ports import free_port
from tests.support.service import ApplianceProcess, start_appliance

KEY = b"shared-key"
PASSWORDS = {"alice": b"alice-password", "bob": b"bob-password"}
INFO = ConnectionInfo(listener="test", address="192.0.2.66", port=5000, tls=True)
THROTTLED = "too many failed handshakes"
#: An hour: every wait outlasts the test.
HOUR = 3600.0


class _Users:
    """One client network with ``KEY``; alice and bob exist. Remembers its look-ups."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []

    def resolve_source(self, address: str) -> SourcePolicy:
        return SourcePolicy("192.0.2.0/24", (KEY,))

    def password_of(self, username: str) -> bytes | None:
        self.looked_up.append(username)
        return PASSWORDS.get(username)

    def note_login(self, username: str | None, address: str) -> None:
        pass

    def note_failure(self, address: str, username: str | None, reason: str) -> None:
        pass

    def record_audit(self, action: str, target: str, **fields: Any) -> None:
        pass


def handler(context: ServiceContext, security: str = "users") -> Any:
    settings = ForwardListenerConfig(
        security=security,  # type: ignore[arg-type]
        self_hostname="server.example",
        failed_handshake_backoff_seconds=HOUR,
        failed_handshake_max_backoff_seconds=HOUR,
    )
    return forward_handler(settings, context)


def context_of(store: _Users) -> ServiceContext:
    return ServiceContext(StandInWriter(), Lifecycle(), credentials=store)  # type: ignore[arg-type]


async def login(served_handler: Any, username: str, password: bytes, key: bytes = KEY) -> str:
    """One handshake over a memory stream; the PONG's reason ("" when accepted)."""
    async with served(served_handler, INFO) as client:
        unpacker = msgpack.Unpacker()
        (_, options) = await read_message(client, unpacker)
        digest = ping_digest(b"salt", "client.example", options["nonce"], key)
        secret = password_digest(options["auth"], username, password)
        await client.send_all(msgpack.packb(
            ["PING", "client.example", "salt", digest, username, secret], use_bin_type=True
        ))  # fmt: skip
        pong = await read_message(client, unpacker)
        await client.aclose()
    assert pong[0] == "PONG"
    return "" if pong[1] else str(pong[2])


@pytest.mark.trio
async def test_a_login_between_guesses_does_not_reset_them() -> None:
    served_handler = handler(context_of(_Users()))
    bob: list[str] = []
    for _ in range(5):
        for _ in range(3):
            bob.append(await login(served_handler, "bob", b"guess"))
        assert await login(served_handler, "alice", PASSWORDS["alice"]) == ""
    assert bob[:4] == ["username/password mismatch"] * 4
    assert all(reason.startswith(THROTTLED) for reason in bob[4:]), bob


@pytest.mark.trio
async def test_forward_listeners_of_a_process_share_their_counts() -> None:
    context = context_of(_Users())
    listeners = [handler(context), handler(context)]
    reasons = [await login(listeners[n % 2], "bob", b"guess") for n in range(6)]
    assert reasons[:4] == ["username/password mismatch"] * 4
    assert all(reason.startswith(THROTTLED) for reason in reasons[4:]), reasons


@pytest.mark.trio
async def test_the_user_is_looked_up_only_once_the_shared_key_matched() -> None:
    """Without the shared key, nothing of the user is read: its existence takes no time to tell."""
    store = _Users()
    served_handler = handler(context_of(store))
    assert await login(served_handler, "alice", b"x", key=b"wrong") == "shared_key mismatch"
    assert await login(served_handler, "nobody", b"x", key=b"wrong") == "shared_key mismatch"
    assert store.looked_up == []
    assert await login(served_handler, "nobody", b"x") == "username/password mismatch"
    assert store.looked_up == ["nobody"]


@pytest.mark.trio
async def test_without_users_the_claimed_username_names_no_count() -> None:
    """With ``security = "shared_key"`` a PING's username is not checked: varying it is no help."""
    served_handler = handler(context_of(_Users()), security="shared_key")
    reasons = [await login(served_handler, f"name-{n}", b"x", key=b"wrong") for n in range(6)]
    assert reasons[:4] == ["shared_key mismatch"] * 4
    assert all(reason.startswith(THROTTLED) for reason in reasons[4:]), reasons


# -- a real service with two workers -------------------------------------------------


def tls_login(app: ApplianceProcess, port: int, username: str, password: str) -> tuple[str, int]:
    """One handshake on a new TLS connection; the PONG's reason ("" if accepted), our port."""
    context = ssl.create_default_context(cafile=str(app.ca_file))
    raw = socket.create_connection(("127.0.0.1", port), timeout=60)
    with context.wrap_socket(raw, server_hostname="localhost") as tls:
        local_port = int(tls.getsockname()[1])
        unpacker = msgpack.Unpacker(raw=False)

        def read() -> Any:
            while True:
                for message in unpacker:
                    return message
                data = tls.recv(65536)
                assert data, "closed before an answer"
                unpacker.feed(data)

        (_, options) = read()
        salt = os.urandom(16).hex().encode()
        digest = ping_digest(salt, "py-client", options["nonce"], KEY)
        secret = password_digest(options["auth"], username, password.encode())
        tls.sendall(msgpack.packb(["PING", "py-client", salt, digest, username, secret]))
        pong = read()
    return ("" if pong[1] else str(pong[2])), local_port


#: A handshake's outcome line of a worker: which worker, and the client's port.
_ANSWERED = re.compile(
    r"event=handshake\.(?:ok|failed|throttled) worker=(\d+) peer=127\.0\.0\.1:(\d+)\b"
)


def test_guesses_are_throttled_whichever_worker_answers(tmp_path: Path) -> None:
    """The alternating attack on ``workers = 2``: bob's 5th guess is refused, and every later."""
    port = free_port()
    listener = (
        f'protocol = "forward"\nbind = "127.0.0.1:{port}"\nsecurity = "users"\n'
        f"failed_handshake_backoff_seconds = {HOUR}\n"
        f"failed_handshake_max_backoff_seconds = {HOUR}\n"
    )
    app = start_appliance(tmp_path, {"forward": listener}, "workers = 2")
    try:
        wait_for(lambda: "event=supervisor.ready" in app.log(), "supervisor.ready", app=app)
        config = tmp_path / "appliance0.toml"
        run_cli(
            "key",
            "add",
            "fleet",
            "--secret-stdin",
            config=config,
            stdin=KEY.decode() + "\n",
            check=True,
        )
        for name, password in PASSWORDS.items():
            run_cli(
                "user",
                "add",
                name,
                "--password-stdin",
                config=config,
                stdin=password.decode() + "\n",
                check=True,
            )

        guesses: list[tuple[str, int]] = []
        logins: list[tuple[str, int]] = []
        # 40 connections: that the kernel hands them all to one worker has odds of 2**-39.
        for _ in range(10):
            for _ in range(3):
                guesses.append(tls_login(app, port, "bob", "not-bobs-password"))
            logins.append(tls_login(app, port, "alice", "alice-password"))

        answered_by = {int(p): int(w) for w, p in _ANSWERED.findall(app.log())}
        worker_of = [answered_by[local_port] for _, local_port in guesses + logins]
        assert Counter(worker_of).keys() == {0, 1}, "one worker took every connection"
        reasons = [reason for reason, _ in guesses]
        assert reasons[:4] == ["username/password mismatch"] * 4, reasons
        assert all(reason.startswith(THROTTLED) for reason in reasons[4:]), reasons
        refused_by = {answered_by[local_port] for _, local_port in guesses[4:]}
        # The least-connections gate gives a closed-then-opened connection to
        # whichever idle worker wakes first, so a run of them can all go to
        # one: more guesses (at most 60) until each worker has answered one.
        for _ in range(60):
            if refused_by == {0, 1}:
                break
            reason, local_port = tls_login(app, port, "bob", "not-bobs-password")
            assert reason.startswith(THROTTLED), reason

            def answered(port: int = local_port) -> bool:
                return str(port) in {p for _, p in _ANSWERED.findall(app.log())}

            wait_for(answered, "the worker's log line of the guess", app=app)
            answered_by = {int(p): int(w) for w, p in _ANSWERED.findall(app.log())}
            refused_by.add(answered_by[local_port])
        assert refused_by == {0, 1}, "both workers refuse the guesses"
        # The attacker's own credential still works: only bob's pair is held back.
        assert [reason for reason, _ in logins] == [""] * len(logins)
    finally:
        assert app.stop() == 0, app.log()
