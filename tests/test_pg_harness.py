"""The test PostgreSQL's role can drop a database that another role's session still holds.

CI run of 2026-12-04: an autovacuum worker connected to a test's brand-new database, and the
teardown's ``DROP DATABASE … WITH (FORCE)`` failed with "must be a member of the role whose process
is being terminated or member of pg_signal_backend". scripts/postgres/up.sh grants that role."""

from __future__ import annotations


def test_the_test_role_may_end_other_roles_sessions_on_its_databases() -> None:
    from pg_support import server_url
    from sqlalchemy import create_engine, text

    engine = create_engine(server_url())
    try:
        with engine.connect() as connection:
            member = connection.execute(
                text("SELECT pg_has_role(current_user, 'pg_signal_backend', 'MEMBER')")).scalar_one()
    finally:
        engine.dispose()
    assert member is True, "run scripts/postgres/up.sh: it grants pg_signal_backend to the test role"
