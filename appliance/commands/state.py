"""Which state an admin command uses, and the rule that it never creates state by accident.

Every admin command prints one line on stderr naming the config it read, the
state directory and the database it uses (a database password masked), so
an operator who ran it in the wrong directory, or without ``--config``, sees
it at once.

Admin commands create no state directory: one that finds none says so,
naming the path, and exits 1. Only ``appliance serve``, ``appliance cert
init|import`` and ``appliance db upgrade`` create state. Inside an existing state
directory, commands that add something (``user add``, ``key add``, ``cert
issue-client``, ...) may create the embedded auth database, as the service
does at start; commands that only read or change what exists never do
(docs/decisions.md, "Admin commands and state").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from appliance.config import Config

__all__ = [
    "CREATE_ADVICE",
    "NoStateError",
    "masked_url",
    "require_auth_database",
    "require_state_dir",
    "sqlite_file",
    "state_line",
]

#: What a "no state" message tells the operator to do.
CREATE_ADVICE: Final = (
    "run 'appliance serve' once (or 'appliance cert init' / 'appliance db upgrade') to create it, "
    "or name the right config with --config FILE or $APPLIANCE_CONFIG"
)

_PASSWORD_PARAMETER: Final = re.compile(r"(?i)(password=)[^&]*")


class NoStateError(Exception):
    """The command found no state where the config points, and creates none."""


def masked_url(url: str) -> str:
    """``url`` with a password (in the user part or a ``password=`` parameter) shown as ***."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.netloc.rpartition("@")[2]
            url = urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:
        return "<unparsable URL>"
    return _PASSWORD_PARAMETER.sub(r"\1***", url)


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL; None for other databases and in-memory SQLite."""
    from sqlalchemy.engine import make_url  # the auth commands load SQLAlchemy anyway
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def state_line(
    config: Config, source: str | None, *, auth: bool = False, table: bool = False
) -> str:
    """The one line naming the config, the state directory and the database a command uses."""
    origin = f"config {source}" if source else "no config file: the embedded default"
    parts = [f"state {config.state_dir.absolute()} ({origin})"]
    if auth:
        url = config.auth_database_url
        database = sqlite_file(url)
        if database is not None and not database.is_absolute():
            url = f"sqlite:///{database.absolute()}"  # relative to the current directory
        parts.append(f"auth database {masked_url(url)}")
    if table:
        parts.append(f"table {masked_url(config.table_uri)}")
    return "appliance: " + ", ".join(parts)


def require_state_dir(config: Config) -> None:
    """Raise :class:`NoStateError` unless the state directory exists."""
    if not config.state_dir.is_dir():
        raise NoStateError(
            f"no state in {config.state_dir.absolute()}: the directory does not exist; "
            f"{CREATE_ADVICE}"
        )


def require_auth_database(config: Config, *, create: bool) -> None:
    """Raise :class:`NoStateError` when the command would have to create the auth database.

    Args:
        create: the command adds something, so it may create the embedded
            default database inside an existing state directory (as the
            service does at start). A configured database is never created
            here: ``appliance db upgrade`` does that, on purpose.
    """
    embedded = config.auth.database_url is None
    if embedded:
        # A new state directory is never made by an admin command. A configured
        # database is the state that matters: it must exist (and be at head).
        require_state_dir(config)
    path = sqlite_file(config.auth_database_url)
    if path is None or path.exists():
        return
    if create and embedded:
        return
    shown = path.absolute()
    if embedded:
        raise NoStateError(
            f"no auth database at {shown} (state {config.state_dir.absolute()}): nothing is "
            "stored there yet; the service creates it at its first start, "
            "'appliance db upgrade' creates it now"
        )
    raise NoStateError(
        f"no auth database at {shown} ([auth] database_url): run 'appliance db upgrade' "
        "to create it, or fix the URL"
    )
