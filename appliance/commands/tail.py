"""``appliance tail``: the live stream of committed events, in the terminal.

Two sources serve the same events, each when its commit succeeded:

* the admin listener's ``/tail`` (``http(s)://host:port/tail``), which every
  running appliance has: one JSON document a line. Its token is the admin
  listener's, found as ``appliance status`` finds it (``--token-stdin``,
  ``$APPLIANCE_ADMIN_TOKEN``, or the configured ``token_file`` when this user
  may read it), sent only over https or to a loopback address, and never
  along a redirect (none is followed);
* a WebSocket listener's ``/tail`` (``ws(s)://host:port/tail``), with an
  ``admin`` token of the auth database (``--token-stdin`` or
  ``$APPLIANCE_TOKEN``).

Which one: the scheme of ``--url``; else ``--admin`` asks for the admin
listener; else the first WebSocket listener of the configuration, or the
admin listener when there is none. TLS is verified with the appliance's CA
from the state directory (``--ca`` for an operator's own). No token ever
comes from argv. One line per event::

    2025-01-31T12:00:00.123456789Z forward app.web user=alice {"message":"hello"}

``--json`` prints the documents as they come. When the terminal falls
behind, the appliance drops events rather than slow ingest, and the count is
printed on stderr.
"""

from __future__ import annotations

import argparse
import http.client
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Final
from urllib.parse import urlencode, urlsplit

import orjson

from appliance.commands.common import (
    NoRedirect,
    Subparsers,
    admin_token,
    admin_url,
    ca_context,
    fail,
    listener_host,
    read_token,
    token_may_go_to,
)
from appliance.config import Config, WebSocketListenerConfig

__all__ = [
    "TOKEN_ENV",
    "add_parser",
    "default_url",
    "format_event",
    "stream_admin_tail",
    "stream_tail",
    "tail_url",
]

#: Environment variable that may hold the WebSocket listener's (auth database) token.
TOKEN_ENV: Final = "APPLIANCE_TOKEN"  # noqa: S105 -- a variable's name
#: Seconds to connect and finish the TLS and WebSocket handshakes, and to close.
CONNECT_TIMEOUT_SECONDS: Final = 30.0
#: Seconds the admin listener's ``/tail`` may send nothing (it sends an empty
#: line every 15 s without events) before the appliance is taken for gone.
ADMIN_READ_TIMEOUT_SECONDS: Final = 60.0
#: Largest tail message accepted, in bytes (an event with its record).
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024

_ADMIN_SCHEMES: Final = ("http", "https")
_WEBSOCKET_SCHEMES: Final = ("ws", "wss")


def default_url(config: Config) -> str:
    """``wss://host:port/tail`` of the first WebSocket listener of ``config``."""
    for listener in config.listeners:
        if isinstance(listener, WebSocketListenerConfig):
            scheme = "wss" if listener.tls else "ws"
            host = listener_host(listener.host, ipv6_any="127.0.0.1")
            return f"{scheme}://{host}:{listener.port}/tail"
    raise ValueError("no websocket listener in the configuration: give --url")


def tail_url(url: str | None, config: Config, *, admin: bool) -> str:
    """The tail to read: ``url``, else (``admin`` or no WebSocket listener) the admin listener's.

    Raises:
        ValueError: ``url`` has another scheme, or nothing serves a tail.
    """
    if url:
        scheme = urlsplit(url).scheme
        if scheme not in _ADMIN_SCHEMES + _WEBSOCKET_SCHEMES:
            raise ValueError(f"--url must be http(s):// or ws(s)://, not {url!r}")
        if admin and scheme not in _ADMIN_SCHEMES:
            raise ValueError("--admin reads the admin listener: its --url is http(s)://")
        return url
    if not admin:
        try:
            return default_url(config)
        except ValueError:
            pass  # no WebSocket listener: the admin listener's tail
    if not config.admin.enabled:
        raise ValueError(
            "no websocket listener in the configuration and the admin listener is off "
            "([admin] enabled = false): give --url"
        )
    return admin_url(config) + "/tail"


def format_event(document: dict[str, object]) -> str:
    """One terminal line of a tail event."""
    record = orjson.dumps(document.get("record")).decode()
    return (
        f"{document.get('time')} {document.get('protocol')} {document.get('tag')} "
        f"{document.get('source')} {record}"
    )


def _dropped(err: Callable[[str], None], document: object) -> bool:
    """Whether ``document`` is a gap marker (said on stderr)."""
    if isinstance(document, dict) and "dropped" in document:
        err(f"appliance tail: {document['dropped']} events dropped (fell behind)")
        return True
    return False


