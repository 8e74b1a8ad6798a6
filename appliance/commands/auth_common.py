"""What the auth-database commands share: opening the database, secrets, the actor, output.

``user``, ``key``, ``client``, ``db``, ``audit``, ``curve``, ``token`` and
the audit entries of ``cert`` and ``table`` use these: :func:`open_auth`
(one way to open the auth database from the command line), reading a secret
without argv, the audit actor, turning an :class:`~auth.errors.AuthError`
into one line on stderr, and ``--json`` or a table. The CLI's general
helpers (the handler shape, error exits, tables and JSON) are in
:mod:`appliance.commands.common`; this module adds only what the
auth-database commands need on top of them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from appliance.commands.common import Handler, Subparsers, guarded, print_json, print_table
from appliance.commands.state import require_auth_database
from appliance.config import Config
from auth.errors import AuthError

if TYPE_CHECKING:
    # SQLAlchemy and Alembic take most of a second to import: only the auth
    # commands load them, when they run.
    from auth.database import AuthDatabase

__all__ = [
    "add_command",
    "add_group",
    "admin",
    "auth_guarded",
    "open_auth",
    "print_fields",
    "print_item",
    "print_items",
    "read_secret",
    "when",
    "yes_no",
]

#: Turns an :class:`AuthError` into one line on stderr and exit code 1.
auth_guarded: Final[Callable[[Handler], Handler]] = guarded(AuthError)


@contextmanager
def open_auth(config: Config, *, create: bool = False) -> Iterator[AuthDatabase]:
    """``config``'s auth database, its schema checked (the embedded default brought to head).

    Args:
        create: the command adds something: it may create the embedded
            database inside an existing state directory. Otherwise a missing
            database (or state directory) is an error, and nothing is created
            (:func:`appliance.commands.state.require_auth_database`).

    The hold is given back when the block ends.
    """
    from auth.database import open_database

    require_auth_database(config, create=create)
    with open_database(config.auth_settings) as database:
        yield database


def admin() -> str:
    """The audit log's actor for this command: ``cli:<os user>`` (and who ran sudo)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = f"uid {os.getuid()}"
    sudo = os.environ.get("SUDO_USER")
    if sudo and sudo != user:
        return f"cli:{user} (sudo by {sudo})"
    return f"cli:{user}"


def read_secret(from_stdin: bool, prompt: str) -> bytes:
    """A secret from the first line of stdin, or typed twice at a prompt (never argv)."""
    if from_stdin:
        value = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        value = getpass.getpass(f"{prompt}: ")
        if value != getpass.getpass("again: "):
            raise AuthError("the two entries differ; nothing changed")
    return value.encode("utf-8")


def when(value: dt.datetime | None, empty: str = "") -> str:
    """A timestamp for a table: ``2025-01-31 12:00:00Z``."""
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else empty


def yes_no(value: bool) -> str:
    """``yes`` or ``no``."""
    return "yes" if value else "no"


class _Document(Protocol):
    def to_json(self) -> dict[str, Any]: ...


_Item = TypeVar("_Item", bound=_Document)


def print_item(
    item: _Document, as_json: bool, *lines: str, extra: Mapping[str, Any] | None = None
) -> None:
    """``item``'s JSON document (plus the keys of ``extra``) for ``--json``, else ``lines``."""
    if as_json:
        print_json({**item.to_json(), **(extra or {})})
        return
    for line in lines:
        print(line)


def print_fields(item: _Document, as_json: bool, rows: Sequence[Sequence[Any]]) -> None:
    """``item``'s JSON document for ``--json``, else a field/value table of ``rows``."""
    if as_json:
        print_json(item.to_json())
    else:
        print_table(["field", "value"], rows)


def print_items(
    items: Sequence[_Item],
    as_json: bool,
    headers: Sequence[str],
    row: Callable[[_Item], Sequence[Any]],
) -> None:
    """A JSON list of ``items`` for ``--json``, else a table of ``row(item)`` under ``headers``."""
    if as_json:
        print_json([item.to_json() for item in items])
    else:
        print_table(headers, [row(item) for item in items])


def add_group(commands: Subparsers, name: str, help_text: str) -> Subparsers:
    """Add the command group ``name``; its subcommands go on what this returns."""
    group = commands.add_parser(name, help=help_text)
    return group.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def add_command(
    sub: Subparsers,
    common: argparse.ArgumentParser,
    name: str,
    func: Handler,
    help_text: str,
    *,
    json_output: bool = False,
    aliases: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """Add one subcommand that runs ``func`` (guarded), optionally with ``--json``."""
    # No abbreviations: "--password X" must never be taken for "--password-stdin".
    parser = sub.add_parser(
        name, help=help_text, parents=[common], aliases=list(aliases), allow_abbrev=False
    )
    parser.set_defaults(func=auth_guarded(func))
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser
