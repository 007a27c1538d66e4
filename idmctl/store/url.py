"""Which store: SQLite in ``$IDMCTL_HOME`` (the embedded default) or a team's PostgreSQL named by
``IDMCTL_DB_URL``; and who writes. Importable without SQLAlchemy (the fast paths ask it first)."""

from __future__ import annotations

import getpass
import os
import socket
from urllib.parse import urlsplit, urlunsplit

from ground.contract import ENV_DB_URL
from ground.errors import UserError

SHARED_SCHEMES = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2")


def shared_url() -> str | None:
    """The shared store's URL, or None for the embedded SQLite store. Any other scheme is bad input."""
    url = os.environ.get(ENV_DB_URL, "").strip()
    if not url:
        return None
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SHARED_SCHEMES or not urlsplit(url).hostname and "host=" not in url:
        raise UserError(f"not a PostgreSQL URL: {redacted(url)}", field=ENV_DB_URL,
                        hint="use postgresql://USER:PASSWORD@HOST:PORT/DB, or unset it for the SQLite store in IDMCTL_HOME")
    return url


def redacted(url: str) -> str:
    """The URL as it may be printed: the password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


def writer() -> tuple[str, str]:
    """(user, host) stamped on every row this process writes: the team store's "who did this"."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): the uid is still an answer
        user = str(os.getuid())
    return user, socket.gethostname()
