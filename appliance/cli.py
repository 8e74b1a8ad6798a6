"""The ``appliance`` command: one CLI for the service and its administration.

Subcommands: ``serve``, ``config check``, ``cert ...``, and the auth
database's ``user``, ``key``, ``client``, ``db`` and ``audit``. Exit codes: 0
success, 1 a failure the message explains (bad config, port in use, ...),
2 usage. Every command takes ``--config FILE`` before or after the
subcommand (or ``$APPLIANCE_CONFIG``) to find the state directory, and every
administrative command names the state directory and database it uses in one
line on stderr (:mod:`appliance.commands.state`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import trio

from appliance import __version__
from appliance.commands import auth, cert, curve, spark, status, tail, tokens
from appliance.commands.state import NoStateError, state_line
from appliance.config import Config, ConfigError, default_config, load_config
from appliance.lake.errors import LakeError
from appliance.logs import configure, get_logger
from auth.errors import AuthError
from pki.errors import PkiError

__all__ = ["main"]

log = get_logger("cli")

#: Environment variable naming the config file when --config is not given.
CONFIG_ENV = "APPLIANCE_CONFIG"


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


def _config_source(path: str | None) -> str | None:
    """The config file to read and where its name came from; None: the embedded default."""
    if path:
        return path
    env = os.environ.get(CONFIG_ENV)
    return f"{env} (${CONFIG_ENV})" if env else None


def _config(path: str | None) -> Config:
    chosen = path or os.environ.get(CONFIG_ENV)
    return load_config(Path(chosen)) if chosen else default_config()


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _serve(args: argparse.Namespace) -> int:
    from appliance.service import serve  # trio and deltalake load only when serving

    config = _config(args.config)
    configure(config.log.level, config.log.format)
    failures: list[str] = []
    try:
        trio.run(serve, config)
    except* (OSError, LakeError, AuthError, PkiError) as group:
        # Start-up failures an operator can fix: a port in use, an unreadable
        # table, an auth database behind the code's schema (the message names
        # "appliance db upgrade"), a broken certificate. Inside trio's
        # nurseries they arrive as an exception group.
        failures = [str(exc) for exc in _leaves(group)]
    for failure in failures:
        log.error("service.failed", reason=failure)
        print(f"appliance: {failure}", file=sys.stderr)
    if failures:
        return 1
    return 0


def _config_check(args: argparse.Namespace) -> int:
    from appliance.commands.config_check import check_files

    chosen = args.file or args.config or os.environ.get(CONFIG_ENV)
    if not chosen:
        print(
            f"appliance: config check: which file? give FILE, --config FILE or ${CONFIG_ENV}",
            file=sys.stderr,
        )
        return 2
    config = load_config(Path(chosen))
    report = check_files(config)
    for warning in report.warnings:
        print(f"appliance: {chosen}: warning: {warning}", file=sys.stderr)
    for error in report.errors:
        print(f"appliance: {chosen}: {error}", file=sys.stderr)
    if report.errors:
        return 1
    names = ", ".join(f"{listener.name} ({listener.bind})" for listener in config.listeners)
    print(f"{chosen}: ok; listeners: {names}; table: {config.table_uri}")
    return 0


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

    serve = commands.add_parser(
        "serve", help="run the service (embedded default without a file)", parents=[common]
    )
    serve.set_defaults(func=_serve)

    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser(
        "check",
        help="validate a config file and the files it names",
        parents=[common],
    )
    check.add_argument(
        "file", metavar="FILE", nargs="?", help=f"default: --config, then ${CONFIG_ENV}"
    )
    check.set_defaults(func=_config_check)

    cert.add_parser(commands, common)
    spark.add_parser(commands, common)
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
            config = _config(args.config)
            if args.command in _STATE_LINES:
                auth_db, table = _STATE_LINES[args.command]
                line = state_line(config, _config_source(args.config), auth=auth_db, table=table)
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
