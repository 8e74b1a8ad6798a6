"""Mutual TLS end to end: the service in-process, Python's ssl as the client."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import replace
from functools import partial
from pathlib import Path

import msgpack
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from deltalake import DeltaTable

from appliance.config import Config, ForwardListenerConfig, LakeConfig
from appliance.service import Running, serve
from pki.authority import CertificateAuthority, PkiPaths, key_pem, load_key

LAKE = LakeConfig(commit_max_delay_seconds=0.05)


def make_config(tmp_path: Path, client_auth: str = "required") -> Config:
    return Config(
        state_dir=tmp_path / "state",
        lake=LAKE,
        listeners=[
            ForwardListenerConfig(bind="127.0.0.1:0", client_auth=client_auth)  # type: ignore[arg-type]
        ],
    )


def write_client(tmp_path: Path, name: str, cert_pem: bytes, key: bytes) -> tuple[Path, Path]:
    cert_file = tmp_path / f"{name}.crt"
    key_file = tmp_path / f"{name}.key"
    cert_file.write_bytes(cert_pem)
    key_file.write_bytes(key)
    return cert_file, key_file


def client_context(info: Running, creds: tuple[Path, Path] | None) -> ssl.SSLContext:
    assert info.ca_file is not None
    context = ssl.create_default_context(cafile=str(info.ca_file))
    if creds is not None:
        context.load_cert_chain(*creds)
    return context


async def exchange(
    info: Running, creds: tuple[Path, Path] | None, chunk: str
) -> tuple[object | None, bytes | None]:
    """Send one request; returns (the ack or None, the server certificate in DER)."""
    context = client_context(info, creds)
    sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
    stream = trio.SSLStream(sock, context, server_hostname="localhost")
    server_der: bytes | None = None
    try:
        await stream.do_handshake()
        server_der = stream.getpeercert(binary_form=True)
        entries = msgpack.packb([1700000000, {"who": chunk}])
        await stream.send_all(msgpack.packb(["mtls", entries, {"chunk": chunk}]))
        with trio.move_on_after(10):
            data = await stream.receive_some(1024)
            return (msgpack.unpackb(data) if data else None), server_der
    except (trio.BrokenResourceError, ssl.SSLError):
        return None, server_der
    finally:
        await trio.aclose_forcefully(stream)
    return None, server_der


def sources(config: Config) -> dict[str, str]:
    rows = DeltaTable(config.table_uri).to_pyarrow_table().to_pylist()
    return {r["batch_id"]: r["source"] for r in rows}


def expired_client(ca: CertificateAuthority, tmp_path: Path) -> tuple[Path, Path]:
    ca_key = load_key(ca.paths.ca_key.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired")]))
        .issuer_name(ca.certificate().subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now - dt.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    return write_client(
        tmp_path, "expired", cert.public_bytes(serialization.Encoding.PEM), key_pem(key)
    )


def foreign_client(tmp_path: Path) -> tuple[Path, Path]:
    other = CertificateAuthority(PkiPaths(tmp_path / "other-pki"))
    other.create("Some Other CA")
    issued = other.issue_client("intruder")
    return write_client(tmp_path, "intruder", issued.cert_pem(), issued.key_pem())


@pytest.mark.trio
async def test_required_client_auth(tmp_path: Path) -> None:
    config = make_config(tmp_path, "required")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(partial(serve, config, stop=stop))
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        good = ca.issue_client("web-01", organization="Acme")
        good_creds = write_client(tmp_path, "good", good.cert_pem(), good.key_pem())
        doomed = ca.issue_client("stolen-laptop")
        doomed_creds = write_client(tmp_path, "doomed", doomed.cert_pem(), doomed.key_pem())

        assert (await exchange(info, good_creds, "good"))[0] == {"ack": "good"}
        assert (await exchange(info, None, "no-cert"))[0] is None
        assert (await exchange(info, expired_client(ca, tmp_path), "expired"))[0] is None
        assert (await exchange(info, foreign_client(tmp_path), "foreign"))[0] is None
        assert (await exchange(info, doomed_creds, "before-revoke"))[0] == {"ack": "before-revoke"}

        ca.revoke(doomed.certificate.serial_number, "keyCompromise")
        assert info.tls_manager is not None
        assert info.tls_manager.reload(info.services, "test")
        assert (await exchange(info, doomed_creds, "after-revoke"))[0] is None
        assert (await exchange(info, good_creds, "good-again"))[0] == {"ack": "good-again"}
        stop.set()
    assert sources(config) == {
        "good": "O=Acme,CN=web-01",
        "before-revoke": "CN=stolen-laptop",
        "good-again": "O=Acme,CN=web-01",
    }
    # Every certificate refused at the handshake is in the audit log.
    from auth.database import open_database

    with open_database(config.auth_settings) as database:
        refused = [e for e in database.audit.audit_entries() if e.action == "tls.refused"]
    details = " ".join(e.detail for e in refused)
    assert len(refused) == 4, details  # no certificate, expired, foreign CA, revoked
    assert "revoked" in details
    assert "expired" in details
    assert all(e.target == "127.0.0.1" for e in refused)


@pytest.mark.trio
async def test_optional_client_auth_names_only_verified_clients(tmp_path: Path) -> None:
    config = make_config(tmp_path, "optional")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(partial(serve, config, stop=stop))
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        issued = ca.issue_client("collector")
        creds = write_client(tmp_path, "c", issued.cert_pem(), issued.key_pem())
        assert (await exchange(info, creds, "with"))[0] == {"ack": "with"}
        assert (await exchange(info, None, "without"))[0] == {"ack": "without"}
        assert (await exchange(info, foreign_client(tmp_path), "foreign"))[0] is None
        stop.set()
    assert sources(config) == {"with": "CN=collector", "without": "anonymous"}


@pytest.mark.trio
async def test_rotation_serves_new_certificate_and_keeps_old_connections(tmp_path: Path) -> None:
    config = replace(make_config(tmp_path, "off"), lake=LakeConfig(commit_max_delay_seconds=0.05))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        info: Running = await nursery.start(partial(serve, config, stop=stop))
        context = client_context(info, None)
        sock = await trio.open_tcp_stream("127.0.0.1", info.ports["forward"])
        old = trio.SSLStream(sock, context, server_hostname="localhost")
        await old.do_handshake()
        old_serial = x509.load_der_x509_certificate(old.getpeercert(binary_form=True)).serial_number

        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        new_serial = ca.rotate_server().certificate.serial_number
        assert info.tls_manager is not None
        assert info.tls_manager.reload(info.services, "test")

        _, der = await exchange(info, None, "new-connection")
        assert der is not None
        assert x509.load_der_x509_certificate(der).serial_number == new_serial != old_serial
        entries = msgpack.packb([1700000000, {"who": "old"}])
        await old.send_all(msgpack.packb(["mtls", entries, {"chunk": "old-connection"}]))
        with trio.fail_after(10):
            assert msgpack.unpackb(await old.receive_some(1024)) == {"ack": "old-connection"}
        await old.aclose()
        stop.set()
