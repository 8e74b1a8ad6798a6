"""What opening the auth database needs, as plain values: URL, key file, upgrade rule, pool.

The appliance's configuration adapts to :class:`AuthSettings` in one place
(``Config.auth_settings``); :func:`auth.database.open_database` takes it.
This module imports nothing heavy, so a configuration can build settings
without loading SQLAlchemy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_POOL_SIZE", "AuthSettings"]

#: Connections the process's engine keeps open: the handshakes are short look-ups.
DEFAULT_POOL_SIZE: Final = 2
#: Where the embedded default lives under the state directory.
_AUTH_DIR: Final = "auth"
_DATABASE_FILE: Final = "auth.db"
_SECRET_KEY_FILE: Final = "secret.key"  # noqa: S105 -- a file name


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Where the auth database is, and how a process opens it."""

    #: SQLAlchemy URL (``sqlite:///PATH`` or ``postgresql+psycopg://...``).
    url: str
    #: The key file that seals passwords and shared keys (created 0600 on first use).
    secret_key_file: Path
    #: Bring the schema to head at open (the embedded default); otherwise only
    #: check it, because an operator upgrades a shared database on purpose,
    #: once, with ``appliance db upgrade``.
    upgrade_in_place: bool
    #: Connections kept open (as many again may be opened under load).
    pool_size: int = DEFAULT_POOL_SIZE

    @classmethod
    def under(
        cls,
        state_dir: Path,
        database_url: str | None = None,
        secret_key_file: Path | None = None,
    ) -> AuthSettings:
        """The settings of an appliance with ``state_dir``: its configured database, else
        the embedded SQLite default under ``state_dir/auth`` (which upgrades itself)."""
        auth_dir = state_dir / _AUTH_DIR
        return cls(
            url=database_url or f"sqlite:///{auth_dir / _DATABASE_FILE}",
            secret_key_file=secret_key_file or auth_dir / _SECRET_KEY_FILE,
            upgrade_in_place=database_url is None,
        )
