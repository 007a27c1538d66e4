"""The JSON columns of the store (a job's ``options_json``) read back: a row damaged outside idmctl (a
hand edit, a restore gone wrong) is one line naming the job, not a JSONDecodeError traceback.

Every read of ``Job.options_json`` outside ``idmctl/record/`` goes through :func:`job_options` (or a query
of ``idmctl.record``), so this is the one place that knows the grab-bag's keys. They are, by writer:

- submit (``ops/submit.py``): every field of ``core.job_options.JobOptions`` (``job_name``, ``qos``,
  ``partition``, ``nodes``, ``ranks_per_node``, ``cpus_per_node``, ``mem``, ``gpus_per_node``, ``time_limit``,
  ``exclude``, ``retries``, ``entry``, ``hang_k``, ``hang_floor_s``, ``hang_poll_s``, ``signal_lead``,
  ``checkpoint_every``, ``derivation``, ``hold``, ``build``), plus ``rollback`` (a resubmission that starts
  from the previous checkpoint), ``admitted`` (the submit-time admission: ``{"admission": {"failed": [...],
  ...}}`` and the effective job's record: ``flags``, ``smoke_flags``, ``spec_hash``, ``effective_spec_hash``,
  ``changed``, ``exclusions``) and ``code`` (the code snapshot the job runs, ``job.code.JobCode``);
- sync (``ops/sync.py``): ``runs`` (one entry per Slurm run of the job: state, exit code, reason and
  sacct's usage) and ``efficiency`` (``plan.efficiency.EfficiencyReport.as_dict``);
- ``jobs import`` (``ops/failures/importer.py``): ``derived_exit_code`` (sacct's, for jobs idmctl did not
  submit).

Each of these is meant to become a typed column of ``job`` (a migration with a data step); until then a
new per-job fact goes under a named key here, read back through one function of ``idmctl.record``.
"""

from __future__ import annotations

import json
from typing import Any

from ground.errors import UserError
from idmctl.record.fast import connect


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


def newest_of_experiment(experiment: str, key: str) -> Any:
    """The value under ``key`` in the stored options of ``experiment``'s newest job that has one (None when
    none does, or when only the ORM can read the store: the efficiency hint is advice, and submit imports
    no ORM for it)."""
    with connect() as db:
        if db is None:
            return None
        row = db.execute("SELECT options_json FROM job WHERE experiment = ? AND options_json LIKE ? "
                         "ORDER BY id DESC LIMIT 1", (experiment, f'%"{key}"%')).fetchone()
    if row is None:
        return None
    return job_options(row["options_json"], f"of {experiment}").get(key)


def imported_options(derived_exit_code: str | None) -> str:
    """The ``options_json`` of a job ``jobs import`` pulled from sacct: only its derived exit code."""
    return json.dumps({"derived_exit_code": derived_exit_code})
