"""Revocation of open connections: the registry's passes, and a client certificate end to end.

The registry's tests run on the autojump clock with the checks on the event
loop (they do no I/O), so the 30 s bound is virtual time and does not depend
on the machine. The credential kinds are tested where their handshake is:
tokens in test_websocket_listener.py, forward users and shared keys in
sessions/test_forward.py, CURVE keys in test_logjam_listener.py; the client
certificate here, through a real service and its reload.
"""

from __future__ import annotations

import ssl
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from appliance.config import Config, ForwardListenerConfig, LakeConfig
from appliance.server.revocation import (
    RECHECK_INTERVAL_SECONDS,
    Credential,
    OpenConnections,
    Revoked,
)
from appliance.service import Running, serve
from auth.errors import DatabaseError
from pki.authority import CertificateAuthority, PkiPaths

#: Virtual seconds a close may take after the pass that finds the revocation.
CLOSE_SLACK_SECONDS = 5.0


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    """The fields of every ``name`` log event captured so far."""
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == name]


class Switch:
    """A credential's state that a test flips: the check says what it is now."""

    def __init__(self, ident: str) -> None:
        self.ident = ident
        self.revoked = False
        self.unavailable = False
        self.calls = 0

    def check(self) -> Revoked | None:
        self.calls += 1
        if self.unavailable:
            raise DatabaseError("the auth database is unreachable")
        return Revoked(self.ident, "token revoked") if self.revoked else None

    def credential(self) -> Credential:
        return Credential(self.ident, ("test", self.ident), self.check)


