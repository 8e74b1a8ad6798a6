"""Ports for tests: the only definition of :func:`free_port`."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago.

    For what must be known before a process starts (workers sharing a port, an
    address written into a config file another process reads). A listener that
    reports what it bound takes port 0 instead: no race at all
    (:func:`tests.support.service.start_appliance` does that).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
