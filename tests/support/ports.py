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


#: Tries at finding ``count`` free ports in a row before giving up.
_RUN_ATTEMPTS = 50


def free_port_run(count: int) -> int:
    """The first of ``count`` consecutive loopback ports that were all free a moment ago.

    For the admin listener of a service with workers: worker ``k`` binds the
    admin port plus ``k`` (docs/configuration.md), so every one of them must be
    free, not just the first.
    """
    for _ in range(_RUN_ATTEMPTS):
        first = free_port()
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise AssertionError(f"no {count} free ports in a row after {_RUN_ATTEMPTS} tries")
