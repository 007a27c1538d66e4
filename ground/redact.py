"""Credentials never printed: one place that masks a URL, and scrubs the secrets the environment's URLs
carry out of any text (a driver's error message, an error line, a log line).

Masking works on the text, never through a URL parser: ``urlsplit`` ends the authority at the first
``/ ? #`` and so found no password in ``postgresql://u:a/b@host/db``, and the whole URL was printed.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

from ground.contract import ENV_NOTIFY

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


WEBHOOK_SCHEMES = ("json", "jsons", "form", "forms", "xml", "xmls")
"""Notification URL schemes whose host is a server's name (apprise's generic webhooks). In the others the
host itself may be the credential (``slack://TokenA/TokenB/TokenC``, ``tgram://bot-token/chat``,
``ntfy://private-topic``), so it is never shown."""


def notify_urls(text: str) -> list[str]:
    """The URLs of a notification list as apprise reads one: separated by spaces or commas."""
    return [url for url in re.split(r"[\s,]+", text) if url]


def _notify_parts(url: str) -> tuple[str, str | None, str, list[str], str]:
    """(scheme, user info, host, path segments, query and fragment) of a notification URL, on the text."""
    scheme, _, rest = url.partition("://")
    userinfo = _userinfo(url)
    if userinfo is not None:
        rest = rest[len(userinfo) + 1:]
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    rest, tail = rest[:cut], rest[cut:]
    host, *path = rest.split("/")
    return scheme.lower(), userinfo, host, [segment for segment in path if segment], tail


def redacted_notify_url(url: str) -> str:
    """A notification URL as it may be printed: its scheme, and its host where that is a server's name
    (:data:`WEBHOOK_SCHEMES`); every other part (user info, tokens in the host or the path, a webhook's
    key in its path, the query) is ``***``. Done on the text, so a malformed URL is masked the same way."""
    if "://" not in url:
        return HIDDEN
    scheme, userinfo, host, path, tail = _notify_parts(url)
    shown = f"{scheme}://" + (f"{HIDDEN}@" if userinfo is not None else "")
    shown += host if scheme in WEBHOOK_SCHEMES else HIDDEN
    return shown + (f"/{HIDDEN}" if path else "") + (f"?{HIDDEN}" if tail else "")


def notify_secrets(url: str) -> list[str]:
    """Every part of a notification URL that :func:`redacted_notify_url` hides, for scrubbing it from text
    that did not come from there (a notification library's error message)."""
    if "://" not in url:
        return [url] if len(url) >= 3 else []
    scheme, userinfo, host, path, tail = _notify_parts(url)
    found = [*path, *secrets_in(url)]
    if userinfo:  # every piece: an '@' in the query makes the user info run on past the password
        found += [userinfo, *re.split(r"[:@?&=#/]", userinfo)]
    if scheme not in WEBHOOK_SCHEMES:  # the host is a token here, and so is each side of a ':' in it (tgram's bot id)
        found += [host, *host.split(":")]
    found += [value for part in re.split(r"[?&;#]", tail) for value in part.split("=", 1)[1:]]
    return sorted({s for s in found if len(s) >= 3} | {unquote(s) for s in found if len(s) >= 3}, key=len, reverse=True)


def environment_secrets() -> list[str]:
    """The credentials in this process's environment: those of every variable whose value is a URL with
    user info or a secret query parameter (``IDMCTL_DB_URL``, ``MLFLOW_TRACKING_URI``, a test server's URL),
    and every hidden part of the notification URLs in ``IDMCTL_NOTIFY`` (tokens in a path, no ``@`` needed)."""
    found: set[str] = set()
    for value in os.environ.values():
        if "://" in value and ("@" in value or "=" in value):
            found.update(s for s in secrets_in(value) if len(s) >= MIN_SCRUBBED)
    for url in notify_urls(os.environ.get(ENV_NOTIFY, "")):
        found.update(s for s in notify_secrets(url) if len(s) >= MIN_SCRUBBED)
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
