"""``appliance config check``: a config file and the files it refers to, checked before a start.

Parsing (:func:`appliance.config.load_config`) proves the file well-formed;
this adds what only the disk can tell: every file the config names exists.
The TLS files are errors when missing (the service would fail to start); a
configured ``secret_key_file`` or SQLite database that is missing is a
warning, because the first stored secret, or ``appliance db upgrade``,
creates it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from appliance.commands.common import CONFIG_ENV, Subparsers
from appliance.commands.state import sqlite_file
from appliance.config import Config, load_config_sources

__all__ = ["FileReport", "add_parser", "check_files"]


@dataclass
class FileReport:
    """What the check found: ``errors`` fail it, ``warnings`` do not."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _shown(path: Path) -> str:
    if path.is_absolute():
        return str(path)
    return f"{path} (relative to the current directory: {path.absolute()})"


def _check_file(report: FileReport, key: str, path: Path, *, required: bool) -> None:
    if not path.exists():
        message = f"{key}: no such file: {_shown(path)}"
        (report.errors if required else report.warnings).append(message)
    elif not path.is_file():
        report.errors.append(f"{key}: not a file: {_shown(path)}")
    elif not os.access(path, os.R_OK):
        report.warnings.append(
            f"{key}: {_shown(path)} cannot be read by this user (the service's user may)"
        )


def check_files(config: Config) -> FileReport:
    """Check every file ``config`` refers to."""
    report = FileReport()
    tls = config.tls
    if (tls.cert_file is None) != (tls.key_file is None):
        report.errors.append(
            "tls.cert_file and tls.key_file go together: set both, or neither for the "
            "generated server certificate"
        )
    for key, path in [
        ("tls.cert_file", tls.cert_file),
        ("tls.key_file", tls.key_file),
        ("tls.client_ca_file", tls.client_ca_file),
        ("tls.crl_file", tls.crl_file),
    ]:
        if path is not None:
            _check_file(report, key, path, required=True)
    if config.auth.secret_key_file is not None:
        path = config.auth.secret_key_file
        if path.exists():
            _check_file(report, "auth.secret_key_file", path, required=True)
        else:
            report.warnings.append(
                f"auth.secret_key_file: no such file: {_shown(path)}: the first stored secret "
                "creates it; appliances that share the auth database need a copy of one key file"
            )
    if config.auth.database_url is not None:
        database = sqlite_file(config.auth.database_url)
        if database is not None and not database.exists():
            report.warnings.append(
                f"auth.database_url: no SQLite database at {_shown(database)}: "
                "run 'appliance db upgrade' to create it"
            )
    return report


def _config_check(args: argparse.Namespace) -> int:
    chosen = args.file or args.config or os.environ.get(CONFIG_ENV)
    if not chosen:
        print(
            f"appliance: config check: which file? give FILE, --config FILE or ${CONFIG_ENV}",
            file=sys.stderr,
        )
        return 2
    config, sources = load_config_sources(Path(chosen))
    report = check_files(config)
    for warning in report.warnings:
        print(f"appliance: {chosen}: warning: {warning}", file=sys.stderr)
    for error in report.errors:
        print(f"appliance: {chosen}: {error}", file=sys.stderr)
    if report.errors:
        return 1
    names = ", ".join(f"{listener.name} ({listener.bind})" for listener in config.listeners)
    # The resolved count, and what it was resolved from (docs/configuration.md#top-level).
    workers = f"{config.worker_count}" + (" (auto)" if config.workers == "auto" else "")
    print(f"{chosen}: ok; listeners: {names}; table: {config.table_uri}; workers: {workers}")
    # Where substituted values came from: the references, never the values.
    for key, source in sources:
        print(f"  {key}: from {source.kind} {source.reference}")
    return 0


def add_parser(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    """Add ``config check`` to the CLI."""
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
