"""The admin listener's /metrics, /livez and /readyz, against a real service.

The service runs in-process on loopback with real TLS and a real Delta
table; the clients are plain Python ``ssl`` sockets in worker threads (the
forward client of test_one_writer.send_chunk) and raw sockets for the bad
handshakes. /metrics is scraped over HTTP and parsed with
``prometheus_client.parser``; every count must be exactly what was sent.
"""

from __future__ import annotations

import json
import math
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from appliance import __version__
from appliance.config import AdminConfig, Config, ConfigError, ForwardListenerConfig, parse_config
from appliance.metrics import (
    Instance,
    Metrics,
    WalSample,
    drop_reason_class,
    protocol_error_class,
    refusal_class,
    tls_failure_class,
)
from appliance.service import Running, serve
from tests.faults import read_only_dir
from tests.support.service import running, service_config, table_rows

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

FORWARD = {"listener": "forward", "protocol": "forward"}


def make_config(tmp_path: Path, admin: AdminConfig | None = None, **listener: object) -> Config:
    config = service_config(tmp_path, ForwardListenerConfig, **listener)
    return replace(config, admin=admin or AdminConfig(bind="127.0.0.1:0"))


# -- clients (blocking; run in worker threads) -----------------------------------------------


def http_get(
    port: int, path: str, token: str | None = None, method: str = "GET"
) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> Samples:
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def tls_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


def send_chunk(ca_file: Path, port: int, chunk: str, events: int, bad_times: int = 0) -> object:
    """One PackedForward chunk over TLS (``bad_times`` entries with a string time); the ack."""
    now = int(time.time())
    entries = b"".join(msgpack.packb([now, {"chunk": chunk, "i": i}]) for i in range(events))
    entries += b"".join(msgpack.packb(["not a time", {"bad": i}]) for i in range(bad_times))
    request = msgpack.packb(["metrics.test", entries, {"chunk": chunk, "size": events}])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        tls_context(ca_file).wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(request)
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = tls.recv(65536)
            if not data:
                return None
            unpacker.feed(data)
            for message in unpacker:
                return message


def send_garbage_over_tls(ca_file: Path, port: int) -> bytes:
    """A TLS connection whose first request is not msgpack; what the server sends back."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        tls_context(ca_file).wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(b"\xc1\xc1\xc1\xc1")
        received = b""
        try:
            while data := tls.recv(4096):
                received += data
        except (ssl.SSLError, OSError):
            pass
        return received


def plaintext_client(port: int) -> None:
    """An HTTP request on the TLS port: the server closes it (a plaintext client)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        while sock.recv(4096):
            pass


def untrusting_client(port: int) -> None:
    """A TLS client that does not trust the appliance's CA: it aborts the handshake."""
    context = ssl.create_default_context()  # the system CAs only
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname="localhost")


def silent_client(port: int) -> None:
    """Connects and closes without a byte: the handshake sees the end of the stream."""
    with socket.create_connection(("127.0.0.1", port), timeout=30):
        pass


def hold_tls(ca_file: Path, port: int) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return tls_context(ca_file).wrap_socket(raw, server_hostname="localhost")


