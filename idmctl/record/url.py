"""Which store: SQLite in ``$IDMCTL_HOME`` (the embedded default) or a team's PostgreSQL named by
``IDMCTL_DB_URL``; and who writes. Importable without SQLAlchemy (the fast paths ask it first)."""

from __future__ import annotations

import getpass
import os
import socket
from urllib.parse import urlsplit

from ground.contract import ENV_DB_URL
from ground.errors import UserError
from ground.redact import _userinfo, redacted, scrubbed, secrets_in  # noqa: F401  (the store's names for them)

SHARED_SCHEMES = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2")


def shared_url() -> str | None:
    """The shared store's URL, or None for the embedded SQLite store. Any other scheme is bad input, and
    so is a password with a character that ends the user info early (``/ ? # @``): a URL parser then
    reads part of the password as the host or the path, so it would neither connect nor be masked."""
    url = os.environ.get(ENV_DB_URL, "").strip()
    if not url:
        return None
    scheme = url.split("://", 1)[0] if "://" in url else ""
    try:
        parts = urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # e.g. an invalid IPv6 literal or port: nothing of it is printed
        parts, hostname = None, None
    if scheme not in SHARED_SCHEMES or not hostname and "host=" not in url:
        raise UserError(f"not a PostgreSQL URL: {redacted(url)}", field=ENV_DB_URL,
                        hint="use postgresql://USER:PASSWORD@HOST:PORT/DB, or unset it for the SQLite store in IDMCTL_HOME")
    userinfo = _userinfo(url)
    if parts is not None and (userinfo != (parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None)
                              or userinfo is not None and "@" in userinfo):
        raise UserError(f"the user info is not percent-encoded: {redacted(url)}", field=ENV_DB_URL,
                        hint="write / ? # @ in the password as %2F %3F %23 %40")
    return url


def writer() -> tuple[str, str]:
    """(user, host) stamped on every row this process writes: the team store's "who did this"."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): the uid is still an answer
        user = str(os.getuid())
    return user, socket.gethostname()