def stream_admin_tail(
    url: str,
    token: str | None,
    ssl_context: ssl.SSLContext | None,
    *,
    out: Callable[[str], None],
    err: Callable[[str], None],
    limit: int | None = None,
) -> int:
    """Print the admin listener's tail at ``url`` until it ends (or ``limit`` events); exit code.

    Blocking. The caller has checked that ``token`` may go to ``url``
    (:func:`~appliance.commands.common.token_may_go_to`); no redirect is followed.
    """
    request = urllib.request.Request(url)  # noqa: S310 -- http(s) only (tail_url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    opener = urllib.request.build_opener(
        NoRedirect(), urllib.request.HTTPSHandler(context=ssl_context)
    )
    seen = 0
    try:
        with opener.open(request, timeout=ADMIN_READ_TIMEOUT_SECONDS) as response:
            while limit is None or seen < limit:
                line = response.readline(MAX_MESSAGE_BYTES + 1)
                if not line:
                    err("appliance tail: closed by the appliance")
                    return 0
                if len(line) > MAX_MESSAGE_BYTES:
                    err(f"appliance tail: a line longer than {MAX_MESSAGE_BYTES} bytes")
                    return 1
                text = line.strip()
                if not text:
                    continue  # the listener's sign of life
                if _dropped(err, orjson.loads(text)):
                    continue
                seen += 1
                out(text.decode())
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            err(f"appliance tail: {url} answered a redirect ({exc.code}), which is not followed")
        else:
            reason = exc.read(1024).decode("utf-8", "replace").strip()
            err(f"appliance tail: refused ({exc.code}): {reason}")
        return 1
    except TimeoutError:
        err(f"appliance tail: nothing from {url} for {ADMIN_READ_TIMEOUT_SECONDS:g}s")
        return 1
    except orjson.JSONDecodeError as exc:
        err(f"appliance tail: {url} sent a line that is not JSON: {exc}")
        return 1
    except http.client.HTTPException as exc:
        err(f"appliance tail: the stream from {url} broke off: {exc!r}")
        return 1
    except (urllib.error.URLError, OSError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        err(f"appliance tail: cannot reach the admin listener at {url}: {why}")
        return 1
    return 0


async def stream_tail(
    url: str,
    token: str,
    ssl_context: ssl.SSLContext | None,
    *,
    out: Callable[[str], None],
    err: Callable[[str], None],
    limit: int | None = None,
) -> int:
    """Print the WebSocket tail at ``url`` until the server closes it (or ``limit`` events)."""
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
                if _dropped(err, orjson.loads(message)):
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
    try:
        base = tail_url(args.url, config, admin=args.admin)
    except ValueError as exc:
        return fail(str(exc), 2 if args.url else 1)
    query = {k: v for k, v in (("tag", args.tag), ("protocol", args.protocol)) if v}
    parts = urlsplit(base)
    url = parts._replace(path=parts.path or "/tail", query=urlencode(query)).geturl()

    def out(message: str) -> None:
        if args.json:
            print(message, flush=True)
            return
        document = orjson.loads(message)
        print(format_event(document) if isinstance(document, dict) else message, flush=True)

    def err(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if parts.scheme in _ADMIN_SCHEMES:
        token_for_admin = admin_token(args.token_stdin, config)
        if token_for_admin and not token_may_go_to(url):
            return fail(
                f"not sending the admin token in clear to {url}: use https:// (with --ca) "
                "or a loopback address",
                2,
            )
        context = (
            ca_context(args.ca, config, system_if_missing=True) if parts.scheme == "https" else None
        )
        return stream_admin_tail(url, token_for_admin, context, out=out, err=err, limit=args.count)

    import trio

    token = read_token(args.token_stdin, TOKEN_ENV)
    if token is None:
        return fail(f"give an admin token on stdin (--token-stdin) or in ${TOKEN_ENV}")
    ws_context: ssl.SSLContext | None = None
    if parts.scheme == "wss":
        ws_context = ca_context(args.ca, config, system_if_missing=False)
    return trio.run(lambda: stream_tail(url, token, ws_context, out=out, err=err, limit=args.count))


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
    tail.add_argument(
        "--url",
        help="http(s)://host:port/tail (the admin listener) or wss://host:port/tail (a "
        "websocket listener); default: the first websocket listener, else the admin listener",
    )
    tail.add_argument(
        "--admin",
        action="store_true",
        help="read the admin listener's tail even when a websocket listener is configured",
    )
    tail.add_argument("--ca", metavar="FILE", help="CA of the server (default: <state>/pki/ca.pem)")
    tail.add_argument(
        "--token-stdin",
        action="store_true",
        help=f"read the token from stdin (else ${TOKEN_ENV} for a websocket listener; for the "
        "admin listener $APPLIANCE_ADMIN_TOKEN or its token_file)",
    )
    tail.add_argument("--json", action="store_true", help="print the JSON messages as they come")
    tail.add_argument("--count", type=int, metavar="N", help="stop after N events")
