"""Hostile peers of a listener behind a balancer (``proxy_protocol = true``), next to a good one.

The listener ``forward_proxied`` trusts 127.0.0.1 and 127.1.0.0/16 (the
hostile clients' addresses); its good client sends a PROXY v2 header naming
192.0.2.44 before TLS. What must hold (appliance/server/proxied.py,
docs/proxy-protocol.md): a connection from an untrusted address is refused
before a byte is read; one whose header is not a PROXY header, is too
large, or does not arrive within ``proxy_header_timeout_seconds`` is closed
with a logged reason; nothing of theirs is stored; the good client's rows
name its real client.
"""

from __future__ import annotations

import socket
import struct
import time

from tests.hostile.case import Case, hostile_case
from tests.hostile.clients import proxy_v2_header, read_until_closed
from tests.hostile.limits import PROXIED_CLIENT, PROXY_HEADER_TIMEOUT_SECONDS
from tests.hostile.service import HostileService, rows_from

LISTENER = "forward_proxied"
#: The 12-byte v2 signature, then version 2 / PROXY and TCP over IPv4 (HAProxy's §2.2).
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def raw(case: Case, source: str | None = None) -> tuple[socket.socket, str]:
    sock = socket.create_connection(
        ("127.0.0.1", case.service.port(LISTENER)), timeout=30,
        source_address=(source or case.address, 0),
    )  # fmt: skip
    host, port = sock.getsockname()[:2]
    return sock, f"{host}:{port}"


def closed_with(case: Case, sock: socket.socket, peer: str, events: set[str]) -> dict[str, str]:
    _, closed = read_until_closed(sock, 30)
    sock.close()
    assert closed, f"{peer} was not closed"
    line = case.log_for(peer, events)
    assert line is not None, case.service.log_tail(case.mark)
    case.expect_no_rows = True
    return line


def test_the_good_clients_rows_name_the_client_behind_the_balancer(
    service: HostileService,
) -> None:
    with hostile_case(service, LISTENER) as case:
        time.sleep(0.5)  # a few good batches
    assert rows_from(case.final_rows or [], PROXIED_CLIENT), "no row names the relayed client"


def test_a_connection_from_an_untrusted_address_is_refused(service: HostileService) -> None:
    with hostile_case(service, LISTENER) as case:
        sock, peer = raw(case, source="127.2.0.1")
        sock.sendall(proxy_v2_header("203.0.113.9"))
        line = closed_with(case, sock, peer, {"connection.refused"})
        assert "not a trusted proxy" in line["reason"]


def test_a_connection_that_is_not_a_proxy_header_is_refused(service: HostileService) -> None:
    with hostile_case(service, LISTENER) as case:
        for data in (b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00\x05hello", b"\x00" * 64):
            sock, peer = raw(case)
            sock.sendall(data)
            closed_with(case, sock, peer, {"proxy.refused"})


def test_a_v2_header_announcing_a_huge_payload_is_refused_at_its_length(
    service: HostileService,
) -> None:
    """The 16-byte v2 header says 65,535 bytes follow: refused before any of them is read."""
    with hostile_case(service, LISTENER) as case:
        sock, peer = raw(case)
        sock.sendall(V2_SIGNATURE + b"\x21\x11" + struct.pack(">H", 0xFFFF))
        line = closed_with(case, sock, peer, {"proxy.refused"})
        assert "length" in line["reason"].lower() or "bytes" in line["reason"], line


def test_a_header_that_never_finishes_is_cut_off_at_its_deadline(
    service: HostileService,
) -> None:
    with hostile_case(service, LISTENER) as case:
        sock, peer = raw(case)
        sock.sendall(proxy_v2_header("203.0.113.9")[:14])  # and then nothing
        line = closed_with(case, sock, peer, {"proxy.incomplete"})
        assert f"within {PROXY_HEADER_TIMEOUT_SECONDS}" in line["reason"]


def test_a_valid_header_then_no_tls_is_a_tls_refusal_for_that_client(
    service: HostileService,
) -> None:
    """After the header the connection is the named client's: its failure is logged as theirs."""
    with hostile_case(service, LISTENER) as case:
        sock, _ = raw(case)
        sock.sendall(proxy_v2_header("203.0.113.10", 5555) + b"[not tls]" * 10)
        closed_with(case, sock, "203.0.113.10:5555", {"tls.plaintext_client"})
