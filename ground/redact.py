"""Credentials never printed: one place that masks a URL, and scrubs the secrets the environment's URLs
carry out of any text (a driver's error message, an error line, a log line).

Masking works on the text, never through a URL parser: ``urlsplit`` ends the authority at the first
``/ ? #`` and so found no password in ``postgresql://u:a/b@host/db``, and the whole URL was printed.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

_SECRET_PARAM = re.compile(r"(pass|secret|token|key|auth|cred)", re.IGNORECASE)
"""Query parameters whose value is a credential (libpq's ``password``, ``sslpassword``, ``passfile``...)."""
HIDDEN = "***"


def _userinfo(url: str) -> str | None:
    """Everything between ``scheme://`` and the last ``@``: the user info, however odd its characters.
    A parser stops the authority at the first ``/ ? #``, and a password may hold those (and ``@``).
    An ``@`` in the query (rare) makes this take more than the user info: over-masking, never a leak."""
    _, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return None
    return rest.rpartition("@")[0]


def redacted(url: str) -> str:
    """The URL as it may be printed: no part of any credential, whatever its form. The user info (user
    and password: a token may stand in the user's place), the value of every query parameter that
    carries a secret (``?password=``) and any fragment become ``***``. Done on the text, not through a
    URL parser, so a malformed URL is masked the same way (the parser is where the old masking failed)."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:  # not a URL at all (a libpq "host=... password=..." string, or garbage): mask key=value secrets
        return _mask_params(text, separators=" ")
    userinfo = _userinfo(text)
    if userinfo is not None:
        rest = HIDDEN + "@" + rest[len(userinfo) + 1:]
    rest, hash_sign, _ = rest.partition("#")
    base, question, query = rest.partition("?")
    shown = f"{scheme}://{base}"
    if question:
        shown += "?" + _mask_params(query, separators="&;")
    if hash_sign:
        shown += "#" + HIDDEN
    return shown


def _mask_params(text: str, *, separators: str) -> str:
    parts = re.split(f"([{re.escape(separators)}])", text)
    for i, part in enumerate(parts):
        name, eq, _ = part.partition("=")
        if eq and _SECRET_PARAM.search(name):
            parts[i] = f"{name}={HIDDEN}"
    return "".join(parts)


def secrets_in(url: str) -> list[str]:
    """The credential strings a URL carries (its user info and password, secret query values), for
    scrubbing them from text that did not come from :func:`redacted` (a driver's error message)."""
    found: list[str] = []
    userinfo = _userinfo(url) or ""
    if userinfo:  # the password, or the whole user info when it has none (a token in the user's place)
        found += [userinfo, userinfo.split(":", 1)[1]] if ":" in userinfo else [userinfo]
    _, _, query = url.partition("?")
    for part in re.split(r"[&;# ]", query):
        name, eq, value = part.partition("=")
        if eq and value and _SECRET_PARAM.search(name):
            found.append(value)
    return sorted({s for s in found if len(s) >= 3} | {unquote(s) for s in found if len(s) >= 3}, key=len, reverse=True)


def scrubbed(text: str, url: str | None) -> str:
    """``text`` with every credential of ``url`` replaced by ``***``."""
    if not url:
        return text
    for secret in secrets_in(url):
        text = text.replace(secret, HIDDEN)
    return text


def environment_secrets() -> list[str]:
    """The credentials in this process's environment: those of every variable whose value is a URL with
    user info or a secret query parameter (``IDMCTL_DB_URL``, ``MLFLOW_TRACKING_URI``, a test server's URL)."""
    found: set[str] = set()
    for value in os.environ.values():
        if "://" in value and ("@" in value or "=" in value):
            found.update(s for s in secrets_in(value) if len(s) >= MIN_SCRUBBED)
    return sorted(found, key=len, reverse=True)


MIN_SCRUBBED = 8
"""This net under every message skips shorter credentials: a test server's ``idmctl:idmctl`` would turn
every ``idmctl`` in a message into ``***``. URLs themselves are printed only through :func:`redacted`,
which masks a credential of any length."""


def scrub_environment(text: str) -> str:
    """``text`` with every credential of the environment's URLs replaced by ``***``."""
    for secret in environment_secrets():
        text = text.replace(secret, HIDDEN)
    return text
