"""The appliance's configuration: one TOML file, every key optional (docs/decisions.md).

With no file, :func:`default_config` is the embedded default: state in
``./var``, a generated CA and server certificate, one forward TLS listener on
127.0.0.1:24224 and the ``events`` table at ``<state>/lake/events``. Every
key, its unit and its default is listed in ``docs/limits.md`` (rendered from
these dataclasses by :mod:`appliance.config_reference`); ``docs/configuration.md``
and the protocol pages explain them.

Errors name the key and, when it can be found, the line of the file
(:mod:`appliance.toml_binder` builds the dataclasses from the TOML).

This module sits below everything that reads it: it imports only
:mod:`appliance.defaults` and the binder, never a codec, the lake, trio or
an auth library, so reading a config loads none of them. A codec's limits
and the lake writer's settings are taken from a section with
:func:`settings_from`; both sides take their defaults from
:mod:`appliance.defaults` (docs/decisions.md, 27-28).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from appliance import defaults
from appliance.config_env import Substitution, expand, read_limited
from appliance.toml_binder import Binder, BindError, KeyPath, Tagged

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from auth.settings import AuthSettings

__all__ = [
    "AdminConfig",
    "AuthConfig",
    "Config",
    "ConfigError",
    "CourierListenerConfig",
    "ForwardListenerConfig",
    "LakeConfig",
    "ListenerConfig",
    "LogConfig",
    "LogjamListenerConfig",
    "LumberjackListenerConfig",
    "MaintenanceConfig",
    "RetentionConfig",
    "RetentionRule",
    "SparkConfig",
    "TlsConfig",
    "WalConfig",
    "WebSocketListenerConfig",
    "available_cores",
    "default_config",
    "is_bind",
    "load_config",
    "load_config_sources",
    "parse_config",
    "parse_config_sources",
    "resolve_workers",
    "settings_from",
]

DEFAULT_STATE_DIR: Final = Path("var")
DEFAULT_FORWARD_BIND: Final = "127.0.0.1:24224"
#: Seconds a client has to finish the TLS handshake.
DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECONDS: Final = 10.0
#: Seconds a connection may stay silent before it is closed.
DEFAULT_IDLE_TIMEOUT_SECONDS: Final = 300.0
#: Open connections per listener; further ones are accepted and closed at once.
DEFAULT_MAX_CONNECTIONS: Final = 1024
#: Open connections per listener from one client IP address (behind a load
#: balancer every client has its address: raise it there).
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: Final = 64
#: Seconds from a request's first byte to its last (slow senders).
DEFAULT_REQUEST_TIMEOUT_SECONDS: Final = 60.0
#: Bytes asked of the socket per read.
DEFAULT_READ_SIZE_BYTES: Final = 256 * 1024
#: Seconds a shutdown waits for in-flight batches to commit and be acked.
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS: Final = 30.0


class ConfigError(Exception):
    """The configuration is invalid; ``str()`` names the key and line."""


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, at least 1.

    The affinity, not the machine's count: systemd's ``CPUAffinity=``, a
    container's cpuset or ``taskset`` narrow it (a CPU quota such as
    ``CPUQuota=`` does not; docs/configuration.md#top-level).
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def resolve_workers(workers: int | Literal["auto"]) -> int:
    """The number of processes ``workers`` asks for: ``"auto"`` is one per available core.

    At most :data:`~appliance.defaults.MAX_WORKERS`; a one-core machine runs
    one process, with no supervisor (docs/decisions.md#processes-and-idle-memory).
    """
    if workers == "auto":
        return min(available_cores(), defaults.MAX_WORKERS)
    return workers


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``: level and line format of the structured log on stderr."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["logfmt", "json"] = "logfmt"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``[tls]``: the server certificate. Empty means the generated one."""

    cert_file: Path | None = None
    key_file: Path | None = None
    #: Extra DNS names or IP addresses for the generated server certificate.
    server_names: list[str] = field(default_factory=list)
    #: CA that signs client certificates. Default: the appliance's own CA.
    client_ca_file: Path | None = None
    #: CRL checked at every client handshake. Default: the appliance's own CRL
    #: (with the appliance's CA); none with an operator's client CA unless given.
    crl_file: Path | None = None


@dataclass(frozen=True, slots=True)
class LakeConfig:
    """``[lake]``: where the ``events`` table lives and how commits are grouped."""

    #: Table location: a directory, or an object-store URI. Default <state>/lake/events.
    path: str | None = None
    #: deltalake storage options (credentials, region, endpoint).
    storage_options: dict[str, str] = field(default_factory=dict)
    #: When a batch is acknowledged: "wal" once it is durable in the write-ahead log
    #: (milliseconds; committed to the table within commit_interval_seconds), "commit"
    #: once its rows are in a Delta commit (docs/wal.md, "Two ack modes").
    ack: Literal["wal", "commit"] = defaults.LAKE_ACK
    #: ack = "wal": seconds between commits from the log to the table (sooner at commit_max_bytes).
    commit_interval_seconds: float = defaults.LAKE_COMMIT_INTERVAL_SECONDS
    #: ack = "commit": rows that seal a commit group.
    commit_max_rows: int = defaults.LAKE_COMMIT_MAX_ROWS
    #: Bytes that make a commit: ack = "commit", of a group's rows (strings as copied onto
    #: each row, plus a per-row overhead); ack = "wal", of log records waiting.
    commit_max_bytes: int = defaults.LAKE_COMMIT_MAX_BYTES
    #: ack = "commit": seconds a commit group stays open, the floor of ack latency.
    commit_max_delay_seconds: float = defaults.LAKE_COMMIT_MAX_DELAY_SECONDS
    #: ack = "commit": batches waiting between connections and the writer; when full,
    #: connections stop reading (ack = "wal": the log's max_bytes does that).
    queue_blocks: int = defaults.LAKE_QUEUE_BLOCKS
    #: First wait after a failed commit, in seconds (doubles each time).
    retry_initial_seconds: float = defaults.LAKE_RETRY_INITIAL_SECONDS
    #: Longest wait between retries, in seconds; retries never stop, acks wait.
    retry_max_seconds: float = defaults.LAKE_RETRY_MAX_SECONDS
    #: Seconds committed batch ids are remembered for dedupe (seeded from the table at start).
    dedupe_window_seconds: float = defaults.LAKE_DEDUPE_WINDOW_SECONDS
    #: Most batch ids remembered (this node's and, on a shared table, the other writers':
    #: about 150 bytes each).
    dedupe_max_keys: int = defaults.LAKE_DEDUPE_MAX_KEYS
    #: Seconds this node's claim on its app id lasts without a commit (one writer per app id).
    lease_seconds: float = defaults.LAKE_LEASE_SECONDS
    #: Refuse new batches (no ack, a "disk nearly full" reason) while the table's
    #: filesystem has less free space than min_free_bytes or min_free_percent;
    #: local tables only (object storage has no free-space figure).
    disk_guard: bool = True
    #: Free bytes the table's filesystem keeps; below them, new batches are refused.
    min_free_bytes: int = defaults.DISK_MIN_FREE_BYTES
    #: Free share of the table's filesystem, in percent, kept likewise (the larger wins).
    min_free_percent: float = defaults.DISK_MIN_FREE_PERCENT
    #: Whether other processes write this table too. Accepted so that older files
    #: still load; it changes nothing since every commit is checked against the
    #: batches other writers' commits name (docs/fleet.md, "Exactly once across writers").
    shared: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        if not 0 <= self.min_free_percent < 100:
            raise ValueError("min_free_percent must be below 100")
        if self.commit_interval_seconds <= 0:
            raise ValueError("commit_interval_seconds must be greater than 0")


@dataclass(frozen=True, slots=True)
class WalConfig:
    """``[wal]``: the write-ahead log, ``<state_dir>/wal`` (``[lake] ack = "wal"``; docs/wal.md)."""

    #: A segment file is closed before it would exceed this many bytes (at least 4096).
    segment_bytes: int = defaults.WAL_SEGMENT_BYTES
    #: Largest record (one batch, encoded) the log takes; a larger batch is refused.
    max_record_bytes: int = defaults.WAL_MAX_RECORD_BYTES
    #: The cap on the log's files: at the cap, connections wait (stop reading) for the
    #: table to catch up, and /readyz says not ready. At least twice the larger of the two above.
    max_bytes: int = defaults.WAL_MAX_BYTES
    #: Most uncommitted batches with an id (each held in memory for dedupe as a 16-byte
    #: digest, about 150 bytes whatever the id's length).
    max_keys: int = defaults.WAL_MAX_KEYS
    #: Longest a busy log waits for more appends before one fdatasync, in seconds (at most 0.05).
    flush_delay_seconds: float = defaults.WAL_FLUSH_DELAY_SECONDS
    #: Pending bytes that start a write and fdatasync at once.
    flush_bytes: int = defaults.WAL_FLUSH_BYTES
    #: Most bytes one write and fdatasync takes.
    group_max_bytes: int = defaults.WAL_GROUP_MAX_BYTES
    #: Longest a batch waits for room under max_bytes before its connection is closed, in seconds.
    full_wait_seconds: float = defaults.WAL_FULL_WAIT_SECONDS
    #: Bytes of memory for uncommitted records' decoded blocks, kept for the next commit
    #: (no read back from disk); half full, it starts a commit once an eighth of
    #: commit_max_bytes waits (docs/wal.md, "The cache"); 0: off.
    cache_bytes: int = defaults.WAL_CACHE_BYTES

    def __post_init__(self) -> None:
        defaults.check_wal(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    """``[maintenance]``: the service's schedules for the table's upkeep (docs/maintenance.md)."""

    #: Run the schedules at all (``appliance table ...`` works either way).
    enabled: bool = True
    compact_interval_seconds: float = defaults.MAINTENANCE_COMPACT_INTERVAL_SECONDS
    checkpoint_interval_seconds: float = defaults.MAINTENANCE_CHECKPOINT_INTERVAL_SECONDS
    vacuum_interval_seconds: float = defaults.MAINTENANCE_VACUUM_INTERVAL_SECONDS
    #: Hours replaced files are kept; at least 168 unless explicitly allowed below.
    vacuum_retention_hours: int = defaults.VACUUM_RETENTION_HOURS
    #: The override for a retention under the 168 h floor.
    allow_short_vacuum_retention: bool = False
    #: Size compaction aims for, per file.
    target_file_bytes: int = defaults.MAINTENANCE_TARGET_FILE_BYTES
    #: One maintainer at a time on a shared table: "auto" (tables on object storage),
    #: "on" or "off" (docs/fleet.md).
    lease: Literal["auto", "on", "off"] = "auto"
    #: Seconds a node's claim of the maintenance lease keeps the other nodes away.
    lease_seconds: float = defaults.MAINTENANCE_LEASE_SECONDS

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        defaults.check_retention(
            self.vacuum_retention_hours, allow_short=self.allow_short_vacuum_retention
        )


#: Protocol names a retention rule may name.
RETENTION_PROTOCOLS: Final = ("forward", "lumberjack", "courier", "logjam", "websocket")


@dataclass(frozen=True, slots=True)
class RetentionRule:
    """A ``[[retention.rules]]`` entry: another age limit for a tag prefix and/or protocol."""

    #: Days events matching this rule are kept (the first matching rule wins); required.
    max_age_days: int = 0
    #: Events whose tag starts with this (case-sensitive); none: any tag.
    tag_prefix: str | None = None
    #: Events of this protocol (forward, lumberjack, courier, logjam, websocket); none: any.
    protocol: str | None = None

    def __post_init__(self) -> None:
        if self.max_age_days <= 0:
            raise ValueError("a retention rule needs max_age_days (whole days, at least 1)")
        if self.tag_prefix is None and self.protocol is None:
            raise ValueError("a retention rule needs a tag_prefix or a protocol")
        if self.tag_prefix == "":
            raise ValueError("tag_prefix cannot be empty (leave it out to match every tag)")
        if self.tag_prefix is not None and "\x00" in self.tag_prefix:
            raise ValueError("tag_prefix cannot contain a NUL character")
        if self.protocol is not None and self.protocol not in RETENTION_PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {', '.join(RETENTION_PROTOCOLS)}, not {self.protocol!r}"
            )


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """``[retention]``: how long events are kept (docs/maintenance.md, "Retention")."""

    #: Days events are kept: a day's partition goes once event_date < today (UTC)
    #: minus this. None (the default): kept forever, unless a rule says otherwise.
    max_age_days: int | None = None
    #: Other limits per tag prefix and/or protocol, first match wins
    #: (``[[retention.rules]]`` with max_age_days, tag_prefix, protocol).
    rules: list[RetentionRule] = field(default_factory=list)
    #: Seconds between retention rounds in the service (with [maintenance] enabled).
    interval_seconds: float = defaults.RETENTION_INTERVAL_SECONDS

    @property
    def enabled(self) -> bool:
        """Whether anything ever expires."""
        return self.max_age_days is not None or bool(self.rules)


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """``[spark]``: how ``appliance sql`` and ``appliance spark run`` reach Spark.

    See docs/spark.md.
    """

    #: Spark Connect URL (``sc://host:port``); None means a classic local session
    #: configured with delta-spark. ``--remote`` overrides it.
    remote: str | None = None
    #: Directory or URI under which derived tables live (``<derived_path>/<name>``).
    #: Default: <state>/lake (see :meth:`Config.derived_table_uri`).
    derived_path: str | None = None
    #: Master of the classic local session.
    classic_master: str = "local[*]"
    #: Classic session: "download" Delta's jars once (spark.jars.packages), or
    #: "classpath" when they are already on Spark's classpath.
    classic_delta_jars: Literal["download", "classpath"] = "download"

    def __post_init__(self) -> None:
        if self.remote is not None and not self.remote.startswith("sc://"):
            raise ValueError(
                f"remote must be a Spark Connect URL sc://host:port, not {self.remote!r}"
            )


#: Where the admin HTTP listener (metrics, health) listens by default.
DEFAULT_ADMIN_BIND: Final = "127.0.0.1:9880"


def is_bind(value: str) -> bool:
    """Whether ``value`` is ``host:port`` with a port from 0 to 65535.

    Port 0 asks the system for a free port (tests do); the listener reports
    the port it got (``service.ready`` in the log, ``Running.ports`` of the service).
    """
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 0 <= int(port) < 65536):
        return False
    try:
        # What the resolver does to a name first (trio.socket.getaddrinfo):
        # a host it cannot encode (an empty label, one over 63 characters)
        # would fail the bind with a UnicodeError, which is not an OSError.
        host.encode("idna")
    except UnicodeError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a bind's host part) can only be reached from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or a wildcard): it may resolve to anything


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """``[admin]``: the HTTP listener of ``/metrics``, ``/livez`` and ``/readyz``.

    See docs/observability.md. Off the loopback interface it needs TLS and a
    bearer token: the service refuses to start otherwise.
    """

    #: Serve the admin endpoints (and count the metrics) at all.
    enabled: bool = True
    #: host:port of the admin listener; loopback unless TLS and a token are set.
    bind: str = DEFAULT_ADMIN_BIND
    #: HTTPS with the appliance's server certificate ([tls], or the generated one).
    tls: bool = False
    #: File (0600) holding the bearer token every request must send
    #: (`Authorization: Bearer ...`); unset: no token (loopback only).
    token_file: Path | None = None

    def __post_init__(self) -> None:
        if not is_bind(self.bind):
            raise ValueError(f"bind must be host:port, not {self.bind!r}")
        if self.enabled and not self.loopback and (not self.tls or self.token_file is None):
            raise ValueError(
                f"bind {self.bind!r} is not a loopback address: the admin endpoints need "
                "tls = true and a token_file there (or bind to 127.0.0.1)"
            )

    @property
    def host(self) -> str:
        """The host part of ``bind`` (brackets of an IPv6 literal removed)."""
        return self.bind.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        """The port part of ``bind``."""
        return int(self.bind.rsplit(":", 1)[1])

    @property
    def loopback(self) -> bool:
        """Whether the listener is reachable from this machine only."""
        return is_loopback_host(self.host)


