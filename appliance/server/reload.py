"""What a reload (SIGHUP, ``systemctl reload``) can apply to a running service, and what not.

:func:`plan_reload` compares the running configuration with the file as it
reads now. Listener changes apply live: a new listener starts, a removed
one stops accepting (its open connections finish), and a changed one gets
its new settings for every new connection (authentication, limits,
deadlines; a new ``bind``, ``tls``, ``client_auth``, ``reuse_port`` or
``udp_heartbeat`` re-opens it). The
``[tls]`` files are re-read by the TLS reload itself. Everything else (the
state directory, node id, table, auth database, log format, maintenance
schedule, the ``[admin]`` listener, a Logjam listener's ZeroMQ sockets) is
fixed for the life of the process: those keys are named in
``restart_required`` and logged as ``config.changed``, never silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from appliance.config import Config, ListenerConfig
from appliance.server.registry import kind_of

__all__ = ["FIXED_KEYS", "ReloadPlan", "plan_reload"]

#: Top-level sections and keys a running service cannot change.
FIXED_KEYS: tuple[str, ...] = (
    "state_dir",
    "node_id",
    "shutdown_timeout_seconds",
    "decode_budget_bytes",
    "workers",
    "log",
    "lake",
    "auth",
    "maintenance",
    "retention",
    "spark",
    "admin",
)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """The differences between two configurations, sorted by what can be done with them."""

    #: Listeners to start (new names).
    start: list[ListenerConfig] = field(default_factory=list)
    #: Names of listeners to stop accepting.
    stop: list[str] = field(default_factory=list)
    #: Listeners whose new settings apply to new connections, same socket.
    update: list[ListenerConfig] = field(default_factory=list)
    #: Listeners to re-open (new bind, tls, client_auth, reuse_port or udp_heartbeat).
    reopen: list[ListenerConfig] = field(default_factory=list)
    #: Config keys whose new value needs a restart, as dotted paths.
    restart_required: list[str] = field(default_factory=list)
    #: Whether ``[tls]`` changed (the TLS reload re-reads its files anyway).
    tls_changed: bool = False

    @property
    def listener_changes(self) -> bool:
        """Whether any listener is started, stopped, updated or re-opened."""
        return bool(self.start or self.stop or self.update or self.reopen)


def _changed_keys(prefix: str, old: Any, new: Any) -> list[str]:
    if dataclasses.is_dataclass(old) and type(old) is type(new):
        keys: list[str] = []
        for f in dataclasses.fields(old):
            keys += _changed_keys(f"{prefix}.{f.name}", getattr(old, f.name), getattr(new, f.name))
        return keys
    return [] if old == new else [prefix]


def _socket_of(listener: ListenerConfig) -> tuple[str, bool, str, bool, bool]:
    """The settings fixed when a listener's sockets open: a change of one re-opens it."""
    # The UDP heartbeat and SO_REUSEPORT are set up with the sockets, so an
    # update in place (new connections' settings only) would not apply them.
    heartbeat = getattr(listener, "udp_heartbeat", False)
    return listener.bind, listener.tls, listener.client_auth, listener.reuse_port, heartbeat


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    """What to do to go from the ``running`` configuration to ``new``."""
    restart: list[str] = []
    for name in FIXED_KEYS:
        restart += _changed_keys(name, getattr(running, name), getattr(new, name))
    tls_changed = running.tls != new.tls
    if running.tls.server_names != new.tls.server_names:
        restart.append("tls.server_names (run appliance cert rotate-server)")
    old_by_name = {listener.name: listener for listener in running.listeners}
    new_by_name = {listener.name: listener for listener in new.listeners}
    plan = ReloadPlan(tls_changed=tls_changed)
    for name, listener in new_by_name.items():
        before = old_by_name.get(name)
        if not kind_of(listener).live_reload or (
            before is not None and not kind_of(before).live_reload
        ):
            # Such a listener is set up once (Logjam: ZeroMQ sockets, CURVE, the ZAP handler).
            if before != listener:
                restart.append(f"listeners.{name}")
            continue
        if before is None:
            plan.start.append(listener)
        elif before == listener:
            continue
        elif type(before) is not type(listener) or _socket_of(before) != _socket_of(listener):
            plan.reopen.append(listener)
        else:
            plan.update.append(listener)
    for name, before in old_by_name.items():
        if name not in new_by_name:
            if not kind_of(before).live_reload:
                restart.append(f"listeners.{name}")
            else:
                plan.stop.append(name)
    return dataclasses.replace(plan, restart_required=restart)
