"""The SQLite store: spec versions, preflight results, jobs, attempts, failures and fixes."""

from idmctl.store.db import open_store, session

__all__ = ["open_store", "session"]