async def busy_connection(
    connections: OpenConnections,
    switch: Switch,
    closed: dict[str, float],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A connection that works every second until it is closed; records when."""
    with connections.watch("tail", "192.0.2.7:5000") as guard:
        guard.add(switch.credential())
        task_status.started()
        while True:
            await trio.sleep(1)
    closed["at"] = trio.current_time()
    closed["revoked"] = float(guard.revoked is not None)


@pytest.mark.trio
async def test_a_revoked_credential_closes_its_connection_within_the_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    connections = OpenConnections(checks_in_thread=False)
    switch = Switch("token:ops")
    closed: dict[str, float] = {}
    with trio.fail_after(RECHECK_INTERVAL_SECONDS * 10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connections.run)
            await nursery.start(busy_connection, connections, switch, closed)
            await trio.sleep(RECHECK_INTERVAL_SECONDS * 2.5)  # passes while it holds
            assert closed == {}
            switch.revoked = True
            revoked_at = trio.current_time()
            while "at" not in closed:
                await trio.sleep(1)
            nursery.cancel_scope.cancel()
    assert closed["revoked"] == 1.0
    assert closed["at"] - revoked_at <= RECHECK_INTERVAL_SECONDS + CLOSE_SLACK_SECONDS
    assert connections.count() == 0
    (line,) = events(caplog, "connection.revoked")
    assert line == {
        "listener": "tail", "peer": "192.0.2.7:5000", "credential": "token:ops",
        "reason": "token revoked", "trigger": "interval",
    }  # fmt: skip


@pytest.mark.trio
async def test_a_check_that_cannot_be_made_keeps_the_connection_until_it_can(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    connections = OpenConnections(checks_in_thread=False)
    switch = Switch("user:alice")
    closed: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(busy_connection, connections, switch, closed)
        switch.unavailable = True
        assert await connections.recheck("SIGHUP") == 0
        assert closed == {}
        (line,) = events(caplog, "revocation.unchecked")
        assert line["credentials"] == 1
        assert "unreachable" in line["reason"]
        switch.unavailable, switch.revoked = False, True
        assert await connections.recheck("SIGHUP") == 1
        with trio.fail_after(CLOSE_SLACK_SECONDS):
            while "at" not in closed:
                await trio.sleep(0.1)
    assert [e["trigger"] for e in events(caplog, "connection.revoked")] == ["SIGHUP"]


@pytest.mark.trio
async def test_connections_that_share_a_credential_share_its_check(
    autojump_clock: trio.testing.MockClock,
) -> None:
    connections = OpenConnections(checks_in_thread=False)
    switch = Switch("token:ops")
    other = Switch("token:app")
    closed = [dict[str, float]() for _ in range(3)]
    async with trio.open_nursery() as nursery:
        for index, credential in enumerate((switch, switch, other)):
            await nursery.start(busy_connection, connections, credential, closed[index])
        await connections.recheck("SIGHUP")
        assert (switch.calls, other.calls) == (1, 1)
        switch.revoked = True
        assert await connections.recheck("SIGHUP") == 2
        await trio.sleep(1)
        assert [bool(c) for c in closed] == [True, True, False]
        assert connections.count("tail") == 1
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_the_checks_run_in_a_worker_thread() -> None:
    """The service's registry: the look-ups (blocking) leave the event loop."""
    connections = OpenConnections()
    threads: list[bool] = []

    def check() -> Revoked | None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            threads.append(True)  # no trio run in this thread
        return Revoked("key:fleet", "shared key deleted or changed")

    closed: list[bool] = []
    async with trio.open_nursery() as nursery:

        async def connection() -> None:
            with connections.watch("forward", "192.0.2.1:1") as guard:
                guard.add(Credential("key:fleet", ("key", "fleet"), check))
                await trio.sleep_forever()
            closed.append(guard.revoked is not None)

        nursery.start_soon(connection)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(30):
            assert await connections.recheck("SIGHUP") == 1
    assert threads == [True]
    assert closed == [True]


# -- a client certificate, through the service and its reload --------------------------------


def tls_config(tmp_path: Path) -> Config:
    listener = ForwardListenerConfig(bind="127.0.0.1:0", client_auth="required")
    return Config(
        state_dir=tmp_path / "state",
        lake=LakeConfig(commit_max_delay_seconds=0.05),
        listeners=[listener],
    )


async def mtls_client(info: Running, tmp_path: Path, issued: Any) -> trio.SSLStream[Any]:
    serial = f"{issued.certificate.serial_number:x}"
    cert_file, key_file = tmp_path / f"{serial}.crt", tmp_path / f"{serial}.key"
    cert_file.write_bytes(issued.cert_pem())
    key_file.write_bytes(issued.key_pem())
    assert info.ca_file is not None
    context = ssl.create_default_context(cafile=str(info.ca_file))
    context.load_cert_chain(cert_file, key_file)
    sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
    stream = trio.SSLStream(sock, context, server_hostname="localhost")
    await stream.do_handshake()
    return stream


def request(chunk: str) -> bytes:
    entries = msgpack.packb([1700000000, {"chunk": chunk}])
    return msgpack.packb(["mtls", entries, {"chunk": chunk}])


async def next_answer(stream: trio.abc.ReceiveStream, unpacker: msgpack.Unpacker) -> Any:
    """The next answer, or None once the server closed the connection."""
    with trio.fail_after(30):
        while True:
            for answer in unpacker:
                return answer
            try:
                data = await stream.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            unpacker.feed(data)


@pytest.mark.trio
async def test_a_reload_closes_connections_whose_certificate_is_on_the_new_crl(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tls_config(tmp_path)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(partial(serve, config, stop=stop))
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        doomed = ca.issue_client("stolen-laptop")
        kept = ca.issue_client("web-01")
        stolen = await mtls_client(info, tmp_path, doomed)
        good = await mtls_client(info, tmp_path, kept)
        stolen_answers, good_answers = msgpack.Unpacker(), msgpack.Unpacker()
        for n in range(3):  # busy: a request after each ack
            await stolen.send_all(request(f"stolen-{n}"))
            assert await next_answer(stolen, stolen_answers) == {"ack": f"stolen-{n}"}
        await good.send_all(request("good-0"))
        assert await next_answer(good, good_answers) == {"ack": "good-0"}

        ca.revoke(doomed.certificate.serial_number, "keyCompromise")
        assert info.reload is not None
        status = await info.reload("SIGHUP")  # what `appliance cert revoke` asks for
        assert status.ok
        # Closed by the reload itself: nothing more is answered, the stream ends.
        assert await next_answer(stolen, stolen_answers) is None
        await good.send_all(request("good-1"))
        assert await next_answer(good, good_answers) == {"ack": "good-1"}
        await trio.aclose_forcefully(stolen)
        await good.aclose()
        stop.set()
    (line,) = events(caplog, "connection.revoked")
    assert line["credential"] == f"cert:{doomed.certificate.serial_number:x}"
    assert line["reason"] == "certificate revoked (keyCompromise)"
    assert (line["listener"], line["trigger"]) == ("forward", "SIGHUP")
