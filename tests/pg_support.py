"""The real PostgreSQL for the shared-store tests (scripts/postgres/up.sh exports IDMCTL_TEST_PG_URL).

Each test gets a brand-new database, so migrations are applied from empty every time, and drops it
afterwards. Outside CI a missing server skips the test; in CI (``$CI`` set) it fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

TEST_URL_ENV = "IDMCTL_TEST_PG_URL"


def server_url() -> str:
    url = os.environ.get(TEST_URL_ENV)
    if not url:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs PostgreSQL: {TEST_URL_ENV} is not set (scripts/test.sh runs scripts/postgres/up.sh)")
        pytest.skip("no PostgreSQL (run scripts/postgres/up.sh and source /tmp/idmctl-pg/env)")
    return url


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new, empty database on the test server; dropped (with its connections) on exit."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = make_url(server_url())
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin.set(database=name).render_as_string(hide_password=False)
        from idmctl.record import db as store_db

        store_db._shared_engine.cache_clear()  # release this process's pool before the drop
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()
