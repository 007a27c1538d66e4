"""The store's schema, owned by Alembic (``migrations/versions``): the revisions this idmctl ships and
``alembic upgrade head`` for a store (SQLite or PostgreSQL) that is behind."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ground.paths import user_cache_dir
from ground.sqlite_template import seed_from_template

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


def template_path() -> Path:
    """The empty store at head for these migrations: named by their content, not only the head revision,
    so that a migration edited in a checkout never seeds a store from a template of its old text, and by
    its journal mode (WAL: what every connection of ours sets, idmctl.record.db._set_pragmas)."""
    digest = hashlib.sha256()
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return user_cache_dir() / f"idmctl-store-{digest.hexdigest()[:16]}-wal.sqlite"


def seed_new_store(path: Path) -> bool:
    """Start a SQLite store that does not exist yet as a copy of the template, which ``upgrade`` builds
    once per set of migrations (~0.1–0.4 s of CPU each time otherwise). False: nothing was seeded
    (the store exists, or the cache cannot be written) and the caller migrates as before."""
    return seed_from_template(path, template_path(), lambda building: upgrade(f"sqlite:///{building}"),
                              journal_mode="WAL")