def closed_by_server(port: int) -> bool:
    """A connection over the cap: accepted and closed at once."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True


async def in_thread(fn: Callable[..., object], *args: object) -> object:
    return await trio.to_thread.run_sync(fn, *args)


async def settled(port: int, ready: Callable[[Samples], bool], seconds: float = 20) -> Samples:
    """Scrape until ``ready`` holds (the server counts a closed connection a moment later)."""
    deadline = trio.current_time() + seconds
    while True:
        samples: Samples = await trio.to_thread.run_sync(scrape, port)
        if ready(samples) or trio.current_time() > deadline:
            return samples
        await trio.sleep(0.05)


# -- the counts --------------------------------------------------------------------------------


@pytest.mark.trio
async def test_metrics_count_exactly_what_real_clients_sent(tmp_path: Path) -> None:
    chunks, events, bad_times = 5, 20, 3
    config = make_config(tmp_path, max_connections=3)
    async with running(config) as info:
        assert info.ca_file is not None
        assert info.admin_port is not None
        ca, port, admin = info.ca_file, info.ports["forward"], info.admin_port

        # Three open connections fill max_connections; two more are refused.
        held = [await trio.to_thread.run_sync(hold_tls, ca, port) for _ in range(3)]
        await settled(admin, lambda s: value(s, "appliance_connections_open", **FORWARD) == 3)
        for _ in range(2):
            assert await trio.to_thread.run_sync(closed_by_server, port)
        for sock in held:
            sock.close()
        await settled(admin, lambda s: value(s, "appliance_connections_open", **FORWARD) == 0)

        # Chunks with some unusable entries, and one resend of a committed chunk.
        for i in range(chunks):
            ack = await in_thread(send_chunk, ca, port, f"c{i}", events, bad_times)
            assert ack == {"ack": f"c{i}"}
        assert await in_thread(send_chunk, ca, port, "c0", events) == {"ack": "c0"}

        # Bad handshakes: 2 plaintext, 3 untrusting, 1 silent; and 1 protocol error.
        for _ in range(2):
            await in_thread(plaintext_client, port)
        for _ in range(3):
            await in_thread(untrusting_client, port)
        await in_thread(silent_client, port)
        await in_thread(send_garbage_over_tls, ca, port)

        accepted = 3 + chunks + 1 + 2 + 3 + 1 + 1
        samples = await settled(
            admin,
            lambda s: (
                value(s, "appliance_connections_accepted_total", **FORWARD) == accepted
                and value(s, "appliance_connections_open", **FORWARD) == 0
                and sum(
                    v for (n, _), v in s.items() if n == "appliance_tls_handshake_failures_total"
                )
                == 6
            ),
        )

    def tls(reason: str) -> float:
        return value(samples, "appliance_tls_handshake_failures_total", **FORWARD, reason=reason)

    assert value(samples, "appliance_connections_accepted_total", **FORWARD) == accepted
    assert value(samples, "appliance_connections_open", **FORWARD) == 0
    refused = "appliance_connections_refused_total"
    assert value(samples, refused, **FORWARD, reason="max_connections") == 2
    assert value(samples, "appliance_connections_failed_total", **FORWARD) == 0
    assert (tls("plaintext"), tls("certificate"), tls("closed")) == (2, 3, 1)
    assert value(samples, "appliance_requests_total", **FORWARD) == chunks + 1
    assert value(samples, "appliance_events_received_total", **FORWARD) == (chunks + 1) * events
    dropped = "appliance_events_dropped_total"
    assert value(samples, dropped, **FORWARD, reason="invalid_time") == chunks * bad_times
    errors = "appliance_protocol_errors_total"
    assert value(samples, errors, **FORWARD, reason="encoding") == 1
    assert sum(v for (n, _), v in samples.items() if n == errors) == 1
    assert value(samples, "appliance_acks_sent_total", **FORWARD) == chunks + 1
    assert value(samples, "appliance_ack_latency_seconds_count", **FORWARD) == chunks + 1
    assert value(samples, "appliance_ack_latency_seconds_sum", **FORWARD) > 0
    assert value(samples, "appliance_received_bytes_total", **FORWARD) > 0
    # The writer: the resend was acknowledged again without a second write.
    assert value(samples, "appliance_lake_committed_rows_total") == chunks * events
    assert value(samples, "appliance_lake_dedupe_hits_total", state="committed") == 1
    assert value(samples, "appliance_lake_commits_total") >= 1
    commits = value(samples, "appliance_lake_commits_total")
    assert value(samples, "appliance_lake_commit_duration_seconds_count") == commits
    assert value(samples, "appliance_lake_commit_failures_total", kind="storage") == 0
    assert value(samples, "appliance_lake_blocks_refused_total") == 0
    assert value(samples, "appliance_lake_queue_blocks") == 0
    assert value(samples, "appliance_lake_queue_capacity_blocks") == config.lake.queue_blocks
    assert value(samples, "appliance_lake_table_version") >= commits
    assert value(samples, "appliance_lake_last_commit_timestamp_seconds") > time.time() - 300
    assert 0 <= value(samples, "appliance_lake_last_commit_age_seconds") < 300
    # The default collectors, and the build.
    assert value(samples, "process_resident_memory_bytes") > 0
    assert value(samples, "process_open_fds") > 0
    assert info.writer is not None
    build = {"version": __version__, "node_id": info.writer.app_id, "worker": ""}
    assert value(samples, "appliance_build_info", **build) == 1
    assert len(table_rows(config)) == chunks * events
    # Bounded labels only: no peer, tag or free text anywhere.
    for (name, labels), _ in samples.items():
        if name.startswith("appliance_"):
            assert {k for k, _ in labels} <= {
                "listener", "protocol", "reason", "state", "kind", "mechanism", "result",
                "operation", "version", "le", "node_id", "worker",  # one value a process
            }, name  # fmt: skip


@pytest.mark.trio
async def test_readyz_turns_503_when_the_delta_log_is_read_only_and_200_when_healed(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        assert info.admin_port is not None
        admin = info.admin_port
        status, body = await in_thread(http_get, admin, "/readyz")
        assert status == 200, body
        assert info.writer is not None
        node_id = info.writer.app_id
        assert json.loads(body) == {
            "status": "ready",
            "checks": {"listeners": {"ok": True}, "table": {"ok": True},
                       "auth_database": {"ok": True}},
            # Which appliance answers: appliance status checks the state directory.
            "instance": {"node_id": node_id, "state_dir": str(config.state_dir.resolve()),
                         "pid": os.getpid(), "version": __version__, "worker": None},
        }  # fmt: skip
        build_info = {"node_id": node_id, "version": __version__, "worker": ""}
        samples = await in_thread(scrape, admin)
        assert value(samples, "appliance_build_info", **build_info) == 1
        with read_only_dir(Path(config.table_uri) / "_delta_log") as fault:
            fault.break_()
            status, body = await in_thread(http_get, admin, "/readyz")
            assert status == 503, body
            answer = json.loads(body)
            assert answer["status"] == "not ready"
            assert answer["checks"]["table"] == {
                "ok": False,
                "reason": f"{Path(config.table_uri) / '_delta_log'} is not writable",
            }
            assert answer["checks"]["listeners"] == {"ok": True}
            # Liveness is another question: the loop answers.
            assert await in_thread(http_get, admin, "/livez") == (200, "ok\n")
            fault.heal()
            status, body = await in_thread(http_get, admin, "/readyz")
            assert status == 200, body


@pytest.mark.trio
async def test_readyz_names_a_listener_that_is_not_open(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        assert info.admin_port is not None
        info.accepting["forward"].cancel()
        info.ports.pop("forward")
        status, body = await in_thread(http_get, info.admin_port, "/readyz")
        assert status == 503
        assert json.loads(body)["checks"]["listeners"] == {
            "ok": False,
            "reason": "not open: forward",
        }


@pytest.mark.trio
async def test_a_token_guards_every_endpoint(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("0123456789abcdef0123456789abcdef\n")
    token_file.chmod(0o600)
    config = make_config(tmp_path, AdminConfig(bind="127.0.0.1:0", token_file=token_file))
    async with running(config) as info:
        assert info.admin_port is not None
        port = info.admin_port
        token = "0123456789abcdef0123456789abcdef"
        for path in ("/metrics", "/livez", "/readyz"):
            assert (await in_thread(http_get, port, path))[0] == 401
            assert (await in_thread(http_get, port, path, "0123456789abcdef0123456789abcdeX"))[
                0
            ] == 401
            assert (await in_thread(http_get, port, path, token))[0] == 200
        assert (await in_thread(http_get, port, "/nothing", token))[0] == 404
        assert (await in_thread(http_get, port, "/metrics", token, "POST"))[0] == 405


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while data := sock.recv(65536):
            received += data
        return received


@pytest.mark.trio
async def test_the_http_server_keeps_alive_and_refuses_bad_requests(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:
        assert info.admin_port is not None
        port = info.admin_port
        two = (
            b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = await in_thread(raw_exchange, port, two)
        assert answer.count(b"HTTP/1.1 200 ") == 2
        assert (await in_thread(raw_exchange, port, b"NOT HTTP\r\n\r\n")).startswith(
            b"HTTP/1.1 400 "
        )
        body = b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        assert (await in_thread(raw_exchange, port, body)).startswith(b"HTTP/1.1 413 ")
        huge = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        assert (await in_thread(raw_exchange, port, huge)).startswith(b"HTTP/1.1 431 ")
        head = await in_thread(raw_exchange, port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert head.endswith(b"\r\n\r\n")  # no body for HEAD


@pytest.mark.trio
async def test_a_silent_admin_client_is_closed_at_the_deadline(tmp_path: Path) -> None:
    from appliance.server import admin

    config = make_config(tmp_path)
    async with running(config) as info:
        assert info.admin_port is not None
        port = info.admin_port

        def wait_for_close() -> float:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                started = time.monotonic()
                assert sock.recv(1) == b""
                return time.monotonic() - started

        waited = await trio.to_thread.run_sync(wait_for_close)
        assert admin.FIRST_BYTE_TIMEOUT_SECONDS - 1 < waited < admin.FIRST_BYTE_TIMEOUT_SECONDS + 5


# -- start-up rules ----------------------------------------------------------------------------


def test_off_loopback_the_admin_listener_needs_tls_and_a_token() -> None:
    with pytest.raises(ConfigError, match=r"not a loopback address.*tls = true and a token_file"):
        parse_config('[admin]\nbind = "0.0.0.0:9880"\n', "a.toml")
    with pytest.raises(ConfigError, match=r"a\.toml: admin: bind .10\.0\.0\.5:9880. is not"):
        parse_config('[admin]\nbind = "10.0.0.5:9880"\ntls = true\n', "a.toml")
    config = parse_config(
        '[admin]\nbind = "10.0.0.5:9880"\ntls = true\ntoken_file = "/etc/appliance/admin.token"\n'
    )
    assert config.admin.tls
    assert not config.admin.loopback
    assert parse_config('[admin]\nbind = "[::1]:9880"\n').admin.loopback
    assert parse_config('[admin]\nbind = "0.0.0.0:9880"\nenabled = false\n').admin.enabled is False


@pytest.mark.trio
async def test_a_short_token_file_refuses_to_start(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("short\n")
    config = make_config(tmp_path, AdminConfig(bind="127.0.0.1:0", token_file=token_file))
    with pytest.raises(BaseExceptionGroup) as caught:
        async with running(config):
            pass
    assert "at least 16 characters" in str(caught.value.exceptions)


@pytest.mark.trio
async def test_a_configured_admin_address_in_use_refuses_to_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = make_config(tmp_path, AdminConfig(bind=f"127.0.0.1:{port}"))
        with pytest.raises(BaseExceptionGroup) as caught:
            async with running(config):
                pass
    assert f"the admin listener cannot bind 127.0.0.1:{port}" in str(caught.value.exceptions)


@pytest.mark.trio
async def test_the_default_admin_address_in_use_leaves_the_service_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default address taken (another appliance on the machine): no admin listener.

    The default is moved to a port this test holds, so the outcome does not
    depend on whether something else holds the real default meanwhile.
    """
    from appliance.server import admin

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    default = f"127.0.0.1:{holder.getsockname()[1]}"
    monkeypatch.setattr(admin, "DEFAULT_ADMIN_BIND", default)
    try:
        config = make_config(tmp_path, AdminConfig(bind=default))
        async with running(config) as info:
            assert info.admin_port is None
            ack = await in_thread(send_chunk, info.ca_file, info.ports["forward"], "c", 1)
            assert ack == {"ack": "c"}
    finally:
        holder.close()


