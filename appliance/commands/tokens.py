"""``appliance token add|list|revoke``: bearer tokens of the WebSocket listener.

* ``add NAME --scope ingest|admin [--tag-prefix P ...]`` creates a token and
  prints it once; only its SHA-256 is stored, so a lost token is revoked and
  replaced, never recovered. ``ingest`` tokens send events (under the given
  tag prefixes, or any tag without one); ``admin`` tokens may also watch the
  live tail (``appliance tail``).
* ``list`` shows every token without its secret; ``revoke NAME`` refuses it
  from the next connection on (a running service needs no restart), and a
  running service closes the connections it opened within 30 s, at once on a
  reload (docs/security.md, "Revocation").
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from appliance.commands.auth_common import add_command, admin, open_auth, when
from appliance.commands.common import Subparsers, print_json, print_table
from appliance.config import Config

if TYPE_CHECKING:
    from auth.records import TokenInfo

__all__ = ["add_parser"]


def _add(args: argparse.Namespace, config: Config) -> int:
    from auth.principals import check_principal_name

    # Refused before the database is opened (or created).
    check_principal_name("token", args.name)
    with open_auth(config, create=True) as db:
        info, token = db.tokens.add(args.name, args.scope, args.tag_prefix or (), actor=admin())
    if args.json:
        document = info.to_json()
        document["token"] = token
        print_json(document)
        return 0
    prefixes = ", ".join(info.tag_prefixes) or "any tag"
    print(f"added {info.scope} token {info.name} ({prefixes})")
    print(f"token (shown only now; send it as 'Authorization: Bearer <token>'): {token}")
    return 0


def _row(info: TokenInfo) -> list[str]:
    return [
        info.name,
        info.scope,
        ", ".join(info.tag_prefixes) or "*",
        info.status,
        when(info.created_at),
        when(info.last_used_at),
        when(info.revoked_at),
    ]


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        tokens = db.tokens.list()
    if args.json:
        print_json([t.to_json() for t in tokens])
    else:
        print_table(
            ["name", "scope", "tag prefixes", "status", "created", "last used", "revoked"],
            [_row(t) for t in tokens],
        )
    return 0


def _revoke(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        info = db.tokens.revoke(args.name, actor=admin())
    from appliance.server.revocation import RECHECK_INTERVAL_SECONDS

    print(
        f"revoked token {info.name}; new connections with it are refused, open ones close "
        f"within {RECHECK_INTERVAL_SECONDS:g} s ('appliance cert reload' closes them now)"
    )
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``token`` and its subcommands."""
    token = commands.add_parser("token", help="bearer tokens of the WebSocket listener")
    sub = token.add_subparsers(dest="token_command", required=True, metavar="COMMAND")

    add = add_command(sub, common, "add", _add, "create a token (printed once)", json_output=True)
    add.add_argument("name", metavar="NAME", help="the token's name: its events' source")
    add.add_argument(
        "--scope", choices=("ingest", "admin"), default="ingest", help="default: ingest"
    )
    add.add_argument(
        "--tag-prefix",
        action="append",
        metavar="PREFIX",
        help="tags the token may write under (repeat; default: any tag)",
    )

    add_command(sub, common, "list", _list, "list tokens (never their secret)", json_output=True)

    revoke = add_command(sub, common, "revoke", _revoke, "refuse a token from now on")
    revoke.add_argument("name", metavar="NAME")
