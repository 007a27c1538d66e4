"""A job's stored submission request (``Job.options_json``) read back: a row damaged outside idmctl (a
hand edit, a restore gone wrong) is one line naming the job, not a JSONDecodeError traceback.

``options_json`` holds the request only: every field of ``core.job_options.JobOptions`` plus
``rollback``.
Every other per-job fact has its own column, documented on ``models.Job`` (admission, code snapshot,
sacct runs, efficiency, derived exit code, committed step, controller, end claim, notices, eval link);
the eval link's columns are read back as one dict here (:func:`eval_link`), without the ORM.
"""

from __future__ import annotations

import json

from ground.errors import UserError
from idmctl.core.notice import warn
from idmctl.record.fast import connect, rows


def job_options(text: str | None, job: object) -> dict[str, object]:
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


LIST_COLUMNS = frozenset({"runs"})
"""The job columns whose value is a list of objects; every other JSON column holds one object."""
_warned: set[tuple[object, str]] = set()


def typed(value: object, column: str, job: object) -> dict[str, object] | list[dict[str, object]] | None:
    """A job's JSON ``column`` as its readers take it: an object (``runs``: a list of objects), or None.
    A value of another shape (a list or a number where an object belongs: a hand edit, a restore gone
    wrong) is one warning line naming the job and the column, once, and reads as never recorded: the
    command goes on showing the rest of the record, and nothing is written back."""
    if value is None:
        return None
    if column in LIST_COLUMNS:
        ok = isinstance(value, list) and all(isinstance(item, dict) for item in value)
    else:
        ok = isinstance(value, dict)
    if ok:
        return value  # type: ignore[return-value]  (checked just above: an object, or a list of objects)
    if (job, column) not in _warned:
        _warned.add((job, column))
        wanted = "a list of objects" if column in LIST_COLUMNS else "an object"
        warn(f"warning: job {job}: its stored {column} is damaged (a {type(value).__name__}, not {wanted}); "
             "read as not recorded (restore the store from a backup, or correct that row)")
    return None


def newest_efficiency(experiment: str) -> dict[str, object] | None:
    """The efficiency report of ``experiment``'s newest job that has one (None when none does, or when
    only the ORM can read the store: the efficiency hint is advice, and submit imports no ORM for it)."""
    with connect() as db:
        if db is None:
            return None
        found = rows(db, "SELECT id, efficiency FROM job WHERE experiment = ? AND efficiency IS NOT NULL "
                         "ORDER BY id DESC LIMIT 1", (experiment,))
    report = typed(found[0].efficiency, "efficiency", found[0].id) if found else None
    return report if isinstance(report, dict) else None


EVAL_FIELDS = ("of_chain", "step", "after", "choice", "replaces", "moved_to")
EVAL_OPTIONAL = ("replaces", "moved_to")
"""``{"of_chain": training chain id, "step": checkpoint step, "after": the training job's scheduler id
it waits on, "choice": the --eval value, "replaces": the eval job id it stands in for, "moved_to": the one
that stands in for it}`` (the last two absent when None); each is the column ``eval_<field>``."""


def eval_link(job: object) -> dict[str, object] | None:
    """The job's link to the training chain it evaluates (an ORM row or a fast-path row); None for any
    other job."""
    if getattr(job, "eval_of_chain", None) is None:
        return None
    link = {name: getattr(job, f"eval_{name}", None) for name in EVAL_FIELDS}
    return {name: value for name, value in link.items() if value is not None or name not in EVAL_OPTIONAL}
