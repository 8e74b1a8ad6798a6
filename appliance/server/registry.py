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
from appliance.server.courier_driver import courier_driver
from appliance.server.forward_driver import forward_driver
from appliance.server.listener import Handler
from appliance.server.lumberjack_driver import lumberjack_driver
from appliance.server.websocket_driver import websocket_driver

__all__ = ["handler_for"]

_Factory = Callable[[Any, ServiceContext], Handler]

#: Listener config class -> the factory of its connection handler.
_HANDLERS: Final[dict[type[ListenerConfig], _Factory]] = {
    ForwardListenerConfig: forward_driver,
    LumberjackListenerConfig: lumberjack_driver,
    CourierListenerConfig: courier_driver,
    WebSocketListenerConfig: websocket_driver,
}


def handler_for(listener: ListenerConfig, context: ServiceContext) -> Handler:
    """The connection handler for ``listener``'s protocol."""
    return _HANDLERS[type(listener)](listener, context)
