"""``appliance client ...``: client networks, their shared keys and allowed users."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from appliance.commands.auth_common import (
    add_command,
    add_group,
    admin,
    open_auth,
    print_fields,
    print_item,
    print_items,
    when,
    yes_no,
)
from appliance.commands.common import Subparsers
from appliance.config import Config

if TYPE_CHECKING:
    from auth.records import NetworkInfo

__all__ = ["add_parser"]


def _row(network: NetworkInfo) -> list[str]:
    return [
        network.cidr,
        ", ".join(network.keys) or "(global keys)",
        network.users_text,
        yes_no(network.allow_anonymous),
        when(network.created_at),
    ]


_HEADERS = ["network", "keys", "users", "anonymous", "created"]


def _print(network: NetworkInfo, as_json: bool) -> None:
    print_fields(
        network,
        as_json,
        [
            *[list(p) for p in zip(_HEADERS, _row(network), strict=True)],
            ["updated", when(network.updated_at)],
        ],
    )


def _add(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config, create=True) as db:
        network = db.credentials.add_network(
            args.cidr,
            keys=args.key or (),
            users=args.user or (),
            allow_anonymous=args.allow_anonymous,
            actor=admin(),
        )
    print_item(network, args.json, f"added client network {network.cidr}")
    return 0


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        networks = db.credentials.list_networks()
    print_items(networks, args.json, _HEADERS, _row)
    return 0


def _show(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        _print(db.credentials.get_network(args.cidr), args.json)
    return 0


def _set(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        network = db.credentials.update_network(
            args.cidr, allow_anonymous=args.allow_anonymous, any_user=args.any_user, actor=admin()
        )
    _print(network, args.json)
    return 0


def _delete(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.delete_network(args.cidr, with_keys=args.with_keys, actor=admin())
    print(f"deleted client network {args.cidr}")
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``client`` and its subcommands."""
    sub = add_group(commands, "client", "client networks (CIDR): keys, users, anonymous")

    add = add_command(sub, common, "add", _add, "add a client network", json_output=True)
    add.add_argument("cidr", metavar="CIDR")
    add.add_argument(
        "--key",
        action="append",
        metavar="NAME",
        help="a global shared key that becomes this network's own (repeatable)",
    )
    add.add_argument(
        "--user",
        action="append",
        metavar="NAME",
        help="only these users may connect from it (repeatable; default: any user)",
    )
    add.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="clients from it may connect without a username",
    )

    add_command(sub, common, "list", _list, "list client networks", json_output=True)
    show = add_command(sub, common, "show", _show, "show one client network", json_output=True)
    show.add_argument("cidr", metavar="CIDR")

    update = add_command(sub, common, "set", _set, "change a client network", json_output=True)
    update.add_argument("cidr", metavar="CIDR")
    update.add_argument(
        "--allow-anonymous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether clients from it may connect without a username",
    )
    update.add_argument(
        "--any-user", action="store_true", help="admit any user again (drop the allowed list)"
    )

    delete = add_command(sub, common, "delete", _delete, "delete a client network")
    delete.add_argument("cidr", metavar="CIDR")
    delete.add_argument(
        "--with-keys", action="store_true", help="also delete the shared keys tied to it"
    )
