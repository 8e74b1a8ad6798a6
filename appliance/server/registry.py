"""Each protocol's listener kind: how its listener starts, and which credential stores it needs.

The service looks a listener up here and knows no protocol itself. A TCP
kind names its connection handler (and anything it runs beside the
socket: forward answers UDP heartbeats on its port); a kind with sockets
of its own (Logjam's ZeroMQ) names its start, and says that its port
cannot be shared by the workers of one machine. Adding a protocol means a
codec, its rows, a config section and one entry in :data:`KINDS`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import trio

from appliance.config import (
    CourierListenerConfig,
    ForwardListenerConfig,
    ListenerConfig,
    LogjamListenerConfig,
    LumberjackListenerConfig,
    WebSocketListenerConfig,
)
from appliance.server.context import ServiceContext
from appliance.server.heartbeat import serve_udp_heartbeat
from appliance.server.launch import Beside, ListenerSite, serve_tcp
from appliance.server.listener import Handler
from appliance.server.logjam_listener import serve_logjam
from appliance.server.sessions.courier import courier_handler
from appliance.server.sessions.forward import forward_handler
from appliance.server.sessions.lumberjack import lumberjack_handler
from appliance.server.websocket_listener import websocket_handler

__all__ = [
    "KINDS",
    "ListenerKind",
    "Store",
    "handler_for",
    "kind_of",
    "start_listener",
    "stores_needed",
]

#: A store of credentials a listener checks peers against, all in the auth
#: database: users, shared keys and client networks (the forward handshake),
#: bearer tokens (WebSocket), CURVE client keys (Logjam).
Store = Literal["credentials", "tokens", "curve_keys"]

#: Builds the connection handler of a TCP listener from its settings.
HandlerFactory = Callable[[Any, ServiceContext], Handler]
#: Opens a listener that has sockets of its own and records them in the site.
Start = Callable[[Any, ListenerSite], Awaitable[None]]


def _no_stores(listener: Any) -> frozenset[Store]:
    return frozenset()


@dataclass(frozen=True, slots=True)
class ListenerKind:
    """How one protocol's listeners start and what they need of the service."""

    #: The connection handler of a TCP listener; None when ``start`` opens its own sockets.
    handler: HandlerFactory | None = None
    #: Opens a non-TCP listener (None: TCP sockets served by ``handler``).
    start: Start | None = None
    #: Started beside a TCP listener on the port it bound.
    beside: Beside | None = None
    #: The stores a listener with these settings checks its peers against.
    stores: Callable[[Any], frozenset[Store]] = _no_stores
    #: Whether a reload may start, stop or change such a listener (else: a restart).
    live_reload: bool = True
    #: Whether several processes can share the listener's port: with ``workers``,
    #: such a listener runs in every worker on the socket the supervisor bound
    #: (appliance/server/spread.py), one that cannot (ZeroMQ sockets) in worker 0
    #: only (appliance.node.worker_config).
    shares_port: bool = True


async def _udp_heartbeat(listener: ForwardListenerConfig, port: int, nursery: trio.Nursery) -> None:
    if listener.udp_heartbeat:
        serve = functools.partial(serve_udp_heartbeat, reuse_port=listener.reuse_port)
        await nursery.start(serve, listener.host, port)


def _forward_stores(listener: ForwardListenerConfig) -> frozenset[Store]:
    return frozenset({"credentials"}) if listener.security != "off" else frozenset()


def _websocket_stores(listener: WebSocketListenerConfig) -> frozenset[Store]:
    return frozenset({"tokens"})  # every ingest connection needs a token or a client certificate


def _logjam_stores(listener: LogjamListenerConfig) -> frozenset[Store]:
    return frozenset({"curve_keys"}) if listener.curve else frozenset()


async def _start_logjam(listener: LogjamListenerConfig, site: ListenerSite) -> None:
    """Start a Logjam (ZeroMQ) listener.

    It is no TcpService: it runs in the connections nursery so that its 202
    replies go out after the writer drains, and it stops reading on
    ``lifecycle.stop_reading()`` like the stream connections. It opens its
    CURVE keys itself (the auth database, or the embedded one when None).
    """
    config = site.config
    ports = await site.connections.start(
        functools.partial(
            serve_logjam,
            listener,
            site.context,
            config.home_dir,  # a worker's CURVE keypair is the supervisor's
            auth=config.auth_settings,
        )
    )
    site.running.ports[listener.name] = ports.router
    if ports.pull is not None:
        site.running.ports[f"{listener.name}-pull"] = ports.pull


#: Listener config class -> its kind.
KINDS: Final[Mapping[type[ListenerConfig], ListenerKind]] = {
    ForwardListenerConfig: ListenerKind(
        forward_handler, beside=_udp_heartbeat, stores=_forward_stores
    ),
    LumberjackListenerConfig: ListenerKind(lumberjack_handler),
    CourierListenerConfig: ListenerKind(courier_handler),
    WebSocketListenerConfig: ListenerKind(websocket_handler, stores=_websocket_stores),
    LogjamListenerConfig: ListenerKind(
        start=_start_logjam, stores=_logjam_stores, live_reload=False, shares_port=False
    ),
}


def kind_of(listener: ListenerConfig) -> ListenerKind:
    """The kind of ``listener``'s protocol."""
    return KINDS[type(listener)]


def handler_for(listener: ListenerConfig, context: ServiceContext) -> Handler:
    """The connection handler for ``listener`` (a TCP listener)."""
    factory = kind_of(listener).handler
    if factory is None:
        raise TypeError(f"listener {listener.name!r} ({listener.protocol}) has no TCP handler")
    return factory(listener, context)


def stores_needed(listeners: Iterable[ListenerConfig]) -> frozenset[Store]:
    """Every store some of ``listeners`` checks its peers against."""
    return frozenset().union(*(kind_of(listener).stores(listener) for listener in listeners))


async def start_listener(listener: ListenerConfig, site: ListenerSite) -> None:
    """Open ``listener`` and run it in ``site``'s nurseries; returns once it is open.

    Raises:
        OSError: an address cannot be bound (:class:`~appliance.server.launch.BindError`
            for a TCP listener, naming it).
    """
    kind = kind_of(listener)
    if kind.start is not None:
        await kind.start(listener, site)
        return
    handler = handler_for(listener, site.context)
    await site.acceptors.start(serve_tcp, listener, handler, site, kind.beside)
