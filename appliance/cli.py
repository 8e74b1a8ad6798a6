"""The ``appliance`` command: parse the arguments, run the chosen command, map errors to exit codes.

Each command group lives in a module of :mod:`appliance.commands` (``serve``,
``config check``, ``cert``, ``sql``, ``spark``, ``table``, ``curve``,
``token``, ``tail``, ``status``, and the auth database's ``user``, ``key``,
``client``, ``db`` and ``audit``), which adds its parser here. Exit codes: 0
success, 1 a failure the message explains (bad config, port in use, ...),
2 usage. Every command takes ``--config FILE`` before or after the
subcommand (or ``$APPLIANCE_CONFIG``) to find the state directory, and every
administrative command names the state directory and database it uses in one
line on stderr (:mod:`appliance.commands.state`).
"""

from __future__ import annotations

import argparse
import sys

from appliance import __version__
from appliance.commands import (
    auth,
    cert,
    config_check,
    curve,
    serve,
    spark,
    sql,
    status,
    table,
    tail,
    tokens,
)
from appliance.commands.common import CONFIG_ENV, config_source, load
from appliance.commands.state import NoStateError, state_line
from appliance.config import ConfigError
from auth.errors import AuthError
from pki.errors import PkiError

__all__ = ["main"]

#: Admin command groups that say which state they use: (auth database, table).
_STATE_LINES: dict[str, tuple[bool, bool]] = {
    "cert": (True, False),  # the audit log is in the auth database
    "user": (True, False),
    "key": (True, False),
    "client": (True, False),
    "db": (True, False),
    "audit": (True, False),
    "token": (True, False),
    "curve": (True, False),
    "table": (False, True),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance", description="Secure log-ingest appliance into Delta Lake."
    )
    parser.add_argument("--version", action="version", version=f"appliance {__version__}")
    config_help = f"TOML config (default: ${CONFIG_ENV}, else the embedded default)"
    parser.add_argument("--config", metavar="FILE", help=config_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # After the subcommand too; SUPPRESS keeps a --config given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=config_help)

    serve.add_parser(commands, common)
    config_check.add_parser(commands, common)
    cert.add_parser(commands, common)
    sql.add_parser(commands, common)
    spark.add_parser(commands, common)
    table.add_parser(commands, common)
    curve.add_parser(commands, common)
    tokens.add_parser(commands, common)
    tail.add_parser(commands, common)
    status.add_parser(commands, common)
    auth.add_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve" or args.command == "config":
            result: int = args.func(args)
        else:
            config = load(args.config)
            if args.command in _STATE_LINES:
                auth_db, uses_table = _STATE_LINES[args.command]
                line = state_line(
                    config, config_source(args.config), auth=auth_db, table=uses_table
                )
                print(line, file=sys.stderr)
            result = args.func(args, config)
    except ConfigError as exc:
        print(f"appliance: config error: {exc}", file=sys.stderr)
        return 1
    except (PkiError, AuthError, NoStateError) as exc:
        print(f"appliance: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"appliance: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result
