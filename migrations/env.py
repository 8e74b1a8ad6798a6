"""Alembic environment of the auth database; :mod:`auth.schema` runs it.

Online, :mod:`auth.schema` hands over an open connection inside its own
transaction (``config.attributes["connection"]``), so a whole upgrade commits
or rolls back as one. Offline (``appliance db upgrade --sql``) it renders the
SQL for the URL's dialect instead.
"""

from __future__ import annotations

import importlib
import pkgutil

from alembic import context
from sqlalchemy import Connection

import auth
from auth.engine import make_engine, normalize_url
from auth.models import Base

config = context.config
# Every module of the auth package, so that tables declared outside
# auth.models (auth.curve, ...) are in the metadata autogenerate compares.
for _module in pkgutil.iter_modules(auth.__path__):
    importlib.import_module(f"auth.{_module.name}")
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: later revisions use batch mode there.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Render the SQL of the migrations for the configured URL's dialect."""
    url = normalize_url(config.attributes["url"])
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.get_backend_name() == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on one to the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.attributes["url"], pool_size=1)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