#: URL schemes ``[auth] database_url`` accepts (SQLAlchemy dialect+driver).
AUTH_DATABASE_SCHEMES: Final = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``[auth]``: the credential database and the key that encrypts its secrets."""

    #: SQLAlchemy URL: ``sqlite:///PATH`` or ``postgresql+psycopg://USER:PASS@HOST/DB``.
    #: Default: SQLite at <state>/auth/auth.db (see :attr:`Config.auth_database_url`).
    database_url: str | None = None
    #: Key file (0600) that encrypts passwords and shared keys. Default <state>/auth/secret.key.
    secret_key_file: Path | None = None


@dataclass(frozen=True)
class ListenerConfig:
    """What every ``[[listeners]]`` entry has; each protocol adds its own keys."""

    protocol: str = ""
    #: Unique name of the listener, used in logs.
    name: str = ""
    #: host:port to listen on; port 0 takes any free port (the log's
    #: service.ready line names it).
    bind: str = ""
    #: TLS is on unless a listener says otherwise (docs/decisions.md).
    tls: bool = True
    #: Client certificates: "off", "optional" or "required" (mutual TLS).
    client_auth: Literal["off", "optional", "required"] = "off"
    #: Open connections; more are accepted and closed at once.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Open connections from one client IP address (raise it behind a load balancer).
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    #: Seconds a client has to finish the TLS handshake.
    tls_handshake_timeout_seconds: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECONDS
    #: Seconds of silence before a connection is closed.
    idle_timeout_seconds: float = DEFAULT_IDLE_TIMEOUT_SECONDS
    #: Seconds from a request's first byte to its last (a frame, for Lumberjack).
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    #: Bytes the waiting requests of one connection may hold before it stops reading.
    max_pending_bytes: int = defaults.LISTENER_MAX_PENDING_BYTES
    #: Requests of one connection awaiting their commit before it stops reading (a guard).
    max_pending_acks: int = defaults.LISTENER_MAX_PENDING_ACKS
    #: Bytes asked of the socket per read.
    read_size_bytes: int = DEFAULT_READ_SIZE_BYTES
    #: Behind a TCP load balancer: every connection starts with a PROXY protocol
    #: header (v1 or v2) naming the client (docs/proxy-protocol.md).
    proxy_protocol: bool = False
    #: Networks (CIDR) of the balancers allowed to connect when proxy_protocol is on.
    trusted_proxies: list[str] = field(default_factory=list)
    #: Seconds a connection has to deliver its whole PROXY header.
    proxy_header_timeout_seconds: float = defaults.PROXY_HEADER_TIMEOUT_SECONDS
    #: Share the port with other appliance processes on this machine (SO_REUSEPORT):
    #: the kernel spreads connections over them (processes started by hand; the
    #: workers of one service share the socket their supervisor binds, docs/performance.md).
    reuse_port: bool = False

    def __post_init__(self) -> None:
        if self.proxy_protocol and not self.trusted_proxies:
            raise ValueError(
                "proxy_protocol needs trusted_proxies: the networks of the balancers "
                "allowed to name clients"
            )
        if self.trusted_proxies and not self.proxy_protocol:
            raise ValueError("trusted_proxies does nothing without proxy_protocol = true")
        for cidr in self.trusted_proxies:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"trusted_proxies: {exc}") from None
        if self.proxy_header_timeout_seconds <= 0:
            raise ValueError("proxy_header_timeout_seconds must be positive")

    @property
    def host(self) -> str:
        """The host part of ``bind`` (brackets of an IPv6 literal removed)."""
        return self.bind.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        """The port part of ``bind``."""
        return int(self.bind.rsplit(":", 1)[1])

    def sockets(self) -> list[tuple[str, str]]:
        """``(key, host:port)`` of every socket this listener binds."""
        return [("bind", self.bind)]


@dataclass(frozen=True)
class ForwardListenerConfig(ListenerConfig):
    """A ``[[listeners]]`` entry with ``protocol = "forward"``."""

    protocol: Literal["forward"] = "forward"
    name: str = "forward"
    bind: str = DEFAULT_FORWARD_BIND
    #: Answer UDP heartbeats on the same port (spec "Heartbeat Message").
    udp_heartbeat: bool = True
    #: The forward handshake: "off", "shared_key", or "users" (shared key and
    #: username/password), checked against the auth database (docs/auth.md).
    security: Literal["off", "shared_key", "users"] = "off"
    #: Admit sources outside every client network (in_forward's allow_anonymous_source).
    allow_anonymous_source: bool = True
    #: The server_hostname of PONG; default: this machine's FQDN.
    self_hostname: str | None = None
    #: Seconds a client has, after TLS, to complete the HELO/PING/PONG handshake.
    handshake_timeout_seconds: float = 10.0
    #: Failed handshakes from one address with one username before that pair must wait
    #: (brute-force protection); an address over all usernames, and a username over
    #: all addresses, get 4 times as many (docs/security.md, "Guessing passwords").
    free_failed_handshakes: int = 3
    #: First wait after those, in seconds; doubles with each further failure.
    failed_handshake_backoff_seconds: float = 2.0
    #: Longest wait, in seconds.
    failed_handshake_max_backoff_seconds: float = 600.0
    #: Largest request (one msgpack array or JSON value), in bytes.
    max_request_bytes: int = defaults.FORWARD_MAX_REQUEST_BYTES
    #: Largest decompressed entries of a CompressedPackedForward request, in bytes.
    max_decompressed_bytes: int = defaults.FORWARD_MAX_DECOMPRESSED_BYTES
    #: Most events in one request.
    max_events_per_request: int = defaults.FORWARD_MAX_EVENTS_PER_REQUEST


#: Log Courier's own examples listen on 12345; operators' configs carry it.
DEFAULT_COURIER_BIND: Final = "127.0.0.1:12345"
#: The Beats/Logstash default port.
DEFAULT_LUMBERJACK_BIND: Final = "127.0.0.1:5044"
#: Seconds between keepalive acks while a batch waits for its commit.
DEFAULT_KEEPALIVE_SECONDS: Final = 5.0


@dataclass(frozen=True)
class CourierListenerConfig(ListenerConfig):
    """A ``[[listeners]]`` entry with ``protocol = "courier"`` (Log Courier)."""

    protocol: Literal["courier"] = "courier"
    name: str = "courier"
    bind: str = DEFAULT_COURIER_BIND
    #: Largest JDAT/EVNT message (compressed), in bytes.
    max_payload_bytes: int = defaults.COURIER_MAX_PAYLOAD_BYTES
    #: Largest decompressed payload, in bytes.
    max_decompressed_bytes: int = defaults.COURIER_MAX_DECOMPRESSED_BYTES
    #: Largest single event inside a payload, in bytes. Log Courier's own
    #: "max line bytes" is 1 MiB; JSON escaping and fields go a little over.
    max_event_bytes: int = defaults.COURIER_MAX_EVENT_BYTES
    #: Most events one payload may carry.
    max_events: int = defaults.COURIER_MAX_EVENTS
    #: Memory one payload's rows may hold as the codec counts it, in bytes
    #: (records, tags and hosts as text, plus a per-row overhead).
    max_payload_memory_bytes: int = defaults.COURIER_MAX_PAYLOAD_MEMORY_BYTES
    #: Seconds between partial ACKNs while a payload waits for its commit (spec: at most 5).
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    #: Tag of the events (Log Courier has no tag; a "type" field overrides it when set).
    tag: str = "courier"


@dataclass(frozen=True)
class LumberjackListenerConfig(ListenerConfig):
    """A ``[[listeners]]`` entry with ``protocol = "lumberjack"`` (Beats, v1 and v2)."""

    protocol: Literal["lumberjack"] = "lumberjack"
    name: str = "lumberjack"
    bind: str = DEFAULT_LUMBERJACK_BIND
    #: Largest window a client may announce, in events.
    max_window_size: int = defaults.LUMBERJACK_MAX_WINDOW_SIZE
    #: Largest frame, in bytes (a C frame's compressed payload counts).
    max_frame_bytes: int = defaults.LUMBERJACK_MAX_FRAME_BYTES
    #: Largest decompressed C frame, in bytes.
    max_decompressed_bytes: int = defaults.LUMBERJACK_MAX_DECOMPRESSED_BYTES
    #: Largest window, in bytes of its data frames after decompression: what an
    #: unfinished window may make the appliance hold.
    max_window_bytes: int = defaults.LUMBERJACK_MAX_WINDOW_BYTES
    #: Seconds between keepalive acks while a window waits for its commit.
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    #: Record fields whose value becomes the tag, first present wins (dotted paths).
    tag_fields: list[str] = field(default_factory=lambda: list(defaults.LUMBERJACK_TAG_FIELDS))
    #: Tag when no tag field is present.
    tag: str = "lumberjack"


#: The logjam-device's ROUTER and PULL ports (skaes/logjam-tools src/logjam-device.c).
DEFAULT_LOGJAM_BIND: Final = "127.0.0.1:9604"
DEFAULT_LOGJAM_PULL_BIND: Final = "127.0.0.1:9605"


@dataclass(frozen=True)
class LogjamListenerConfig(ListenerConfig):
    """A ``[[listeners]]`` entry with ``protocol = "logjam"`` (ZeroMQ, docs/logjam.md).

    ZeroMQ has no TLS: the listener is encrypted and authenticated with CURVE
    (client keys from ``appliance curve``) unless ``curve = false`` says
    otherwise. ``tls`` must stay false and ``client_auth`` "off"; the other
    TCP settings of every listener (``max_connections``,
    ``max_connections_per_address``, ``tls_handshake_timeout_seconds``,
    ``idle_timeout_seconds``, ``request_timeout_seconds``, ``max_pending_bytes``,
    ``max_pending_acks``, ``read_size_bytes``) do not apply to ZeroMQ sockets.
    """

    protocol: Literal["logjam"] = "logjam"
    name: str = "logjam"
    #: The ROUTER socket: requests (answered 202/400), pings and async data.
    bind: str = DEFAULT_LOGJAM_BIND
    #: ZeroMQ has no TLS; CURVE plays its part.
    tls: bool = False
    #: The PULL socket for async data; "" (TOML has no null) disables it.
    pull_bind: str | None = DEFAULT_LOGJAM_PULL_BIND
    #: CURVE encryption with client keys authorised in the auth database;
    #: false means plain ZMTP, for a trusted network only.
    curve: bool = True
    #: Largest body frame (compressed), in bytes; a larger one gets 400.
    max_body_bytes: int = defaults.LOGJAM_MAX_BODY_BYTES
    #: Largest decompressed body, in bytes.
    max_decompressed_bytes: int = defaults.LOGJAM_MAX_DECOMPRESSED_BYTES
    #: Most JSON containers (``{`` and ``[`` bytes) in one body: parsing
    #: ``[{},{},...]`` costs about 24 times its bytes as Python objects.
    max_json_containers: int = defaults.LOGJAM_MAX_JSON_CONTAINERS
    #: ZMQ_MAXMSGSIZE: a frame over this many bytes makes libzmq drop the peer
    #: before the appliance sees it (no reply). At least max_body_bytes.
    max_message_bytes: int = defaults.LOGJAM_MAX_BODY_BYTES + 64 * 1024
    #: ZMQ_RCVHWM: messages libzmq queues per peer while the appliance is not reading.
    rcvhwm: int = 1000
    #: ZMQ_SNDHWM: replies libzmq queues per peer; past it a reply is dropped.
    sndhwm: int = 1000
    #: Requests of all peers that may wait for their commit before the listener stops reading.
    max_pending_replies: int = 10_000
    #: ZMQ_HANDSHAKE_IVL: seconds a peer has to finish the ZMTP/CURVE handshake.
    handshake_timeout_seconds: float = 10.0
    #: ZMQ_HEARTBEAT_IVL and ZMQ_HEARTBEAT_TIMEOUT: a peer that answers no
    #: heartbeat for heartbeat_timeout_seconds is dropped.
    heartbeat_interval_seconds: float = 30.0
    #: Seconds without an answer to heartbeats before a peer is dropped.
    heartbeat_timeout_seconds: float = 90.0
    #: The fqdn of the ping reply; default: this machine's FQDN.
    self_hostname: str | None = None

    def __post_init__(self) -> None:
        if self.proxy_protocol:
            raise ValueError("proxy_protocol does not apply to logjam (ZeroMQ, not a TCP stream)")
        super().__post_init__()
        if self.tls:
            raise ValueError("tls does not apply to logjam (ZeroMQ has no TLS): use curve")
        if self.client_auth != "off":
            raise ValueError("client_auth does not apply to logjam: CURVE keys authenticate")
        if self.pull_bind == "":
            object.__setattr__(self, "pull_bind", None)
        if self.pull_bind is not None:
            if not is_bind(self.pull_bind):
                raise ValueError(f'pull_bind must be host:port or "", not {self.pull_bind!r}')
            if self.pull_bind == self.bind and not self.pull_bind.endswith(":0"):
                raise ValueError("pull_bind must differ from bind")
        if self.max_message_bytes < self.max_body_bytes:
            raise ValueError("max_message_bytes must be at least max_body_bytes")

    @property
    def pull_host(self) -> str | None:
        """The host part of ``pull_bind`` (None when the PULL socket is off)."""
        return None if self.pull_bind is None else self.pull_bind.rsplit(":", 1)[0].strip("[]")

    @property
    def pull_port(self) -> int | None:
        """The port part of ``pull_bind`` (None when the PULL socket is off)."""
        return None if self.pull_bind is None else int(self.pull_bind.rsplit(":", 1)[1])

    def sockets(self) -> list[tuple[str, str]]:
        """The ROUTER socket's ``bind`` and, unless off, the PULL socket's ``pull_bind``."""
        extra = [] if self.pull_bind is None else [("pull_bind", self.pull_bind)]
        return [*super().sockets(), *extra]


#: The WebSocket listener's port (the usual alternative HTTPS port).
DEFAULT_WEBSOCKET_BIND: Final = "127.0.0.1:8443"
#: Events a live-tail connection may have waiting before further ones are dropped.
DEFAULT_TAIL_QUEUE_EVENTS: Final = 10_000
#: Messages one ingest connection may send per second (a burst of that many is allowed).
DEFAULT_MAX_MESSAGES_PER_SECOND: Final = 100


@dataclass(frozen=True)
class WebSocketListenerConfig(ListenerConfig):
    """A ``[[listeners]]`` entry with ``protocol = "websocket"`` (docs/websocket.md).

    ``/ingest`` takes JSON messages from browsers and JavaScript senders;
    ``/tail`` streams committed events to admin tokens. ``tls_handshake_timeout_seconds``
    also bounds the WebSocket (HTTP upgrade) handshake, ``idle_timeout_seconds``
    an ingest connection that sends nothing, ``max_pending_bytes`` and
    ``max_pending_acks`` the messages of one connection waiting for their ack.
    """

    protocol: Literal["websocket"] = "websocket"
    name: str = "websocket"
    bind: str = DEFAULT_WEBSOCKET_BIND
    #: Origin header values admitted (``https://app.example:8080``); ``"*"``
    #: admits any. A request without Origin (not a browser) is not checked;
    #: empty list: every browser origin is refused.
    allowed_origins: list[str] = field(default_factory=list)
    #: Largest message, in bytes (characters of a text message); a larger one
    #: closes the connection with code 1009.
    max_message_bytes: int = defaults.WEBSOCKET_MAX_MESSAGE_BYTES
    #: Events in one ingest message.
    max_events_per_message: int = defaults.WEBSOCKET_MAX_EVENTS_PER_MESSAGE
    #: JSON objects and arrays in one message (counted as ``{`` and ``[``): parsing
    #: ``[[],[],...]`` costs tens of times its bytes as Python objects.
    max_containers_per_message: int = defaults.WEBSOCKET_MAX_CONTAINERS_PER_MESSAGE
    #: Messages per second per ingest connection; more get an error and are not written.
    max_messages_per_second: int = DEFAULT_MAX_MESSAGES_PER_SECOND
    #: Events a tail connection may have waiting; past it events are dropped and counted.
    tail_queue_events: int = DEFAULT_TAIL_QUEUE_EVENTS


_LISTENER_TYPES: Final[dict[str, type[Any]]] = {
    "forward": ForwardListenerConfig,
    "courier": CourierListenerConfig,
    "lumberjack": LumberjackListenerConfig,
    "logjam": LogjamListenerConfig,
    "websocket": WebSocketListenerConfig,
}


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration."""

    state_dir: Path = DEFAULT_STATE_DIR
    #: Stable id of this appliance node (Delta app transaction id). Default:
    #: generated once and kept in <state>/node-id.
    node_id: str | None = None
    #: Seconds a stop waits for in-flight batches to commit and be acked.
    shutdown_timeout_seconds: float = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
    #: Bytes of memory the requests being decoded may claim together, each at its
    #: worst case, in the whole process; a request that does not fit waits (docs/limits.md).
    decode_budget_bytes: int = defaults.DECODE_BUDGET_BYTES
    #: Appliance processes to run (docs/performance.md): ``"auto"``, one per
    #: available core (:func:`resolve_workers`), or a number. 1 runs the service
    #: in this process; more make it a supervisor of that many workers, which
    #: share the listeners' ports, the table, the PKI and the auth database.
    workers: int | Literal["auto"] = "auto"
    log: LogConfig = field(default_factory=LogConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    lake: LakeConfig = field(default_factory=LakeConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    listeners: list[ListenerConfig] = field(default_factory=lambda: [ForwardListenerConfig()])
    #: The file this configuration was read from (None: the embedded default);
    #: a reload (SIGHUP) reads it again.
    source: Path | None = None
    #: Which worker of ``workers`` this process is (``appliance serve --worker``, set
    #: by the supervisor; never in a file): a reload applies
    #: :func:`appliance.node.worker_config` again.
    worker: int | None = None

    def __post_init__(self) -> None:
        if self.workers != "auto" and not 1 <= self.workers <= defaults.MAX_WORKERS:
            raise ValueError(f'workers must be "auto" or within 1..{defaults.MAX_WORKERS}')
        for listener in self.listeners:
            if isinstance(listener, ForwardListenerConfig):
                # Every request within a listener's limits must fit the budget.
                defaults.check_decode_budget(
                    self.decode_budget_bytes,
                    listener.max_request_bytes,
                    listener.max_decompressed_bytes,
                    listener.max_events_per_request,
                )

    @property
    def worker_count(self) -> int:
        """How many appliance processes serve: ``workers`` with ``"auto"`` resolved."""
        return resolve_workers(self.workers)

    def worker_state_dir(self, index: int) -> Path:
        """The state directory of worker ``index`` (its node id and write-ahead log)."""
        return self.state_dir / "workers" / str(index)

    @property
    def home_dir(self) -> Path:
        """This appliance's own state directory: for a worker, its supervisor's.

        Where what the workers share lives beside the PKI: the Logjam CURVE
        keypair and the maintenance lock the CLI's table commands take.
        """
        return self.state_dir.parent.parent if self.worker is not None else self.state_dir

    @property
    def table_uri(self) -> str:
        """Where the ``events`` table lives."""
        return self.lake.path or str(self.state_dir / "lake" / "events")

    def derived_table_uri(self, name: str) -> str:
        """Where the derived table ``name`` lives (``[spark] derived_path``/name)."""
        base = self.spark.derived_path or str(self.state_dir / "lake")
        return f"{base.rstrip('/')}/{name}"

    @property
    def pki_dir(self) -> Path:
        """Where the generated CA and server certificate live."""
        return self.state_dir / "pki"

    @property
    def auth_settings(self) -> AuthSettings:
        """How to open the auth database (:func:`auth.database.open_database` takes it)."""
        # Imported here: reading a config loads nothing of auth (tests/appliance/test_config.py).
        from auth.settings import AuthSettings

        return AuthSettings.under(self.state_dir, self.auth.database_url, self.auth.secret_key_file)

    @property
    def auth_database_url(self) -> str:
        """The credential database's SQLAlchemy URL (SQLite under the state dir by default)."""
        return self.auth_settings.url

    @property
    def auth_secret_key_file(self) -> Path:
        """The key file that encrypts the credential database's secrets."""
        return self.auth_settings.secret_key_file


def default_config() -> Config:
    """The embedded default: what ``appliance serve`` runs with no file."""
    return Config()


# -- what lower layers take from a section -------------------------------------


_Settings = TypeVar("_Settings", bound="DataclassInstance")


def settings_from(section: object, settings_type: type[_Settings]) -> _Settings:
    """``settings_type`` with every field taken from ``section``'s key of the same name.

    The one way a lower layer gets its part of the configuration: a codec its
    limits (``settings_from(listener, CourierLimits)``), the lake writer its
    settings (``settings_from(config.lake, WriterSettings)``). Config names
    those keys as the fields they fill and takes their defaults from
    :mod:`appliance.defaults`, as the lower layer does, so the two cannot
    disagree (tests/appliance/test_config.py checks every protocol).

    Raises:
        AttributeError: ``section`` lacks a field of ``settings_type`` (a bug).
        ValueError: ``settings_type`` refuses a value.
    """
    names = [f.name for f in dataclasses.fields(settings_type)]
    return settings_type(**{name: getattr(section, name) for name in names})


# -- loading -------------------------------------------------------------------


def _bind_problem(value: str) -> str | None:
    return None if is_bind(value) else f"must be host:port, not {value!r}"


def parse_config(
    text: str, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> Config:
    """Parse and validate configuration text.

    ``environ``: where ``${NAME}`` references are looked up (default: this
    process's environment; appliance/config_env.py).

    Raises:
        ConfigError: with the file, line and key of the first problem.
    """
    return parse_config_sources(text, source, environ)[0]


def parse_config_sources(
    text: str, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> tuple[Config, list[tuple[str, Substitution]]]:
    """:func:`parse_config`, and which keys took part of their value from where.

    The sources name references (``${DB_PASSWORD}``, ``${file:/run/...}``),
    never the values: ``config check`` prints them.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    env = os.environ if environ is None else environ
    binder = Binder(
        text,
        source,
        tagged={ListenerConfig: Tagged("protocol", "forward", _LISTENER_TYPES)},
        checks={"bind": _bind_problem},
        expand=lambda value: expand(value, env, read_limited),
    )
    if "worker" in data:
        raise ConfigError(f"{source}: worker is set by the supervisor (workers = N), not in a file")
    workers = data.get("workers")
    if isinstance(workers, int) and not 1 <= workers <= defaults.MAX_WORKERS:
        # At its line, not only the file's (Config refuses it too, at no line).
        raise ConfigError(
            binder.where(("workers",), f'must be "auto" or within 1..{defaults.MAX_WORKERS}')
        )
    try:
        config: Config = binder.build(Config, data)
    except BindError as exc:
        raise ConfigError(str(exc)) from None
    names = [listener.name for listener in config.listeners]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{source}: listeners: duplicate name(s): {', '.join(duplicates)}")
    for index, listener in enumerate(config.listeners):
        if isinstance(listener, CourierListenerConfig) and listener.keepalive_seconds > 5:
            # The protocol wants a partial ACKN at least every 5 s while a payload waits.
            raise ConfigError(
                binder.where(("listeners", index, "keepalive_seconds"), "must be at most 5")
            )
        if listener.client_auth != "off" and not listener.tls:
            raise ConfigError(
                binder.where(
                    ("listeners", index, "client_auth"),
                    "needs tls = true (client certificates are TLS)",
                )
            )
    url = config.auth.database_url
    if url is not None and url.partition(":")[0].partition("+")[0] not in AUTH_DATABASE_SCHEMES:
        # The URL may carry a password: the message never repeats it.
        raise ConfigError(
            binder.where(
                ("auth", "database_url"), "must be a sqlite:///PATH or postgresql+psycopg://... URL"
            )
        )
    _check_binds(binder, config.listeners, data.get("listeners"))
    return config, binder.substitutions


def _check_binds(binder: Binder, listeners: list[ListenerConfig], raw: Any) -> None:
    """Two sockets on one address: name both listeners, at the line of the second.

    A wildcard host (``0.0.0.0``, ``::``) takes the port on every address of
    its family; port 0 (any free port) never collides.
    """

    def family(host: str) -> int:  # 0: a name, which may resolve to either family
        if host in ("0.0.0.0", "", "*"):  # noqa: S104 -- a comparison, not a bind
            return 4
        if host == "::" or ":" in host:
            return 6
        return 4 if host.replace(".", "").isdigit() else 0

    def overlap(a: str, b: str) -> bool:
        wild = {"0.0.0.0", "", "*", "::"}  # noqa: S104
        if a == b:
            return True
        if a in wild and b not in wild:
            return family(b) in (0, family(a))
        return b in wild and a not in wild and family(a) in (0, family(b))

    seen: list[tuple[str, str, str]] = []  # host, port, "listener 'a' (bind host:port)"
    for index, listener in enumerate(listeners):
        for key, address in listener.sockets():
            host, _, port = address.rpartition(":")
            host = host.strip("[]")
            this = f"listener {listener.name!r} ({key} {address})"
            for other_host, other_port, other in seen:
                if port != "0" and port == other_port and overlap(host, other_host):
                    message = f"two listeners bind the same address: {this} and {other}"
                    explicit = isinstance(raw, list) and key in raw[index]
                    headers = [
                        number
                        for number, line in enumerate(binder.text.splitlines(), start=1)
                        if line.strip().startswith("[[") and line.strip("[] \t") == "listeners"
                    ]
                    path: KeyPath = ("listeners", index, key)
                    if explicit or index >= len(headers):
                        raise ConfigError(binder.where(path, message))
                    # A default bind: point at the listener's own [[listeners]] header.
                    where = f"{binder.source}:{headers[index]}"
                    raise ConfigError(f"{where}: listeners[{index}].{key}: {message}")
            seen.append((host, port, this))


def load_config(path: Path) -> Config:
    """Read and validate the TOML file at ``path`` (``${NAME}`` from this process's environment)."""
    return load_config_sources(path)[0]


def load_config_sources(path: Path) -> tuple[Config, list[tuple[str, Substitution]]]:
    """:func:`load_config`, and where substituted values came from (``config check``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    config, sources = parse_config_sources(text, str(path))
    return dataclasses.replace(config, source=path), sources
