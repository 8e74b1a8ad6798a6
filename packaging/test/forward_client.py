"""A Fluentd forward client for scripts/package-test.sh: send events over TLS, wait for the ack.

Sends one PackedForward request, ``[tag, <packed entries as bin>, {"chunk": ..., "size": n}]``,
and exits 0 once the appliance answers ``{"ack": chunk}``: the events are committed.
With ``--handshake`` it first answers the server's HELO with a PING (shared key and,
when the server asks for it, username and password, all from the environment so
that no secret is in argv) and checks the PONG's digest.

    python forward_client.py --port 24224 --ca ca.pem --tag pkg.test --events 10
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import socket
import ssl
import sys
import time
from typing import Any

import msgpack

#: Seconds for the connection, the handshake and the ack together.
TIMEOUT_SECONDS = 30.0


def _sha512_hex(*parts: bytes) -> str:
    digest = hashlib.sha512()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def _read_message(sock: ssl.SSLSocket, unpacker: msgpack.Unpacker) -> Any:
    while True:
        for message in unpacker:
            return message
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        unpacker.feed(data)


def _handshake(sock: ssl.SSLSocket, unpacker: msgpack.Unpacker) -> None:
    helo = _read_message(sock, unpacker)
    if not (isinstance(helo, list) and len(helo) == 2 and helo[0] == "HELO"):
        raise ValueError(f"expected HELO, got {helo!r}")
    options = helo[1]
    nonce, auth_salt = options["nonce"], options.get("auth", b"")
    shared_key = os.environ["APPLIANCE_TEST_SHARED_KEY"].encode()
    hostname = socket.gethostname()
    salt = secrets.token_bytes(16)
    username, password_digest = "", ""
    if auth_salt:
        username = os.environ["APPLIANCE_TEST_USER"]
        password = os.environ["APPLIANCE_TEST_PASSWORD"].encode()
        password_digest = _sha512_hex(auth_salt, username.encode(), password)
    ping_digest = _sha512_hex(salt, hostname.encode(), nonce, shared_key)
    ping = ["PING", hostname, salt, ping_digest, username, password_digest]
    sock.sendall(msgpack.packb(ping, use_bin_type=True))
    pong = _read_message(sock, unpacker)
    if not (isinstance(pong, list) and len(pong) == 5 and pong[0] == "PONG"):
        raise ValueError(f"expected PONG, got {pong!r}")
    if pong[1] is not True:
        raise PermissionError(f"handshake refused: {pong[2]}")
    expected = _sha512_hex(salt, pong[3].encode(), nonce, shared_key)
    if pong[4] != expected:
        raise PermissionError("the PONG digest does not match the shared key")


def send(args: argparse.Namespace) -> dict[str, Any]:
    """Send ``args.events`` events in one PackedForward request; return what was acked."""
    context = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        context.load_cert_chain(args.cert)
    now = int(time.time())
    entries = b"".join(
        msgpack.packb([now, {"message": f"package-test {args.run} #{i}", "n": i}])
        for i in range(args.events)
    )
    chunk = base64.b64encode(secrets.token_bytes(16)).decode()
    request = [args.tag, entries, {"chunk": chunk, "size": args.events}]
    with (
        socket.create_connection((args.host, args.port), timeout=TIMEOUT_SECONDS) as raw,
        context.wrap_socket(raw, server_hostname=args.server_name) as sock,
    ):
        unpacker = msgpack.Unpacker(raw=False)
        if args.handshake:
            _handshake(sock, unpacker)
        sock.sendall(msgpack.packb(request, use_bin_type=True))
        reply = _read_message(sock, unpacker)
        version = sock.version()
        server_cert = sock.getpeercert(binary_form=True) or b""
    if reply != {"ack": chunk}:
        raise ValueError(f"expected {{'ack': {chunk!r}}}, got {reply!r}")
    return {
        "acked": chunk,
        "events": args.events,
        "tls": version,
        "server_cert_sha256": hashlib.sha256(server_cert).hexdigest(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=24224)
    parser.add_argument("--server-name", default="localhost", help="name the cert must match")
    parser.add_argument("--ca", required=True, help="the appliance's CA certificate (PEM)")
    parser.add_argument("--cert", help="client key and certificate chain (PEM), for mutual TLS")
    parser.add_argument("--tag", default="package.test")
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--run", default="", help="text put in every event's message")
    parser.add_argument(
        "--handshake",
        action="store_true",
        help="do the forward handshake: APPLIANCE_TEST_SHARED_KEY, and APPLIANCE_TEST_USER "
        "and APPLIANCE_TEST_PASSWORD when the server asks for a user",
    )
    args = parser.parse_args()
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while True:
        try:
            result = send(args)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the service is still starting
            continue
        except (OSError, ValueError, KeyError) as exc:
            print(f"forward_client: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(result))
        return 0


if __name__ == "__main__":
    sys.exit(main())
