"""``appliance curve ...``: the CURVE keys of Logjam producers, and the server's public key.

* ``add NAME PUBLIC_KEY`` authorises a client's Z85 public key under NAME
  (the ``source`` of its events); ``add NAME --generate`` makes a keypair,
  stores its public half and prints the secret key once, for the client.
* ``list`` shows every key, active and revoked; ``revoke NAME`` refuses the
  key from the next handshake on (a running service needs no restart).
* ``server-key`` prints the server's public key, the ``curve_serverkey`` every
  client needs; it creates the keypair under ``<state>/curve`` if the service
  has not yet done so (in an existing state directory only).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from appliance.commands.auth_common import (
    add_command,
    add_group,
    admin,
    open_auth,
    print_item,
    print_items,
    when,
)
from appliance.commands.common import Subparsers, print_json
from appliance.commands.state import require_state_dir
from appliance.config import Config

if TYPE_CHECKING:
    from auth.records import CurveKeyInfo

__all__ = ["add_parser"]


def _add(args: argparse.Namespace, config: Config) -> int:
    from auth.curve import generate_keypair
    from auth.errors import InvalidValueError
    from auth.principals import check_principal_name

    # Refused before a keypair is made or the database opened (or created).
    check_principal_name("CURVE key", args.name)
    secret: str | None = None
    if args.generate:
        if args.public_key:
            raise InvalidValueError("give a PUBLIC_KEY or --generate, not both")
        public, secret = generate_keypair()
    elif args.public_key:
        public = args.public_key
    else:
        raise InvalidValueError("give the client's PUBLIC_KEY (Z85), or --generate")
    with open_auth(config, create=True) as db:
        key = db.curve_keys.add(args.name, public, actor=admin())
    lines = [f"added CURVE key {key.name}: {key.public_key}"]
    if secret is not None:
        lines.append(f"client secret key (shown only now; the client's curve_secretkey): {secret}")
        lines.append(f"client public key (its curve_publickey): {key.public_key}")
    print_item(key, args.json, *lines, extra=None if secret is None else {"secret_key": secret})
    return 0


def _row(key: CurveKeyInfo) -> list[str]:
    return [key.name, key.public_key, key.status, when(key.created_at), when(key.revoked_at)]


def _list(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        keys = db.curve_keys.list()
    print_items(keys, args.json, ["name", "public key", "status", "created", "revoked"], _row)
    return 0


def _revoke(args: argparse.Namespace, config: Config) -> int:
    with open_auth(config) as db:
        key = db.curve_keys.revoke(args.name, actor=admin())
    from appliance.server.revocation import RECHECK_INTERVAL_SECONDS

    print(
        f"revoked CURVE key {key.name}; new connections with it are refused, and messages on "
        f"open ones within {RECHECK_INTERVAL_SECONDS:g} s ('appliance cert reload': now)"
    )
    return 0


def _server_key(args: argparse.Namespace, config: Config) -> int:
    from auth.curve import ensure_server_keypair

    require_state_dir(config)  # the keypair goes into it: never a new state directory
    keypair = ensure_server_keypair(config.state_dir)
    public = keypair.public.decode("ascii")
    if args.json:
        print_json({"public_key": public, "file": str(keypair.public_file)})
    else:
        print(public)
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``curve`` and its subcommands."""
    sub = add_group(commands, "curve", "CURVE keys of Logjam (ZeroMQ) producers")

    add = add_command(sub, common, "add", _add, "authorise a client public key", json_output=True)
    add.add_argument("name", metavar="NAME", help="the key's name: the source of its events")
    add.add_argument("public_key", metavar="PUBLIC_KEY", nargs="?", help="Z85 public key")
    add.add_argument(
        "--generate", action="store_true", help="generate a keypair and print its secret once"
    )

    add_command(sub, common, "list", _list, "list CURVE keys", json_output=True)

    revoke = add_command(sub, common, "revoke", _revoke, "refuse a key from now on")
    revoke.add_argument("name", metavar="NAME")

    add_command(
        sub, common, "server-key", _server_key, "print the server's public key", json_output=True
    )
