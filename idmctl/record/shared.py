"""The team's PostgreSQL store (``IDMCTL_DB_URL``): the same SQLModel models and Alembic migrations
as the SQLite store. psycopg (3, SQLAlchemy 2.1's default driver) is imported
only here, only for such a URL.

Every way it can fail to open is one line naming the URL without its password and what to do:
unreachable server, wrong password or database, a schema newer than this idmctl knows.
"""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, NoSuchModuleError

from ground.contract import ENV_DB_URL
from ground.errors import UserError
from idmctl.record.head import HEAD_REVISION
from idmctl.record.migrate import known_revisions, upgrade
from idmctl.record.url import redacted, scrubbed

MIGRATION_LOCK = 0x1D3C7
"""pg_advisory_lock key: one process migrates a new shared store while the others wait for it."""
CONNECT_TIMEOUT_S = 5


def _fail(url: str, what: str, hint: str) -> UserError:
    return UserError(f"{what}: {redacted(url)}", field=ENV_DB_URL, hint=hint)


def _reason(exc: BaseException, url: str) -> str:
    """The server's or libpq's first line (psycopg puts the useful part first), without the URL's secrets
    (libpq quotes what it took for the host, which for a badly encoded URL is part of the password)."""
    orig = getattr(exc, "orig", None) or exc
    return scrubbed((str(orig).strip().splitlines() or ["?"])[0], url)


def _stored_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        if connection.execute(text("SELECT to_regclass('alembic_version')")).scalar() is None:
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def open_shared(url: str) -> Engine:
    """An engine for the shared store, migrated to head (under an advisory lock when it is not)."""
    try:
        engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    except NoSuchModuleError as exc:
        raise _fail(url, "no driver for this URL", "pip install 'psycopg[binary]' (pyproject lists it)") from exc
    except ImportError as exc:
        raise _fail(url, f"the PostgreSQL driver is missing ({exc.name})", "pip install 'psycopg[binary]'") from exc
    except Exception as exc:  # sqlalchemy.exc.ArgumentError: a URL it cannot parse
        raise _fail(url, f"not a usable URL ({scrubbed(str(exc), url)})", "use postgresql://USER:PASSWORD@HOST:PORT/DB") from exc
    try:
        stored = _stored_revision(engine)
        if stored != HEAD_REVISION:
            if stored is not None and stored not in known_revisions():
                raise _fail(url, f"the shared store is at schema {stored}, newer than this idmctl knows "
                                 f"(head {HEAD_REVISION})", "upgrade idmctl to the team's version")
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
                try:
                    upgrade(url)  # a no-op when another process migrated while this one waited
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                    connection.commit()
    except DBAPIError as exc:
        if "permission denied" in (reason := _reason(exc, url)):  # a member's role: the owner migrates and grants
            raise _fail(url, f"cannot use the shared store ({reason})", "ask the store's owner to run any idmctl "
                        "command once with the owner's login (it migrates) and to grant your role (runbook: One role "
                        "per member)") from exc
        raise _fail(url, f"cannot use the shared store ({reason})",
                    f"check the server is up and the user, password and database in {ENV_DB_URL}, "
                    "or unset it for the SQLite store in IDMCTL_HOME") from exc
    return engine
