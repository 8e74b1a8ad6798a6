"""What the command modules share: config loading, the handler shape, error exits and output.

A command module adds its group with ``add_parser(commands, common)`` and
runs as a :data:`Handler`: the parsed arguments and the loaded config in, an
exit code out (0 success, 1 a failure its one line on stderr explains, 2
usage). Output is an aligned table for people or JSON for scripts, on the
``sys.stdout`` of the moment (so ``redirect_stdout`` applies). The clients of
the service's own listeners (``status``, ``tail``) find the listener, its CA
and their bearer token the same way.

Nothing here imports trio, deltalake, pyspark or SQLAlchemy: a command loads
those when it runs.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO, TypeAlias

from appliance.config import Config, default_config, load_config

__all__ = [
    "ADMIN_TOKEN_ENV",
    "CONFIG_ENV",
    "Handler",
    "NoRedirect",
    "Subparsers",
    "add_remote_option",
    "admin_token",
    "admin_url",
    "ca_context",
    "config_source",
    "fail",
    "guarded",
    "listener_host",
    "load",
    "non_negative_int",
    "positive_int",
    "print_json",
    "print_table",
    "read_token",
    "token_may_go_to",
]

#: Environment variable naming the config file when --config is not given.
CONFIG_ENV: Final = "APPLIANCE_CONFIG"
#: Environment variable that may hold the admin listener's bearer token.
ADMIN_TOKEN_ENV: Final = "APPLIANCE_ADMIN_TOKEN"  # noqa: S105 -- a variable's name

#: What every command function looks like: parsed arguments and config in, exit code out.
Handler = Callable[[argparse.Namespace, Config], int]
#: The object ``add_subparsers`` returns (not subscriptable at run time).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

#: Addresses a listener binds to that a client cannot connect to.
_WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 -- compared, not bound


# -- config ---------------------------------------------------------------------------------


def config_source(path: str | None) -> str | None:
    """The config file to read and where its name came from; None: the embedded default."""
    if path:
        return path
    env = os.environ.get(CONFIG_ENV)
    return f"{env} (${CONFIG_ENV})" if env else None


def load(path: str | None) -> Config:
    """The config of ``--config`` (``path``), else of ``$APPLIANCE_CONFIG``, else the default."""
    chosen = path or os.environ.get(CONFIG_ENV)
    return load_config(Path(chosen)) if chosen else default_config()


# -- errors ---------------------------------------------------------------------------------


def fail(message: str, code: int = 1) -> int:
    """Print ``appliance: message`` on stderr; returns ``code`` for the command to exit with."""
    print(f"appliance: {message}", file=sys.stderr)
    return code


def guarded(*errors: type[Exception]) -> Callable[[Handler], Handler]:
    """A decorator that turns ``errors`` raised by a handler into one line and exit code 1."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def run(args: argparse.Namespace, config: Config) -> int:
            try:
                return handler(args, config)
            except errors as exc:
                return fail(str(exc))

        return run

    return wrap


# -- output ---------------------------------------------------------------------------------


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None
) -> None:
    """Print rows under headers, columns aligned; an empty table says so."""
    out = out or sys.stdout
    if not rows:
        print("(none)", file=out)
        return
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for number, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
        if number == 0:
            print("  ".join("-" * w for w in widths), file=out)


def print_json(value: Any, out: TextIO | None = None) -> None:
    """Print a JSON document for scripts."""
    print(json.dumps(value, indent=2, default=str), file=out or sys.stdout)


# -- arguments ------------------------------------------------------------------------------


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: a whole number greater than 0."""
    value = _whole_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError("cannot be negative")
    return value


def add_remote_option(parser: argparse.ArgumentParser) -> None:
    """``--remote``: the Spark Connect server of the commands that build a Spark session."""
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="Spark Connect server (default: [spark] remote, else a local delta-spark session)",
    )


# -- clients of the service's own listeners -------------------------------------------------


def listener_host(host: str, *, ipv6_any: str = "::1") -> str:
    """The host of a URL that reaches a listener bound to ``host``.

    A wildcard address becomes the loopback address (``ipv6_any`` for ``::``),
    and an IPv6 address is bracketed.
    """
    if host in _WILDCARD_HOSTS:
        host = ipv6_any if host == "::" else "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def ca_context(ca: str | None, config: Config, *, system_if_missing: bool) -> ssl.SSLContext:
    """A client TLS context that trusts ``ca`` (``--ca``), else the appliance's own CA.

    Args:
        system_if_missing: when the CA file does not exist, trust the system's
            CAs instead (otherwise loading it fails with :class:`OSError`).
    """
    path = Path(ca) if ca else config.pki_dir / "ca.pem"
    if system_if_missing and not path.exists():
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=str(path))


def read_token(from_stdin: bool, env: str) -> str | None:
    """A bearer token from the first line of stdin (``--token-stdin``), else ``$env``; not argv."""
    if from_stdin:
        return sys.stdin.readline().strip() or None
    return os.environ.get(env, "").strip() or None


# -- the admin listener's clients (status, tail) ----------------------------------------------


def admin_url(config: Config) -> str:
    """``http(s)://host:port`` of the configured admin listener."""
    admin = config.admin
    return f"{'https' if admin.tls else 'http'}://{listener_host(admin.host)}:{admin.port}"


def admin_token(from_stdin: bool, config: Config) -> str | None:
    """The admin listener's bearer token: stdin (``--token-stdin``), ``$APPLIANCE_ADMIN_TOKEN``,
    else the configured ``token_file`` when this user may read it; never argv."""
    token = read_token(from_stdin, ADMIN_TOKEN_ENV)
    if token is not None or from_stdin:
        return token
    path = config.admin.token_file
    if path is not None:
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None  # not this user's to read: the 401 says what to do
    return None


def token_may_go_to(url: str) -> bool:
    """Whether a bearer token may be sent to ``url``: over https, or to a loopback address."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https":
        return True
    host = parsed.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect (it would carry the token): the answer is returned as it is."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
