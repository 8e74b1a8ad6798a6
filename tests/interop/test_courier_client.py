"""Log Courier end to end: the protocol client in tests/courier_client.py against the service.

No Log Courier client is packaged on the registries the project reaches
(docs/courier.md), so the client is written from the protocol. The service runs
in-process (``serve``) with real TLS on loopback and a real Delta table;
the blocking client runs in a worker thread. Every test reads the table
back and checks each event arrived exactly once.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from appliance.config import Config, CourierListenerConfig
from appliance.service import Running
from pki.authority import CertificateAuthority, PkiPaths
from tests.courier_client import CourierClient, CourierClientError, Pending
from tests.faults import read_only_dir
from tests.support.service import running, service_config, table_rows

pytestmark = pytest.mark.interop

T = TypeVar("T")


def make_config(tmp_path: Path, **listener: Any) -> Config:
    return service_config(tmp_path, CourierListenerConfig, **listener)


def client_for(info: Running, **kwargs: Any) -> CourierClient:
    assert info.ca_file is not None
    return CourierClient("127.0.0.1", info.ports["courier"], ca_file=info.ca_file, **kwargs)


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def events(prefix: str, n: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {
            "@timestamp": f"2025-03-04T05:06:{i % 60:02d}.{i:09d}Z",
            "host": "shipper-1",
            "message": f"{prefix} line {i} ünïcødé",
            "id": f"{prefix}-{i}",
            "offset": i * 100,
            **extra,
        }
        for i in range(n)
    ]


def by_id(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        record = json.loads(row["record"])
        found.setdefault(record.get("id", record.get("message")), []).append(row)
    return found


@pytest.mark.trio
async def test_jdat_and_evnt_payloads_arrive_exactly_once(tmp_path: Path) -> None:
    config = make_config(tmp_path, tag="courier-default")
    sent: list[dict[str, Any]] = []
    async with running(config) as info:

        def ship() -> tuple[CourierClient, list[Pending]]:
            done: list[Pending] = []
            with client_for(info) as client:  # HELO/VERS: EVNT advertised, so EVNT
                assert client.vers is not None
                assert client.vers.supports_evnt
                assert client.streams
                for p in range(3):
                    batch = events(f"evnt{p}", 40, type="app")
                    sent.extend(batch)
                    done.append(client.publish(batch))
                # Pipelined: several payloads in flight, acked in order.
                nonces = []
                for p in range(4):
                    batch = events(f"pipe{p}", 25)
                    sent.extend(batch)
                    nonces.append(client.send_payload(batch))
                done += client.wait_acked(nonces)
                client.ping()
                client.wait_pong()
            with client_for(info, use_evnt=False) as client:  # handshake, but JDAT
                batch = events("jdat", 30, type="web")
                sent.extend(batch)
                done.append(client.publish(batch))
            with client_for(info, legacy=True) as client:  # no HELO at all
                assert client.vers is None
                batch = events("legacy", 10)
                sent.extend(batch)
                done.append(client.publish(batch))
            return client, done

        _, done = await in_thread(ship)
        # Each final ACKN carried the payload's whole count.
        assert [p.last_sequence for p in done] == [40] * 3 + [25] * 4 + [30, 10]
    rows = table_rows(config)
    found = by_id(rows)
    assert len(rows) == len(sent) == 260
    for event in sent:
        (row,) = found[event["id"]]  # exactly once
        assert json.loads(row["record"]) == event
        assert row["protocol"] == "courier"
        assert row["host"] == "shipper-1"
        assert row["tag"] == event.get("type", "courier-default")
        assert row["peer"].startswith("127.0.0.1:")
        assert row["source"] == "anonymous"
        assert len(row["batch_id"]) == 32 + 1 + 16  # nonce hex, ":", content digest
    # Nanoseconds of @timestamp are kept.
    (first,) = found["evnt0-7"]
    assert first["event_time_ns"] == 1_741_064_767_000_000_007
    assert len({r["batch_id"] for r in rows}) == 9


@pytest.mark.trio
async def test_event_that_is_not_json_is_kept_as_message(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:

        def ship() -> Pending:
            with client_for(info) as client:
                return client.publish([b"plain text, not JSON", b'{"id":"json"}'])

        assert (await in_thread(ship)).last_sequence == 2
    records = [json.loads(r["record"]) for r in table_rows(config)]
    assert len(records) == 2
    assert {"message": "plain text, not JSON"} in records
    assert {"id": "json"} in records


@pytest.mark.trio
async def test_resent_nonce_after_reconnect_is_acked_without_a_second_write(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    batch = events("resend", 20)
    nonce = os.urandom(16)
    async with running(config) as info:

        def ship() -> tuple[Pending, Pending]:
            with client_for(info) as client:
                first = client.publish(batch, nonce=nonce)
            # The client lost the ACKN (as far as it knows) and resends on a
            # new connection, with the same nonce, as Log Courier does.
            with client_for(info, use_evnt=False) as client:
                second = client.publish(batch, nonce=nonce)
            return first, second

        first, second = await in_thread(ship)
        assert first.last_sequence == second.last_sequence == 20
        assert info.writer is not None
        assert info.writer.duplicates == 1
    rows = table_rows(config)
    assert len(rows) == 20
    assert {r["batch_id"].split(":")[0] for r in rows} == {nonce.hex()}


@pytest.mark.trio
async def test_slowed_commit_gets_keepalives_then_one_final_ackn(tmp_path: Path) -> None:
    config = make_config(tmp_path, keepalive_seconds=0.2)
    async with running(config) as info:

        def warm_up() -> None:
            with client_for(info) as client:
                client.publish(events("warm", 1))

        await in_thread(warm_up)
        log_dir = Path(config.table_uri) / "_delta_log"
        batch = events("slow", 15)
        with read_only_dir(log_dir) as fault:
            fault.break_()

            def ship() -> Pending:
                def on_partial(pending: Pending, count: int) -> None:
                    # Heal once the client has seen the server keep the
                    # payload alive a few times while the commit failed.
                    if len(pending.partials) == 3:
                        fault.heal()

                with client_for(info, network_timeout=5.0) as client:
                    nonce = client.send_payload(batch)
                    (done,) = client.wait_acked([nonce], on_partial=on_partial)
                    return done

            done = await in_thread(ship)
        # Keepalives acknowledged nothing: no event was acked before its commit.
        assert len(done.partials) >= 3
        assert set(done.partials) == {0}
        assert done.last_sequence == 15
        assert info.writer is not None
        assert info.writer.failed_attempts >= 1
    found = by_id(table_rows(config))
    for event in batch:
        assert len(found[event["id"]]) == 1


@pytest.mark.trio
async def test_connection_dropped_during_a_failing_commit_then_resent_is_written_once(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, keepalive_seconds=0.2)
    batch = events("dropped", 12)
    nonce = os.urandom(16)
    async with running(config) as info:

        def warm_up() -> None:
            with client_for(info) as client:
                client.publish(events("warm", 1))

        await in_thread(warm_up)
        log_dir = Path(config.table_uri) / "_delta_log"
        with read_only_dir(log_dir) as fault:
            fault.break_()

            def give_up() -> list[int]:
                with client_for(info) as client:
                    client.send_payload(batch, nonce=nonce)
                    # Wait for one keepalive, then hang up without the final ACKN.
                    kind, body = client.read_message()
                    return [int.from_bytes(body[16:], "big")] if kind == b"ACKN" else []

            assert await in_thread(give_up) == [0]
            fault.heal()

        def resend() -> Pending:
            with client_for(info) as client:
                return client.publish(batch, nonce=nonce)

        assert (await in_thread(resend)).last_sequence == 12
    rows = [r for r in table_rows(config) if r["batch_id"].split(":")[0] == nonce.hex()]
    assert len(rows) == 12


@pytest.mark.trio
async def test_bad_zlib_closes_only_that_connection(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:

        def ship() -> tuple[str, Pending]:
            with client_for(info) as good, client_for(info) as bad:
                bad.send_raw(b"JDAT\x00\x00\x00\x20" + bytes(16) + b"\x00\x01garbage!garbage!")
                try:
                    bad.read_message()
                except CourierClientError as exc:
                    outcome = str(exc)
                else:
                    outcome = "answered"
                return outcome, good.publish(events("still-fine", 3))

        outcome, done = await in_thread(ship)
        assert outcome == "the server closed the connection"
        assert done.last_sequence == 3
    assert len(table_rows(config)) == 3


@pytest.mark.trio
async def test_unknown_message_gets_question_marks_and_the_connection_goes_on(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    async with running(config) as info:

        def ship() -> tuple[bytes, Pending]:
            with client_for(info) as client:
                client.send_raw(b"FUTR\x00\x00\x00\x05hello")
                kind, _ = client.read_message()
                return kind, client.publish(events("after-unknown", 2))

        kind, done = await in_thread(ship)
        assert kind == b"????"
        assert done.last_sequence == 2
    assert len(table_rows(config)) == 2


@pytest.mark.trio
async def test_required_client_certificate_names_the_source(tmp_path: Path) -> None:
    config = make_config(tmp_path, client_auth="required")
    async with running(config) as info:
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        issued = ca.issue_client("shipper-7", organization="Acme")
        cert_file, key_file = tmp_path / "c.crt", tmp_path / "c.key"
        cert_file.write_bytes(issued.cert_pem())
        key_file.write_bytes(issued.key_pem())

        def ship() -> tuple[Pending, str]:
            with client_for(info, cert_file=cert_file, key_file=key_file) as client:
                done = client.publish(events("mtls", 4))
            try:
                with client_for(info) as anonymous:  # no certificate: refused
                    anonymous.publish(events("anon", 1))
            except (CourierClientError, ssl.SSLError, OSError) as exc:
                return done, type(exc).__name__
            return done, "served"

        done, refused = await in_thread(ship)
        assert done.last_sequence == 4
        assert refused != "served"
    rows = table_rows(config)
    assert len(rows) == 4
    assert {r["source"] for r in rows} == {"O=Acme,CN=shipper-7"}


def test_default_port_is_12345_with_tls() -> None:
    listener = CourierListenerConfig()
    assert listener.port == 12345
    assert listener.tls is True
    assert listener.client_auth == "off"
