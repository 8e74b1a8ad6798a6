"""Starting a TCP listener (appliance/server/launch.py): what a failed start leaves behind."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from appliance.config import Config, ForwardListenerConfig
from appliance.server.context import ServiceContext
from appliance.server.launch import BindError, ListenerSite, serve_tcp
from appliance.server.lifecycle import Lifecycle
from tests.appliance.server.support import StandInWriter


def _refused(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
    return False


@pytest.mark.trio
async def test_a_start_that_fails_after_the_bind_closes_the_sockets(tmp_path: Path) -> None:
    """The heartbeat beside it cannot bind: the TCP port must not stay bound, queueing,
    nor the listener recorded as running."""
    listener = ForwardListenerConfig(name="forward", bind="127.0.0.1:0", tls=False)
    running = SimpleNamespace(ports={}, services={}, accepting={}, tls_audit=None)
    tls = SimpleNamespace(certificate_revocation=None)

    port_seen: list[int] = []

    async def beside(_listener: Any, port: int, _nursery: trio.Nursery) -> None:
        port_seen.append(port)
        raise OSError(errno.EADDRINUSE, "heartbeat port in use")

    async def start() -> None:
        async with trio.open_nursery() as acceptors, trio.open_nursery() as connections:
            site = ListenerSite(
                ServiceContext(StandInWriter(), Lifecycle()),  # type: ignore[arg-type]
                Config(state_dir=tmp_path),
                tls,  # type: ignore[arg-type]
                acceptors,
                connections,
                running,
            )
            # A plain OSError naming the listener, not an exception group: a
            # reload catches OSError around this start to refuse a listener it
            # cannot start and keep serving.
            with pytest.raises(BindError, match="listener 'forward' cannot start beside") as raised:
                await acceptors.start(serve_tcp, listener, lambda *_: None, site, beside)
            assert raised.value.errno == errno.EADDRINUSE
            assert isinstance(raised.value.__cause__, OSError)

    await start()
    assert port_seen
    assert _refused(port_seen[0])
    # Nothing recorded stays: a later reload must not take the listener for open.
    assert (running.ports, running.services, running.accepting) == ({}, {}, {})
