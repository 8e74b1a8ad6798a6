"""Which listeners take data from anyone on the network (a start-up warning).

A listener bound to a non-loopback address that authenticates nobody lets
any host that can reach it write into the table. That can be a deliberate
choice on a trusted network, so it is not refused, but it is said at every
start (``listener.unauthenticated``), and the packaged example config
authenticates every non-loopback listener
(docs/decisions.md#open-listeners-are-warned-about-not-refused).
"""

from __future__ import annotations

import ipaddress

from appliance.config import Config, ListenerConfig
from appliance.server.registry import kind_of

__all__ = ["is_loopback", "unauthenticated_listeners"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or "" (every address): assume reachable


def _authenticates(listener: ListenerConfig) -> bool:
    """Client certificates are required, or peers are checked against a credential store."""
    if listener.tls and listener.client_auth == "required":
        return True
    return bool(kind_of(listener).stores(listener))


def unauthenticated_listeners(config: Config) -> list[ListenerConfig]:
    """The listeners bound beyond loopback that authenticate nobody."""
    return [
        listener
        for listener in config.listeners
        if not is_loopback(listener.host) and not _authenticates(listener)
    ]
