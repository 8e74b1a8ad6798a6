"""``appliance user|key|client|db|audit ...``: the auth database from the command line.

This module holds what the groups share (opening the store, reading a secret
without argv, the audit actor, error handling, ``--json`` or a table) and the ``db`` and ``audit``
groups; ``users``, ``keys`` and ``networks`` hold the others. Secrets come
from a prompt or stdin, never from argv, and are never printed, except a
generated shared key, once. Errors exit 1 with one line on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import getpass
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from appliance import console
from appliance.commands.state import require_auth_database, require_state_dir, sqlite_file
from appliance.config import Config
from auth.errors import AuthError

if TYPE_CHECKING:
    # SQLAlchemy and Alembic take most of a second to import: only the auth
    # commands load them, when they run.
    from auth.schema import SchemaStatus
    from auth.store import SqlCredentialStore

__all__ = [
    "Handler",
    "Subparsers",
    "add_command",
    "add_group",
    "add_parser",
    "admin",
    "guarded",
    "open_store",
    "prepared_store",
    "print_fields",
    "print_item",
    "print_items",
    "print_json",
    "print_table",
    "read_secret",
    "when",
    "yes_no",
]

#: What every command function looks like: parsed arguments and config in, exit code out.
Handler = Callable[[argparse.Namespace, Config], int]
#: The object ``add_subparsers`` returns (not subscriptable at run time).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def guarded(func: Handler) -> Handler:
    """Turn an :class:`AuthError` into one line on stderr and exit code 1."""

    @functools.wraps(func)
    def run(args: argparse.Namespace, config: Config) -> int:
        try:
            return func(args, config)
        except AuthError as exc:
            print(f"appliance: {exc}", file=sys.stderr)
            return 1

    return run


class _Closable(Protocol):
    def close(self) -> None: ...


_Store = TypeVar("_Store", bound=_Closable)


@contextmanager
def prepared_store(
    config: Config, make: Callable[[str], _Store], *, create: bool = False
) -> Iterator[_Store]:
    """``make(url)`` on ``config``'s auth database; the embedded default is brought to head first.

    Args:
        create: the command adds something: it may create the embedded
            database inside an existing state directory. Otherwise a missing
            database (or state directory) is an error, and nothing is created
            (:func:`appliance.commands.state.require_auth_database`).

    The store is closed when the block ends.
    """
    from auth import schema

    require_auth_database(config, create=create)
    url = config.auth_database_url
    # The same rule as the service: only the embedded default upgrades itself.
    schema.prepare(url, upgrade_in_place=config.auth.database_url is None)
    store = make(url)
    try:
        yield store
    finally:
        store.close()


def open_store(
    config: Config, *, create: bool = False
) -> AbstractContextManager[SqlCredentialStore]:
    """The credential store of ``config``; the embedded default is brought to head first.

    ``create``: as for :func:`prepared_store`.
    """
    from auth.store import SqlCredentialStore

    return prepared_store(
        config,
        lambda url: SqlCredentialStore(url, config.auth_secret_key_file, pool_size=1),
        create=create,
    )


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


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """:func:`appliance.console.print_table` on the current ``sys.stdout``."""
    # Looked up at call time, so redirect_stdout (tests, embedding) applies.
    console.print_table(headers, rows, out=sys.stdout)


def print_json(value: Any) -> None:
    """:func:`appliance.console.print_json` on the current ``sys.stdout``."""
    console.print_json(value, out=sys.stdout)


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
    parser.set_defaults(func=guarded(func))
    if json_output:
        parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


# -- db -----------------------------------------------------------------------------------


def _status_json(url: str, found: SchemaStatus) -> dict[str, Any]:
    from auth.db import display_url

    return {
        "url": display_url(url),
        "current": list(found.current),
        "head": found.head,
        "up_to_date": found.up_to_date,
    }


def _db_current(args: argparse.Namespace, config: Config) -> int:
    from auth import schema
    from auth.db import display_url

    url = config.auth_database_url
    if config.auth.database_url is None:
        require_state_dir(config)
    database = sqlite_file(url)
    exists = database is None or database.exists()
    # A missing SQLite file is reported as an empty database, not created by status().
    found = schema.status(url) if exists else schema.SchemaStatus((), schema.head_revision())
    if args.json:
        print_json({**_status_json(url, found), "exists": exists})
    else:
        if not exists:
            state = f"no database file yet: {schema.UPGRADE_ADVICE}"
        elif found.up_to_date:
            state = "up to date"
        elif not found.known:
            state = "at a revision this appliance does not know (newer?)"
        else:
            state = f"behind: {schema.UPGRADE_ADVICE}"
        print_table(
            ["field", "value"],
            [
                ["database", display_url(url)],
                ["current", ", ".join(found.current) or "(empty)"],
                ["head", found.head],
                ["status", state],
            ],
        )
    return 1 if args.check and not found.up_to_date else 0


def _db_upgrade(args: argparse.Namespace, config: Config) -> int:
    from auth import schema
    from auth.db import display_url

    url = config.auth_database_url
    if args.sql:
        print(schema.upgrade_sql(url, args.revision, start=args.start), end="")
        return 0
    before = schema.status(url)
    after = schema.upgrade(url, args.revision)
    old = ", ".join(before.current) or "(empty)"
    new = ", ".join(after.current) or "(empty)"
    if before.current == after.current:
        print(f"{display_url(url)}: already at {new}")
    else:
        print(f"{display_url(url)}: upgraded from {old} to {new}")
    return 0


def _db_downgrade(args: argparse.Namespace, config: Config) -> int:
    from auth import schema
    from auth.db import display_url

    url = config.auth_database_url
    require_auth_database(config, create=False)
    if not args.yes:
        raise AuthError(
            f"a downgrade drops tables and the credentials in them: pass --yes to downgrade "
            f"{display_url(url)} to {args.revision}"
        )
    before = schema.status(url)
    after = schema.downgrade(url, args.revision)
    old = ", ".join(before.current) or "(empty)"
    new = ", ".join(after.current) or "(empty)"
    print(f"{display_url(url)}: downgraded from {old} to {new}")
    return 0


# -- audit ---------------------------------------------------------------------------------


def _audit_list(args: argparse.Namespace, config: Config) -> int:
    with open_store(config) as store:
        entries = store.audit_entries(limit=args.limit)
    print_items(
        entries,
        args.json,
        ["time", "actor", "source", "action", "target", "detail"],
        lambda e: [when(e.at), e.actor or "", e.source_address or "", e.action, e.target, e.detail],
    )
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``user``, ``key``, ``client``, ``db`` and ``audit`` to the CLI."""
    from appliance.commands import keys, networks, users  # they import this module

    users.add_parser(commands, common)
    keys.add_parser(commands, common)
    networks.add_parser(commands, common)

    sub = add_group(commands, "db", "the auth database's schema (migrations)")
    current = add_command(
        sub, common, "current", _db_current, "show the schema revision", json_output=True
    )
    current.add_argument("--check", action="store_true", help="exit 1 unless at the head")
    upgrade = add_command(sub, common, "upgrade", _db_upgrade, "upgrade the schema")
    upgrade.add_argument("revision", nargs="?", default="head", metavar="REV")
    upgrade.add_argument(
        "--sql", action="store_true", help="print the SQL instead of running it (for a DBA)"
    )
    upgrade.add_argument(
        "--from", dest="start", metavar="REV", help="with --sql: the revision to start from"
    )
    downgrade = add_command(sub, common, "downgrade", _db_downgrade, "downgrade the schema")
    downgrade.add_argument("revision", metavar="REV", help="target revision ('base': empty)")
    downgrade.add_argument("--yes", action="store_true", help="confirm: tables are dropped")

    sub = add_group(commands, "audit", "the audit log of admin changes and failures")
    listing = add_command(
        sub, common, "list", _audit_list, "newest audit entries first", json_output=True
    )
    listing.add_argument("--limit", type=_positive, default=100, help="entries (default 100)")