@pytest.mark.trio
async def test_disabled_admin_counts_nothing(tmp_path: Path) -> None:
    config = make_config(tmp_path, AdminConfig(enabled=False))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(
            lambda task_status: serve(config, stop=stop, task_status=task_status)
        )
        assert info.admin_port is None
        assert info.metrics is not None
        assert not info.metrics.enabled
        stop.set()


# -- reason classes ------------------------------------------------------------------------------


def test_reason_classes_are_a_few_words() -> None:
    assert tls_failure_class("no handshake within 10.0s") == "timeout"
    assert tls_failure_class("a plaintext Fluentd forward client on a TLS listener") == "plaintext"
    assert tls_failure_class("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca") == (
        "certificate"
    )
    assert tls_failure_class("[SSL: PEER_DID_NOT_RETURN_A_CERTIFICATE] peer did not") == (
        "certificate"
    )
    assert tls_failure_class("EOF occurred in violation of protocol") == "closed"
    assert tls_failure_class("[SSL: NO_SHARED_CIPHER] no shared cipher") == "protocol"
    assert protocol_error_class("request exceeds max_request_bytes=1024") == "limit"
    assert protocol_error_class("C frame is not valid zlib: bad header") == "compression"
    assert protocol_error_class("request is not valid msgpack: unpack(b) received") == "encoding"
    assert protocol_error_class("tag is not a string") == "malformed"
    assert drop_reason_class("EventTime nanoseconds out of range") == "time_out_of_range"
    assert drop_reason_class("time is not an integer or EventTime (str)") == "invalid_time"
    assert drop_reason_class("record is not a map") == "record_not_map"
    assert drop_reason_class("entry is not a [time, record] array") == "malformed_entry"
    # A refused batch's class comes from how the writer's reason begins.
    assert refusal_class("write-ahead log full: the table is not keeping up") == "wal_full"
    assert refusal_class("write-ahead log: disk full (No space left on device)") == "disk_full"
    assert refusal_class("write-ahead log: the write-ahead log stopped") == "wal_error"
    assert refusal_class("disk nearly full: 1.0 GiB free on the table's filesystem") == (
        "disk_nearly_full"
    )
    assert refusal_class("record is not valid UTF-8") == "unstorable"
    assert refusal_class("cannot be logged: a record of 9 bytes is over the limit") == (
        "unstorable"
    )
    # A client's text inside a reason does not pick the class.
    assert refusal_class("tag 'write-ahead log full' is too long") == "unstorable"


