"""What a reload does with each kind of listener change (appliance/server/reload.py)."""

from __future__ import annotations

import pytest

from appliance.config import parse_config
from appliance.server.reload import plan_reload

BASE = '[[listeners]]\nname = "forward"\nbind = "127.0.0.1:24224"\n'


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        ("max_connections = 50\n", "update"),
        ("tls_handshake_timeout_seconds = 3.0\n", "update"),
        ('client_auth = "required"\n', "reopen"),
        ("tls = false\n", "reopen"),
        # Both are set up with the sockets: an update in place would say
        # "reloaded" and leave them as they were.
        ("udp_heartbeat = false\n", "reopen"),
        ("reuse_port = true\n", "reopen"),
    ],
)
def test_a_setting_fixed_with_the_sockets_reopens_the_listener(extra: str, kind: str) -> None:
    plan = plan_reload(parse_config(BASE), parse_config(BASE + extra))
    assert [listener.name for listener in getattr(plan, kind)] == ["forward"]
    other = "update" if kind == "reopen" else "reopen"
    assert getattr(plan, other) == []
    assert plan.restart_required == []


def test_an_unchanged_listener_is_left_alone() -> None:
    plan = plan_reload(parse_config(BASE), parse_config(BASE))
    assert not plan.listener_changes
