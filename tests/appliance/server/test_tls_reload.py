"""A reload gives every TLS listener, the admin listener included, the files on disk now.

The service runs in-process with the admin listener on HTTPS; ``info.reload``
is what SIGHUP (``systemctl reload``, ``appliance cert ...``) runs. The
client is Python's ``ssl`` in a worker thread, on a port the service bound
itself.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from cryptography import x509

from appliance.config import AdminConfig, Config, ForwardListenerConfig
from pki.authority import CertificateAuthority, PkiPaths, crl_number
from tests.support.service import running, service_config


def https_config(tmp_path: Path) -> Config:
    config = service_config(tmp_path, ForwardListenerConfig, client_auth="optional")
    return replace(config, admin=AdminConfig(bind="127.0.0.1:0", tls=True))


def presented_serial(port: int, ca_file: Path) -> int:
    """The serial of the certificate the server on ``port`` presents (verified against the CA)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def admin_serial(port: int, ca: CertificateAuthority) -> int:
    return await trio.to_thread.run_sync(presented_serial, port, ca.paths.ca_cert)


@pytest.mark.trio
async def test_the_admin_listener_takes_the_new_server_certificate_on_reload(
    tmp_path: Path,
) -> None:
    config = https_config(tmp_path)
    async with running(config) as info:
        assert info.admin_port is not None
        assert info.reload is not None
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        first = await admin_serial(info.admin_port, ca)

        # cert rotate-server, then the reload it asks for.
        rotated = ca.rotate_server().certificate.serial_number
        assert (await info.reload("SIGHUP")).ok
        assert await admin_serial(info.admin_port, ca) == rotated != first
        assert (
            await trio.to_thread.run_sync(presented_serial, info.ports["forward"], ca.paths.ca_cert)
            == rotated
        )

        # cert import --server-cert/--server-key, then the reload.
        issued = ca.issue_server(["localhost", "127.0.0.1"])
        ca.import_server(issued.cert_pem() + ca.paths.ca_cert.read_bytes(), issued.key_pem())
        assert (await info.reload("SIGHUP")).ok
        assert await admin_serial(info.admin_port, ca) == issued.certificate.serial_number


@pytest.mark.trio
async def test_the_reload_status_names_the_crl_the_listeners_check(tmp_path: Path) -> None:
    config = https_config(tmp_path)
    async with running(config) as info:
        assert info.reload is not None
        ca = CertificateAuthority(PkiPaths(config.pki_dir))
        at_start = crl_number(ca.published_crl())
        assert info.tls_manager is not None
        assert info.tls_manager.crl_number == at_start
        serial = ca.issue_client("web-01").certificate.serial_number
        ca.revoke(serial)
        status = await info.reload("SIGHUP")
        assert status.ok
        assert status.crl_number == ca.confirm_revoked(serial)
        assert at_start is not None
        assert status.crl_number is not None
        assert status.crl_number > at_start
