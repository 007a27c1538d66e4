"""The store's schema, owned by Alembic (``migrations/versions``): the revisions this idmctl ships and
``alembic upgrade head`` for a store (SQLite or PostgreSQL) that is behind."""

from __future__ import annotations

from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def known_revisions() -> set[str]:
    """Revisions this idmctl ships (``revision = "0001"`` in each migration file)."""
    found = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith("revision"):
                found.add(line.split("=", 1)[1].split("#")[0].strip().strip("\"'"))
    return found


def upgrade(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "head")
