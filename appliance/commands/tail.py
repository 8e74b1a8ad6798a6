"""``appliance tail``: the live stream of committed events, in the terminal.

It connects to the WebSocket listener's ``/tail`` endpoint like any other
client, with an ``admin`` token (``--token-stdin``, or ``$APPLIANCE_TOKEN``;
never argv), verifying TLS with the appliance's CA from the state directory
(``--ca`` for an operator's own). One line per event::

    2025-01-31T12:00:00.123456789Z forward app.web user=alice {"message":"hello"}

``--json`` prints the tail's JSON messages as they come. When the terminal
falls behind, the appliance drops events rather than slow ingest, and the
count is printed on stderr.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import urlencode, urlsplit

import orjson

from appliance.commands.auth_common import Subparsers
from appliance.config import Config, WebSocketListenerConfig

__all__ = ["TOKEN_ENV", "add_parser", "default_url", "format_event", "stream_tail"]

#: Environment variable that may hold the token.
TOKEN_ENV: Final = "APPLIANCE_TOKEN"  # noqa: S105 -- a variable's name
#: Seconds to connect and finish the TLS and WebSocket handshakes, and to close.
CONNECT_TIMEOUT_SECONDS: Final = 30.0
#: Largest tail message accepted, in bytes (an event with its record).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


def default_url(config: Config) -> str:
    """``wss://host:port/tail`` of the first WebSocket listener of ``config``."""
    for listener in config.listeners:
        if isinstance(listener, WebSocketListenerConfig):
            host = listener.host
            if host in ("0.0.0.0", "::", ""):  # noqa: S104 -- a comparison, not a bind
                host = "127.0.0.1"
            scheme = "wss" if listener.tls else "ws"
            shown = f"[{host}]" if ":" in host else host
            return f"{scheme}://{shown}:{listener.port}/tail"
    raise ValueError("no websocket listener in the configuration: give --url")


def format_event(document: dict[str, object]) -> str:
    """One terminal line of a tail event."""
    record = orjson.dumps(document.get("record")).decode()
    return (
        f"{document.get('time')} {document.get('protocol')} {document.get('tag')} "
        f"{document.get('source')} {record}"
    )


async def stream_tail(
    url: str,
    token: str,
    ssl_context: ssl.SSLContext | None,
    *,
    out: Callable[[str], None],
    err: Callable[[str], None],
    limit: int | None = None,
) -> int:
    """Print the tail at ``url`` until the server closes it (or ``limit`` events); exit code."""
    from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

    headers = [(b"authorization", f"Bearer {token}".encode())]
    seen = 0
    try:
        async with open_websocket_url(
            url,
            ssl_context,
            extra_headers=headers,
            max_message_size=MAX_MESSAGE_BYTES,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            disconnect_timeout=CONNECT_TIMEOUT_SECONDS,
        ) as ws:
            while limit is None or seen < limit:
                message = await ws.get_message()
                document = orjson.loads(message)
                if isinstance(document, dict) and "dropped" in document:
                    err(f"appliance tail: {document['dropped']} events dropped (fell behind)")
                    continue
                seen += 1
                out(message if isinstance(message, str) else message.decode())
    except ConnectionRejected as exc:
        reason = exc.body.decode("utf-8", "replace") if exc.body else ""
        err(f"appliance tail: refused ({exc.status_code}): {reason}")
        return 1
    except ConnectionClosed as exc:
        closed = exc.reason
        err(f"appliance tail: closed by the appliance: {closed.reason if closed else ''}")
        return 0
    except (OSError, ssl.SSLError) as exc:
        err(f"appliance tail: cannot connect to {url}: {exc}")
        return 1
    return 0


def _run(args: argparse.Namespace, config: Config) -> int:
    import trio

    if args.token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        print(f"appliance: give an admin token on stdin (--token-stdin) or in ${TOKEN_ENV}",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        base = args.url or default_url(config)
    except ValueError as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return 1
    query = {k: v for k, v in (("tag", args.tag), ("protocol", args.protocol)) if v}
    parts = urlsplit(base)
    url = parts._replace(path=parts.path or "/tail", query=urlencode(query)).geturl()
    context: ssl.SSLContext | None = None
    if parts.scheme == "wss":
        ca = Path(args.ca) if args.ca else config.pki_dir / "ca.pem"
        context = ssl.create_default_context(cafile=str(ca))

    def out(message: str) -> None:
        if args.json:
            print(message, flush=True)
            return
        document = orjson.loads(message)
        print(format_event(document) if isinstance(document, dict) else message, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    return trio.run(lambda: stream_tail(url, token, context, out=out, err=err, limit=args.count))


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``tail``."""
    tail = commands.add_parser(
        "tail", help="print committed events as they arrive", parents=[common], allow_abbrev=False
    )
    tail.set_defaults(func=_run)
    tail.add_argument("--tag", metavar="PREFIX", help="only tags that start with PREFIX")
    tail.add_argument(
        "--protocol", metavar="P", help="only this protocol (forward, websocket, ...)"
    )
    tail.add_argument("--url", help="wss://host:port/tail (default: the configured listener)")
    tail.add_argument("--ca", metavar="FILE", help="CA of the server (default: <state>/pki/ca.pem)")
    tail.add_argument(
        "--token-stdin", action="store_true", help=f"read the token from stdin (else ${TOKEN_ENV})"
    )
    tail.add_argument("--json", action="store_true", help="print the JSON messages as they come")
    tail.add_argument("--count", type=int, metavar="N", help="stop after N events")
