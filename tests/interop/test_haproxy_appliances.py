"""A real HAProxy in front of two appliances: the table and the client networks see the client.

HAProxy (Debian's package, tests/interop/haproxy.py) runs in TCP mode with
``send-proxy-v2`` and health checks, round robin over two ``appliance
serve`` processes whose forward listeners have ``proxy_protocol = true`` and
trust only HAProxy's address (127.0.0.1). TLS passes through HAProxy: the
clients verify the appliances' certificates. Both appliances share one auth
database, where the client network 127.0.0.2/32 owns the shared key and
anonymous sources are refused (``allow_anonymous_source = false``).

The clients are a minimal forward client of this module (the handshake and
Forward mode with a chunk id, over TLS), bound to chosen loopback source
addresses: 127.0.0.2 (in the client network) and 127.0.0.3 (outside it).
Without the PROXY protocol both would be 127.0.0.1 to the appliances.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from tests.hostile.clients import sha512_hex
from tests.interop.haproxy import Balancer, HAProxy, ensure_haproxy, start_haproxy
from tests.support.cli import run_cli
from tests.support.service import ApplianceProcess, start_appliance

pytestmark = pytest.mark.interop

SHARED_KEY = "haproxy-test-key"
#: In the client network that owns the key.
ALLOWED_CLIENT = "127.0.0.2"
#: Outside every client network (anonymous sources are refused).
OTHER_CLIENT = "127.0.0.3"
#: Connections the allowed client makes through HAProxy (round robin: both appliances).
CONNECTIONS = 4
LISTENER = """security = "shared_key"
allow_anonymous_source = false
proxy_protocol = true
trusted_proxies = ["127.0.0.1/32"]
"""


Fleet = tuple[list[ApplianceProcess], HAProxy]


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[ApplianceProcess], HAProxy]]:
    ensure_haproxy()
    base = tmp_path_factory.mktemp("haproxy-fleet")
    auth = (
        f'[auth]\ndatabase_url = "sqlite:///{base / "auth.db"}"\n'
        f'secret_key_file = "{base / "secret.key"}"\n'
    )
    setup = base / "setup.toml"
    setup.write_text(f'state_dir = "{base / "setup"}"\n{auth}')
    run_cli("db", "upgrade", config=setup, check=True)
    run_cli(
        "key", "add", "relayed", "--secret-stdin", config=setup, stdin=SHARED_KEY + "\n", check=True
    )
    run_cli("client", "add", f"{ALLOWED_CLIENT}/32", "--key", "relayed", config=setup, check=True)
    apps = [start_appliance(base, {"forward": LISTENER}, auth, index=i) for i in range(2)]
    try:
        ports = [app.ports["forward"] for app in apps]
        with start_haproxy(base / "haproxy", Balancer(ports, send_proxy="v2", check=True)) as proxy:
            yield apps, proxy
    finally:
        for app in apps:
            app.stop()


def _context(apps: list[ApplianceProcess]) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for app in apps:  # each appliance has its own CA; HAProxy may pick either
        context.load_verify_locations(cafile=str(app.ca_file))
    return context


def _read(sock: ssl.SSLSocket, unpacker: Any) -> Any:
    while True:
        for message in unpacker:
            return message
        data = sock.recv(65536)
        if not data:
            return None
        unpacker.feed(data)


def send_through(
    apps: list[ApplianceProcess], host: str, port: int, source: str, chunk: str
) -> bool:
    """One forward connection from ``source``: handshake, one chunk; True when it was acked."""
    raw = socket.create_connection((host, port), timeout=30, source_address=(source, 0))
    with _context(apps).wrap_socket(raw, server_hostname="localhost") as sock:
        unpacker = msgpack.Unpacker(raw=False)
        helo = _read(sock, unpacker)
        assert helo is not None
        assert helo[0] == "HELO"
        salt = os.urandom(16).hex().encode()
        digest = sha512_hex(salt, b"relayed-client", helo[1]["nonce"], SHARED_KEY.encode())
        sock.sendall(msgpack.packb(["PING", "relayed-client", salt, digest, "", ""]))
        pong = _read(sock, unpacker)
        if pong is None or pong[1] is not True:
            return False
        entries = [[1_700_000_000, {"chunk": chunk, "source": source}]]
        sock.sendall(msgpack.packb(["haproxy.test", entries, {"chunk": chunk}]))
        ack = _read(sock, unpacker)
        return ack == {"ack": chunk}


def test_the_peer_column_and_client_networks_see_the_client_not_haproxy(fleet) -> None:
    apps, proxy = fleet
    acked = [
        send_through(apps, proxy.host, proxy.port, ALLOWED_CLIENT, f"allowed-{i}")
        for i in range(CONNECTIONS)
    ]
    assert all(acked), proxy.log()
    # The same key from outside the client network: refused at the handshake, by address.
    assert not send_through(apps, proxy.host, proxy.port, OTHER_CLIENT, "other"), proxy.log()

    per_app = [[r for r in app.rows() if r["tag"] == "haproxy.test"] for app in apps]
    assert all(per_app), "round robin reached only one appliance"
    rows = [r for rows in per_app for r in rows]
    assert sorted(r["batch_id"] for r in rows) == [f"allowed-{i}" for i in range(CONNECTIONS)]
    assert all(str(r["peer"]).startswith(f"{ALLOWED_CLIENT}:") for r in rows), rows
    logs = "".join(app.log() for app in apps)
    assert f"peer={OTHER_CLIENT}:" in logs  # the refusal names the real client
    assert "via=127.0.0.1:" in logs  # and says which balancer relayed it
    # HAProxy's health checks (v2 LOCAL headers, then a close) are no TLS failures.
    assert "tls.handshake_failed" not in logs
    assert "connection.failed" not in logs


def test_a_client_that_bypasses_the_balancer_is_refused(fleet) -> None:
    apps, _ = fleet
    app = apps[0]
    raw = socket.create_connection(
        ("127.0.0.1", app.ports["forward"]), timeout=10, source_address=(ALLOWED_CLIENT, 0)
    )
    with raw:
        raw.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed with nothing read: as good
            assert raw.recv(100) == b""
    assert "not a trusted proxy" in app.log()
