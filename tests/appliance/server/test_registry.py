"""The listener kinds: one entry per protocol, and the service knows no protocol itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from appliance.config import (
    CourierListenerConfig,
    ForwardListenerConfig,
    ListenerConfig,
    LogjamListenerConfig,
    LumberjackListenerConfig,
    WebSocketListenerConfig,
)
from appliance.server.context import ServiceContext
from appliance.server.lifecycle import Lifecycle
from appliance.server.registry import KINDS, handler_for, kind_of, stores_needed
from tests.appliance.server.support import StandInWriter

ROOT = Path(__file__).parents[3]


def test_every_listener_section_has_a_kind() -> None:
    assert set(KINDS) == set(ListenerConfig.__subclasses__())


@pytest.mark.parametrize(
    ("listener", "stores"),
    [
        (ForwardListenerConfig(), set()),
        (ForwardListenerConfig(security="shared_key"), {"credentials"}),
        (ForwardListenerConfig(security="users"), {"credentials"}),
        (LumberjackListenerConfig(), set()),
        (CourierListenerConfig(), set()),
        (WebSocketListenerConfig(), {"tokens"}),
        (LogjamListenerConfig(), {"curve_keys"}),
        (LogjamListenerConfig(curve=False), set()),
    ],
)
def test_the_stores_a_listener_needs(listener: ListenerConfig, stores: set[str]) -> None:
    assert kind_of(listener).stores(listener) == stores
    assert stores_needed([listener, LumberjackListenerConfig()]) == stores


def test_tcp_kinds_have_a_handler_and_logjam_starts_its_own_sockets() -> None:
    for cls, kind in KINDS.items():
        tcp = cls is not LogjamListenerConfig
        assert (kind.handler is not None, kind.start is None, kind.live_reload) == (tcp,) * 3
        assert kind.shares_port == tcp  # ZeroMQ sockets take no SO_REUSEPORT: worker 0 only
    assert KINDS[ForwardListenerConfig].beside is not None  # the UDP heartbeat
    context = ServiceContext(StandInWriter(), Lifecycle())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no TCP handler"):
        handler_for(LogjamListenerConfig(), context)


@pytest.mark.parametrize(
    "module",
    [
        "appliance/service.py",
        "appliance/node.py",
        "appliance/server/exposure.py",
        "appliance/server/reload.py",
    ],
)
def test_no_protocol_branches_outside_the_registry(module: str) -> None:
    """These modules ask the registry; none names a protocol's listener section."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }  # fmt: skip
    assert not {n for n in names if n.endswith("ListenerConfig") and n != "ListenerConfig"}
