"""``appliance db|audit ...``, and the ``user``, ``key`` and ``client`` groups added with them.

The auth database from the command line: ``db`` (its schema) and ``audit``
(its log) are here; ``users``, ``keys`` and ``networks`` hold the others,
and :mod:`appliance.commands.auth_common` what they all share. Errors exit 1
with one line on stderr.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from appliance.commands import keys, networks, users
from appliance.commands.auth_common import add_command, add_group, open_auth, print_items, when
from appliance.commands.common import Subparsers, print_json, print_table
from appliance.commands.state import require_auth_database, require_state_dir, sqlite_file
from appliance.config import Config
from auth.errors import AuthError

if TYPE_CHECKING:
    from auth.schema import SchemaStatus

__all__ = ["add_parser"]


# -- db -----------------------------------------------------------------------------------


def _status_json(url: str, found: SchemaStatus) -> dict[str, Any]:
    from auth.engine import display_url

    return {
        "url": display_url(url),
        "current": list(found.current),
        "head": found.head,
        "up_to_date": found.up_to_date,
    }


def _db_current(args: argparse.Namespace, config: Config) -> int:
    from auth import schema
    from auth.engine import display_url

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
    from auth.engine import display_url

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
    from auth.engine import display_url

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
    with open_auth(config) as database:
        entries = database.audit.audit_entries(limit=args.limit)
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
