"""Handshake failures in words: the client's side and ours, from real handshakes."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
import trio

from appliance.server.tls_audit import is_certificate_refusal
from appliance.server.tls_errors import handshake_failure
from pki.authority import CertificateAuthority, PkiPaths
from pki.tls import server_context


async def failure_of(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """The reason the server side gives for the handshake ``client`` makes (real TCP)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    caught: list[BaseException | None] = []

    def dial() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            try:
                with client.wrap_socket(raw, server_hostname="localhost"):
                    pass
            except ssl.SSLError:
                pass  # the client's own refusal: its alert went to the server

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, dial)
            stream = await listeners[0].accept()
            server_side = trio.SSLStream(stream, server, server_side=True)
            try:
                await server_side.do_handshake()
            except trio.BrokenResourceError as exc:
                caught.append(exc.__cause__)
            await stream.aclose()
    await listeners[0].aclose()
    assert caught, "the server side's handshake succeeded"
    return handshake_failure(caught[0])


@pytest.fixture
def server(tmp_path: Path) -> ssl.SSLContext:
    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.ensure(["localhost"])
    paths = ca.paths
    return server_context(paths.server_cert, paths.server_key)


@pytest.mark.trio
async def test_a_client_that_does_not_trust_us_is_told_apart(server: ssl.SSLContext) -> None:
    client = ssl.create_default_context()  # the system CAs: not the appliance's
    reason = await failure_of(server, client)
    assert reason.startswith("the client does not trust this server's certificate")
    assert reason.endswith("[TLSV1_ALERT_UNKNOWN_CA]")


def test_unknown_codes_keep_openssl_s_code() -> None:
    error = ssl.SSLError(1, "[SSL: SOMETHING_NEW] something new (_ssl.c:1)")
    error.reason = "SOMETHING_NEW"  # type: ignore[misc]
    assert handshake_failure(error) == "TLS handshake failed [SOMETHING_NEW]"
    assert handshake_failure(None) == "peer closed during handshake"


def test_a_revoked_client_certificate_says_so_and_is_audited() -> None:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.reason = "CERTIFICATE_VERIFY_FAILED"  # type: ignore[misc]
    error.verify_message = "certificate revoked"  # type: ignore[misc]
    reason = handshake_failure(error)
    assert reason == (
        "the client's certificate failed verification: certificate revoked "
        "[CERTIFICATE_VERIFY_FAILED]"
    )
    assert is_certificate_refusal(reason)
