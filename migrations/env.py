"""Alembic environment: the database URL comes from Fairmeter's settings (or the caller)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from metering.config import load_settings, to_psycopg_url
from metering.models import metadata

config = context.config
target_metadata = metadata


def _url() -> str:
    explicit = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    return to_psycopg_url(explicit) if explicit else load_settings().sqlalchemy_url()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
