"""``appliance key ...``: forward shared keys, and the key file that encrypts all secrets."""

from __future__ import annotations

import argparse
import secrets
from typing import TYPE_CHECKING, Final

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
)
from appliance.commands.common import Subparsers, print_json
from appliance.config import Config

if TYPE_CHECKING:
    from auth.records import KeyInfo

__all__ = ["add_parser"]

#: Random bytes of a generated shared key (printed as 43 URL-safe characters).
GENERATED_KEY_BYTES: Final = 32


def _create(args: argparse.Namespace, config: Config, generate: bool) -> int:
    if generate:
        text = secrets.token_urlsafe(GENERATED_KEY_BYTES)
        secret = text.encode()
    else:
        secret = read_secret(args.secret_stdin, f"shared key {args.name}")
    with open_auth(config, create=True) as db:
        key = db.credentials.add_key(args.name, secret, network=args.network, actor=admin())
    lines = [f"added shared key {key.name} ({key.scope})"]
    if generate:
        lines.append(f"shared key (shown only now; set it as the clients' shared_key): {text}")
    print_item(key, args.json, *lines, extra={"secret": text} if generate else None)
    return 0


def _add(args: argparse.Namespace, config: Config) -> int:
    return _create(args, config, generate=args.generate)


def _generate(args: argparse.Namespace, config: Config) -> int:
    return _create(args, config, generate=True)


_HEADERS = ["name", "scope", "created", "updated"]


def _row(key: KeyInfo) -> list[str]:
    return [key.name, key.scope, when(key.created_at), when(key.updated_at)]


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        keys = db.credentials.list_keys()
    print_items(keys, args.json, _HEADERS, _row)
    return 0


def _show(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        key = db.credentials.get_key(args.name)
    print_fields(key, args.json, [list(p) for p in zip(_HEADERS, _row(key), strict=True)])
    return 0


def _delete(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        db.credentials.delete_key(args.name, actor=admin())
    print(f"deleted shared key {args.name}")
    return 0


def _rotate_master(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        result = db.credentials.rotate_master_key(actor=admin())
    if args.json:
        print_json(result.to_json())
        return 0
    if result.resumed:
        print("completed an interrupted rotation first")
    print(
        f"new secret key {result.key_id} in {config.auth_secret_key_file}; "
        f"re-encrypted {result.resealed} secrets"
    )
    print("other appliances sharing this database need a copy of the new key file")
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``key`` and its subcommands."""
    sub = add_group(commands, "key", "forward shared keys and the secret key file")

    def network(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--network", metavar="CIDR", help="tie the key to this client network (else: global)"
        )

    add = add_command(sub, common, "add", _add, "add a shared key", json_output=True)
    add.add_argument("name", metavar="NAME")
    network(add)
    source = add.add_mutually_exclusive_group()
    source.add_argument(
        "--secret-stdin", action="store_true", help="read the key from the first line of stdin"
    )
    source.add_argument(
        "--generate", action="store_true", help="generate a random key and print it once"
    )

    generate = add_command(
        sub,
        common,
        "generate",
        _generate,
        "add a random shared key, printed once",
        json_output=True,
    )
    generate.add_argument("name", metavar="NAME")
    network(generate)

    add_command(
        sub, common, "list", _list, "list shared keys (never the secrets)", json_output=True
    )
    show = add_command(sub, common, "show", _show, "show one shared key", json_output=True)
    show.add_argument("name", metavar="NAME")
    delete = add_command(sub, common, "delete", _delete, "delete a shared key")
    delete.add_argument("name", metavar="NAME")
    add_command(
        sub,
        common,
        "rotate-master",
        _rotate_master,
        "replace the secret key file and re-encrypt every secret",
        json_output=True,
    )
