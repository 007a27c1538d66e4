"""Alembic environment: migrations run programmatically from ``idmctl.record.migrate.upgrade``."""

from alembic import context
from sqlalchemy import create_engine

from idmctl.record import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from sqlmodel import SQLModel

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds tables instead.
    context.configure(connection=connection, target_metadata=SQLModel.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()  # no pooled connection left open on the file: a template copy must see it whole
