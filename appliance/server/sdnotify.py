"""systemd's notification protocol (``sd_notify(3)``): ``READY=1``, ``STOPPING=1``, the watchdog.

Spoken directly, not through a library: the protocol is one datagram of
``KEY=VALUE`` lines sent to the ``AF_UNIX`` socket that ``$NOTIFY_SOCKET``
names (a leading ``@`` means the abstract namespace). ``systemd-python``
needs libsystemd's headers and a compiler to install (it has no wheels, and
the packages install wheels only), and ``sdnotify`` is these same few lines
without the watchdog. Outside systemd (no ``$NOTIFY_SOCKET``) every call
does nothing.

The watchdog (``WatchdogSec=`` in the unit sets ``$WATCHDOG_USEC``) is kept
alive by a task on the event loop, :meth:`Notifier.keep_alive`, every half
period: a loop that stops running (wedged, or stopped with SIGSTOP) stops
the pings, and systemd kills and restarts the service.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Final

import trio

from appliance.logs import get_logger

__all__ = ["Notifier"]

log = get_logger("systemd")

#: Pings per watchdog period (systemd's advice: at least two).
PINGS_PER_PERIOD: Final = 2


class Notifier:
    """Tells systemd about the service's state; does nothing outside a ``Type=notify`` unit.

    Args:
        environ: the process environment (tests pass their own).
    """

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._failed = False
        #: Seconds between watchdog pings, or None when systemd asks for none.
        self.watchdog_interval: float | None = None
        usec, pid = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
        for_us = not pid or pid == str(os.getpid())
        if self._address and usec.isdigit() and int(usec) > 0 and for_us:
            self.watchdog_interval = int(usec) / 1e6 / PINGS_PER_PERIOD

    @property
    def enabled(self) -> bool:
        """Whether systemd listens (``$NOTIFY_SOCKET`` is set)."""
        return bool(self._address)

    def notify(self, *lines: str) -> bool:
        """Send ``lines`` (``READY=1``, ``STATUS=...``) as one datagram; whether it was sent.

        A failure is logged once and never raised: the service runs on, and
        systemd's own timeouts tell the operator.
        """
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode("utf-8"), self._address)
        except OSError as exc:
            if not self._failed:
                log.error("systemd.notify_failed", reason=str(exc), message=lines[0])
                self._failed = True
            return False
        return True

    async def keep_alive(self) -> None:
        """Ping the watchdog every half period until cancelled (returns at once without one)."""
        interval = self.watchdog_interval
        if interval is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await trio.sleep(interval)
