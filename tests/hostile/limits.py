"""The hostile suite's settings: its service's listeners and limits, waits, addresses.

The limits are small so the suite stays fast; tests/hostile/case.py says how
the memory bound :data:`RSS_GROWTH_BOUND_BYTES` follows from them.
"""

from __future__ import annotations

import itertools

MIB = 1024 * 1024
#: Peak RSS growth allowed during one test (module docstring), in bytes.
RSS_GROWTH_BOUND_BYTES = 384 * MIB
#: Peak RSS growth measured per test (test id -> bytes), for the run's summary.
RSS_GROWTH: dict[str, int] = {}
#: Seconds any single wait of this suite may take before it fails (a liveness
#: bound, never a timing assertion).
WAIT_SECONDS = 60.0
#: Good batches that must be acked after the hostile input was sent.
GOOD_BATCHES_AFTER = 2
#: Events per good batch.
GOOD_EVENTS = 3
#: Seconds between two good batches (keeps the table to a few hundred commits).
GOOD_PAUSE_SECONDS = 0.05

# -- the service's limits (small, so the suite stays fast) ------------------------

MAX_CONNECTIONS_PER_ADDRESS = 4
REQUEST_TIMEOUT_SECONDS = 2
#: A Lumberjack listener whose request deadline is the documented default
#: (docs/lumberjack.md), not :data:`REQUEST_TIMEOUT_SECONDS`.
TRICKLE_LISTENER = "lumberjack_trickle"
TRICKLE_REQUEST_TIMEOUT_SECONDS = 60
TLS_HANDSHAKE_TIMEOUT_SECONDS = 3
FORWARD_MAX_REQUEST_BYTES = 2 * MIB
FORWARD_MAX_DECOMPRESSED_BYTES = 2 * MIB
LUMBERJACK_MAX_FRAME_BYTES = 1 * MIB
LUMBERJACK_MAX_DECOMPRESSED_BYTES = 4 * MIB
LUMBERJACK_MAX_WINDOW_SIZE = 10_000
COURIER_MAX_PAYLOAD_BYTES = 1 * MIB
COURIER_MAX_DECOMPRESSED_BYTES = 4 * MIB
COURIER_MAX_EVENTS = 100_000
LOGJAM_MAX_BODY_BYTES = 1 * MIB
LOGJAM_MAX_DECOMPRESSED_BYTES = 2 * MIB
WEBSOCKET_MAX_MESSAGE_BYTES = 1 * MIB
COURIER_TAG = "courier-default"
LUMBERJACK_TAG = "lumberjack-default"

WEBSOCKET_IDLE_TIMEOUT_SECONDS = 5
#: The proxied listener's header deadline (short: the slow-header test waits it out).
PROXY_HEADER_TIMEOUT_SECONDS = 2
#: The client a good proxied connection's header names (documentation range, RFC 5737).
PROXIED_CLIENT = "192.0.2.44"
_TCP_LIMITS = (
    f"request_timeout_seconds = {REQUEST_TIMEOUT_SECONDS}\n"
    f"tls_handshake_timeout_seconds = {TLS_HANDSHAKE_TIMEOUT_SECONDS}\n"
    f"max_connections_per_address = {MAX_CONNECTIONS_PER_ADDRESS}\n"
)
_TCP_COMMON = "idle_timeout_seconds = 30\n" + _TCP_LIMITS


