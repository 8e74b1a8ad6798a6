"""systemd notifications: READY=1 once listening, watchdog pings, STOPPING=1.

A datagram socket stands in for systemd's ``$NOTIFY_SOCKET``; the service
runs in-process. (That a real unit reaches ``active (running)`` through
READY=1 belongs to the package test under systemd-nspawn.)
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from appliance.config import AdminConfig, ForwardListenerConfig
from appliance.server.sdnotify import Notifier
from tests.support.service import running, service_config


def test_outside_systemd_nothing_is_sent() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert notifier.notify("READY=1") is False


def test_watchdog_settings() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}
    assert Notifier(env).watchdog_interval == 15.0
    assert Notifier({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 15.0
    assert Notifier({**env, "WATCHDOG_PID": "1"}).watchdog_interval is None  # another process's
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval is None


def test_abstract_socket_names_and_failures_are_quiet(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        name = f"appliance-test-{os.getpid()}"
        listener.bind("\0" + name)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("READY=1", "STATUS=x")
        assert listener.recv(4096) == b"READY=1\nSTATUS=x"
    # Nobody listens: logged once, never raised.
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).notify("READY=1") is False


@pytest.mark.trio
async def test_the_service_says_ready_pings_the_watchdog_and_says_stopping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify"
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    config = service_config(tmp_path, ForwardListenerConfig)
    config = replace(config, admin=AdminConfig(bind="127.0.0.1:0"))
    messages: list[bytes] = []
    with sock:
        async with running(config):
            with trio.fail_after(30):
                while len([m for m in messages if m == b"WATCHDOG=1"]) < 3:
                    messages.append(await sock.recv(4096))
        with trio.fail_after(30):
            while b"STOPPING=1" not in messages:
                messages.append(await sock.recv(4096))
    ready = [m for m in messages if m.startswith(b"READY=1")]
    assert ready == [b"READY=1\nSTATUS=listening: forward"]
    assert messages.index(ready[0]) < messages.index(b"WATCHDOG=1")
    assert messages[-1] == b"STOPPING=1"
