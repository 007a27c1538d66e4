"""The SQLite store: spec versions, preflight results, jobs, attempts, failures and fixes.

``open_store`` and ``session`` load the ORM on first use, so ``idmctl.record.fast`` (plain sqlite3 on
the submit path) can be imported without SQLAlchemy.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["open_store", "session"]


def close_open_stores() -> None:
    """Close every SQLite connection this process opened to a store (plain sqlite3 and the ORM's pool),
    importing neither module to do it. A store's last connection checkpoints its WAL into the store file
    as it closes, so a finished command leaves ``idmctl.sqlite`` whole (no ``-wal`` beside it)."""
    fast = sys.modules.get("idmctl.record.fast")
    if fast is not None:
        fast.close_all()
    db = sys.modules.get("idmctl.record.db")
    if db is not None:
        db.dispose_engines()


def __getattr__(name: str) -> Any:
    if name in __all__:
        from idmctl.record import db  # start-up: pulls sqlalchemy and pydantic

        return getattr(db, name)
    raise AttributeError(f"module 'idmctl.record' has no attribute {name!r}")
