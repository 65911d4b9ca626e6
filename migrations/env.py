"""Alembic environment of the service database.

The URL comes from the caller (``app.service.db.migrate.upgrade`` sets ``sqlalchemy.url``) or from
``DATABASE_URL``. The project's version table is ``paraplan_alembic_version``; Optuna's tables (and
its own ``alembic_version``) share the database and are left alone.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from app.service.db.engine import connect_args, tune_sqlite
from app.service.db.migrate import VERSION_TABLE, include_object
from app.service.db.models import Base

config = context.config
target_metadata = Base.metadata
if config.config_file_name is not None and not config.get_main_option("sqlalchemy.url"):
    from logging.config import fileConfig

    fileConfig(config.config_file_name, disable_existing_loggers=False)  # `alembic ...` by hand


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from app.service.core.config import Settings

    return Settings().database_url


def _configure(**kw) -> None:
    context.configure(target_metadata=target_metadata, version_table=VERSION_TABLE,
                      include_object=include_object, compare_type=True, render_as_batch=True, **kw)


def run_migrations_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from sqlalchemy import create_engine

    url = _url()
    engine = tune_sqlite(create_engine(url, poolclass=pool.NullPool, connect_args=connect_args(url)))
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # Batch mode rebuilds a table by DROP + RENAME; with foreign keys on, SQLite's DROP deletes the
            # rows first and cascades to the referencing tables (a job's ranked configs would go).
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