def _wal_sample(**changes: Any) -> WalSample:
    sample = WalSample(
        file_bytes=4096, max_bytes=8192, uncommitted_bytes=100, segments=1, at_cap=False,
        appends=1, syncs=1, failed_syncs=0, written_bytes=100, cap_waits=0, cap_refusals=0,
        sync_wait_seconds=0.0, cache_bytes=300, groups_from_cache=0, groups_read_back=0,
        committed=1000, oldest_cached=(1000, 50 * 10**9),
    )  # fmt: skip
    return replace(sample, **changes)


def test_the_oldest_uncommitted_record_s_age() -> None:
    """From the cache's receive times: exact, remembered by position, a lower bound, or NaN."""
    from appliance.metrics import _WalCollector

    current: list[WalSample] = [_wal_sample()]
    now = [60.0]
    collector = _WalCollector(lambda: current[0], clock=lambda: now[0])

    def age() -> float:
        (family,) = [
            f
            for f in collector.collect()
            if f.name == "appliance_wal_oldest_uncommitted_age_seconds"
        ]
        return float(family.samples[0].value)

    # The cache's oldest record is the first uncommitted one (received at 50 s).
    assert age() == 10.0
    # It left the cache (which now starts later), still uncommitted: remembered.
    current[0] = _wal_sample(oldest_cached=(2000, 55 * 10**9))
    now[0] = 70.0
    assert age() == 20.0
    # A commit moved on to a record the cache no longer holds: the cache's oldest, a lower bound.
    current[0] = _wal_sample(committed=1500, oldest_cached=(2000, 55 * 10**9))
    assert age() == 15.0
    # Nothing to go by (cache_bytes = 0).
    current[0] = _wal_sample(committed=1500, oldest_cached=None)
    assert math.isnan(age())
    # Nothing uncommitted.
    current[0] = _wal_sample(uncommitted_bytes=0, oldest_cached=None)
    assert age() == 0.0


def test_build_info_names_the_instance() -> None:
    metrics = Metrics(process=False)
    assert b'appliance_build_info{node_id="",version="' in metrics.exposition()[0]
    metrics.identify(Instance("node-7", "/srv/state/workers/2", 42, __version__, 2))
    text = metrics.exposition()[0].decode()
    assert f'appliance_build_info{{node_id="node-7",version="{__version__}",worker="2"}} 1.0' in (
        text
    )


def test_an_instance_says_which_state_directory_and_worker(tmp_path: Path) -> None:
    from appliance.state_lock import StateLock

    one = Instance.of("n1", tmp_path / "workers" / "3" / "wal")
    assert one.state_dir == str((tmp_path / "workers" / "3").resolve())
    assert one.worker == 3
    assert one.pid == os.getpid()
    # Without a log: the one state directory this process holds the lock of.
    assert Instance.of("n1", None).state_dir is None
    lock = StateLock(tmp_path)
    try:
        assert Instance.of("n1", None).state_dir == str(tmp_path.resolve())
        assert Instance.of("n1", None).worker is None
        other = tmp_path / "other"
        other.mkdir()
        second = StateLock(other)
        try:
            assert Instance.of("n1", None).state_dir is None  # two: cannot tell which
        finally:
            second.release()
    finally:
        lock.release()
    assert Instance.of("n1", None).state_dir is None


def test_two_services_in_one_process_have_their_own_registries() -> None:
    one, two = Metrics(), Metrics()
    one.listener("forward", "forward").requests.inc(3)
    assert (
        b'appliance_requests_total{listener="forward",protocol="forward"} 3.0'
        in (one.exposition()[0])
    )
    assert b"appliance_requests_total{" not in two.exposition()[0]
    assert one.listener("forward", "forward") is one.listener("forward", "forward")


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620])
def test_a_token_file_others_may_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    from appliance.server.admin import AdminError, read_token

    token_file = tmp_path / "admin.token"
    token_file.write_text("0123456789abcdef0123456789abcdef\n")
    token_file.chmod(mode)
    with pytest.raises(AdminError, match="chmod 0600"):
        read_token(token_file)


def test_a_token_file_the_service_group_may_read_is_accepted(tmp_path: Path) -> None:
    """The packaged layout: root:appliance 0640, the service running in group appliance."""
    import os

    from appliance.server.admin import read_token

    token_file = tmp_path / "admin.token"
    token_file.write_text("0123456789abcdef0123456789abcdef\n")
    token_file.chmod(0o640)
    os.chown(token_file, -1, os.getegid())
    assert read_token(token_file) == "0123456789abcdef0123456789abcdef"
