"""``appliance user ...``: forward-protocol users, and which networks they may use."""

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
    read_secret,
    when,
    yes_no,
)
from appliance.commands.common import Subparsers
from appliance.config import Config

if TYPE_CHECKING:
    from auth.records import NetworkInfo, UserInfo

__all__ = ["add_parser"]


def _print_user(user: UserInfo, as_json: bool) -> None:
    print_fields(
        user,
        as_json,
        [
            ["name", user.name],
            ["enabled", yes_no(user.enabled)],
            ["created", when(user.created_at)],
            ["updated", when(user.updated_at)],
            ["last login", when(user.last_login_at, "never")],
            ["last login from", user.last_login_address or ""],
            ["allowed on", ", ".join(user.networks) or "(networks that admit any user)"],
        ],
    )


def _add(args: argparse.Namespace, config: Config) -> int:
    from auth.principals import check_principal_name

    # A reserved or invalid name is refused before the password is asked.
    check_principal_name("user", args.name)
    password = read_secret(args.password_stdin, f"password for {args.name}")
    with open_auth(config, create=True) as db:
        user = db.credentials.add_user(
            args.name, password, actor=admin(), enabled=not args.disabled
        )
    print_item(user, args.json, f"added user {user.name}{'' if user.enabled else ' (disabled)'}")
    return 0


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        users = db.credentials.list_users()
    print_items(
        users,
        args.json,
        ["name", "enabled", "created", "last login", "from"],
        lambda u: [
            u.name,
            yes_no(u.enabled),
            when(u.created_at),
            when(u.last_login_at, "never"),
            u.last_login_address or "",
        ],
    )
    return 0


def _show(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        _print_user(db.credentials.get_user(args.name), args.json)
    return 0


def _enable(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.set_user_enabled(args.name, True, actor=admin())
    print(f"enabled user {args.name}")
    return 0


def _disable(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.set_user_enabled(args.name, False, actor=admin())
    from appliance.server.revocation import RECHECK_INTERVAL_SECONDS

    print(
        f"disabled user {args.name}: its next handshakes fail, its open connections close "
        f"within {RECHECK_INTERVAL_SECONDS:g} s ('appliance cert reload' closes them now)"
    )
    return 0


def _passwd(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.get_user(args.name)  # fail before asking for a password
        password = read_secret(args.password_stdin, f"new password for {args.name}")
        db.credentials.set_password(args.name, password, actor=admin())
    print(f"changed the password of {args.name}")
    return 0


def _delete(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.delete_user(args.name, actor=admin())
    print(f"deleted user {args.name}")
    return 0


def _print_network_users(network: NetworkInfo, as_json: bool) -> None:
    print_item(network, as_json, f"users allowed from {network.cidr}: {network.users_text}")


def _allow(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        network = db.credentials.allow_user(args.name, args.cidr, actor=admin())
    _print_network_users(network, args.json)
    return 0


def _deny(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        network = db.credentials.deny_user(args.name, args.cidr, actor=admin())
    _print_network_users(network, args.json)
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``user`` and its subcommands."""
    sub = add_group(commands, "user", "forward-protocol users (username and password)")

    def password_stdin(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of stdin, not a prompt",
        )

    add = add_command(sub, common, "add", _add, "add a user (asks the password)", json_output=True)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--disabled", action="store_true", help="create it disabled")
    password_stdin(add)

    add_command(sub, common, "list", _list, "list users", json_output=True)
    show = add_command(sub, common, "show", _show, "show one user", json_output=True)
    show.add_argument("name", metavar="NAME")
    for name, func, text in [
        ("enable", _enable, "let a disabled user connect again"),
        ("disable", _disable, "refuse a user's handshakes, keep the user"),
        ("delete", _delete, "delete a user"),
    ]:
        add_command(sub, common, name, func, text).add_argument("name", metavar="NAME")
    passwd = add_command(sub, common, "passwd", _passwd, "change a user's password")
    passwd.add_argument("name", metavar="NAME")
    password_stdin(passwd)

    for name, func, text in [
        ("allow", _allow, "allow a user on a client network (which then admits only its users)"),
        ("deny", _deny, "remove a user from a client network's allowed users"),
    ]:
        parser = add_command(sub, common, name, func, text, json_output=True)
        parser.add_argument("name", metavar="NAME")
        parser.add_argument("cidr", metavar="CIDR")
