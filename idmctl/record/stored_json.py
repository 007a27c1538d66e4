"""The JSON columns of the store (a job's ``options_json``) read back: a row damaged outside idmctl (a
hand edit, a restore gone wrong) is one line naming the job, not a JSONDecodeError traceback."""

from __future__ import annotations

import json
from typing import Any

from ground.errors import UserError


def job_options(text: str | None, job: object) -> dict[str, Any]:
    """A job row's ``options_json`` as a dict (``{}`` when empty)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        raise UserError(f"job {job}: its stored record is damaged (options_json is not JSON{where})", field="store",
                        hint="restore the store from a backup, or delete that job's row") from None
    if not isinstance(value, dict):
        raise UserError(f"job {job}: its stored record is damaged (options_json is a {type(value).__name__}, "
                        "not an object)", field="store", hint="restore the store from a backup, or delete that job's row")
    return value
