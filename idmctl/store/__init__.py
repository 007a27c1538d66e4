"""The SQLite store: spec versions, preflight results, jobs, attempts, failures and fixes.

``open_store`` and ``session`` load the ORM on first use, so ``idmctl.store.fast`` (plain sqlite3 on
the submit path) can be imported without SQLAlchemy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["open_store", "session"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from idmctl.store import db

        return getattr(db, name)
    raise AttributeError(f"module 'idmctl.store' has no attribute {name!r}")
