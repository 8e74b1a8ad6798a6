"""Which connection handler serves which listener protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from appliance.config import (
    CourierListenerConfig,
    ForwardListenerConfig,
    ListenerConfig,
    LumberjackListenerConfig,
    WebSocketListenerConfig,
)
from appliance.server.context import ServiceContext
from appliance.server.listener import Handler
from appliance.server.sessions.courier import courier_handler
from appliance.server.sessions.forward import forward_handler
from appliance.server.sessions.lumberjack import lumberjack_handler
from appliance.server.websocket_listener import websocket_handler

__all__ = ["handler_for"]

_Factory = Callable[[Any, ServiceContext], Handler]

#: Listener config class -> the factory of its connection handler.
_HANDLERS: Final[dict[type[ListenerConfig], _Factory]] = {
    ForwardListenerConfig: forward_handler,
    LumberjackListenerConfig: lumberjack_handler,
    CourierListenerConfig: courier_handler,
    WebSocketListenerConfig: websocket_handler,
}


def handler_for(listener: ListenerConfig, context: ServiceContext) -> Handler:
    """The connection handler for ``listener``'s protocol."""
    return _HANDLERS[type(listener)](listener, context)