def listener_bodies() -> dict[str, str]:
    """Every listener of the suite's service (name -> TOML body; ``bind`` is added)."""
    forward_limits = (
        f"udp_heartbeat = false\nmax_request_bytes = {FORWARD_MAX_REQUEST_BYTES}\n"
        f"max_decompressed_bytes = {FORWARD_MAX_DECOMPRESSED_BYTES}\n"
        "max_events_per_request = 100000\n"
    )
    return {
        "forward": 'protocol = "forward"\n' + forward_limits + _TCP_COMMON,
        # Behind a balancer: every connection starts with a PROXY header; the good client
        # (127.0.0.1) and the hostile ones (next_address: 127.1.x.y) are trusted proxies.
        "forward_proxied": 'protocol = "forward"\nproxy_protocol = true\n'
        'trusted_proxies = ["127.0.0.1/32", "127.1.0.0/16"]\n'
        f"proxy_header_timeout_seconds = {PROXY_HEADER_TIMEOUT_SECONDS}\n"
        + forward_limits
        + _TCP_COMMON,
        "forward_secure": 'protocol = "forward"\nsecurity = "shared_key"\n'
        'self_hostname = "appliance.test"\nhandshake_timeout_seconds = 5\n'
        "free_failed_handshakes = 1000\n" + forward_limits + _TCP_COMMON,
        "lumberjack": 'protocol = "lumberjack"\n'
        f"max_frame_bytes = {LUMBERJACK_MAX_FRAME_BYTES}\n"
        f"max_decompressed_bytes = {LUMBERJACK_MAX_DECOMPRESSED_BYTES}\n"
        f"max_window_size = {LUMBERJACK_MAX_WINDOW_SIZE}\n"
        f'keepalive_seconds = 1\ntag = "{LUMBERJACK_TAG}"\n' + _TCP_COMMON,
        # The same with the default request deadline, for a frame sent in thousands of
        # pieces: reading them all takes the service more than REQUEST_TIMEOUT_SECONDS on a
        # busy machine (the deadline runs from a frame's first byte to its last read).
        TRICKLE_LISTENER: 'protocol = "lumberjack"\n'
        f"max_frame_bytes = {LUMBERJACK_MAX_FRAME_BYTES}\n"
        f"max_decompressed_bytes = {LUMBERJACK_MAX_DECOMPRESSED_BYTES}\n"
        f"max_window_size = {LUMBERJACK_MAX_WINDOW_SIZE}\n"
        f'keepalive_seconds = 1\ntag = "{LUMBERJACK_TAG}"\n'
        f"idle_timeout_seconds = 30\nrequest_timeout_seconds = {TRICKLE_REQUEST_TIMEOUT_SECONDS}\n"
        f"tls_handshake_timeout_seconds = {TLS_HANDSHAKE_TIMEOUT_SECONDS}\n"
        f"max_connections_per_address = {MAX_CONNECTIONS_PER_ADDRESS}\n",
        "courier": 'protocol = "courier"\n'
        f"max_payload_bytes = {COURIER_MAX_PAYLOAD_BYTES}\n"
        f"max_decompressed_bytes = {COURIER_MAX_DECOMPRESSED_BYTES}\n"
        f"max_events = {COURIER_MAX_EVENTS}\nmax_payload_memory_bytes = {16 * MIB}\n"
        f'keepalive_seconds = 1\ntag = "{COURIER_TAG}"\n' + _TCP_COMMON,
        "logjam": 'protocol = "logjam"\ntls = false\n'
        'pull_bind = "127.0.0.1:0"\n'
        f"max_body_bytes = {LOGJAM_MAX_BODY_BYTES}\n"
        f"max_decompressed_bytes = {LOGJAM_MAX_DECOMPRESSED_BYTES}\n"
        f"max_message_bytes = {LOGJAM_MAX_BODY_BYTES + 64 * 1024}\n"
        "handshake_timeout_seconds = 5\n",
        "websocket": 'protocol = "websocket"\n'
        f"max_message_bytes = {WEBSOCKET_MAX_MESSAGE_BYTES}\n"
        f"idle_timeout_seconds = {WEBSOCKET_IDLE_TIMEOUT_SECONDS}\n" + _TCP_LIMITS,
    }


# -- addresses ---------------------------------------------------------------------

_addresses = itertools.count(1)


def next_address() -> str:
    """A loopback address no other hostile client of this run has used (127.1.0.1, ...)."""
    n = next(_addresses)
    return f"127.1.{n // 250}.{n % 250 + 1}"
