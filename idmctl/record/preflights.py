"""Preflight results in the store, keyed by (spec hash, code version, cluster profile hash), and the
gate ``submit`` calls: :func:`require_pass`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ground.errors import CheckFailed
from ground.code_snapshot import code_version
from idmctl.core.checks import CheckResult, Status
from ground.paths import db_path
from idmctl.record.url import shared_url

if TYPE_CHECKING:
    from idmctl.core.profile import ClusterProfile
    from ground.spec.loader import ResolvedSpec
    from ground.spec.schema import ExperimentSpec
    from idmctl.record.models import PreflightCheck, PreflightRun



def version_for(spec: "ExperimentSpec") -> str:
    """The code version for this spec: the project's, plus its ``code.roots`` outside the project.
    (Looked up through this module's ``code_version``, so a test can pin it.)"""
    return code_version(spec) if spec.code.roots else code_version()

def record_run(resolved: "ResolvedSpec", profile_name: str, profile_hash: str, version: str,
               results: list[CheckResult], with_smoke: bool, seconds: float,
               job: Mapping[str, object] | None = None) -> "PreflightRun":
    """Store one preflight and its checks in one transaction; returns the run (with its id).

    ``job`` is :meth:`EffectiveJob.record` when preflight was given submit's flags; its ``smoke_flags``
    join (spec hash, code version, profile hash) in the key :func:`require_pass` looks up.
    """
    from idmctl.record.fast import connect, db_time, insert, rows  # start-up: 4 more project modules only this path needs

    failed = [r.name for r in results if r.status is Status.FAIL]
    document = {"checks": [r.as_dict() for r in results], "failed": failed,
                "smoke_flags": (job or {}).get("smoke_flags", {}), "job": job}
    values = dict(experiment=resolved.name, spec_hash=resolved.hash, code_version=version, profile_hash=profile_hash,
                  profile_name=profile_name, with_smoke=with_smoke, passed=not failed and with_smoke, seconds=seconds,
                  result_json=json.dumps(document, default=str))
    with connect() as fast:
        if fast is not None:  # the store is at head: plain sqlite3, no ORM import (a repeat preflight stays < 1 s)
            run_id = insert(fast, "preflight_run", {**values, "with_smoke": int(with_smoke),
                                                    "passed": int(bool(values["passed"])), "started_at": db_time()})
            for r in results:
                insert(fast, "preflight_check", {"run_id": run_id, "name": r.name, "status": r.status.value,
                                                 "summary": r.summary, "fix": r.fix,
                                                 "numbers_json": json.dumps(r.numbers, default=str)})
            (run,) = rows(fast, "SELECT * FROM preflight_run WHERE id = ?", (run_id,))
            run.with_smoke, run.passed = bool(run.with_smoke), bool(run.passed)
            return run  # type: ignore[no-any-return]
    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use
    from idmctl.record.models import PreflightCheck, PreflightRun  # start-up: pulls sqlalchemy and pydantic

    with session() as db:
        run = PreflightRun(**values)
        db.add(run)
        db.flush()
        db.add_all(PreflightCheck(run_id=run.id, name=r.name, status=r.status.value, summary=r.summary,
                                  numbers_json=json.dumps(r.numbers, default=str), fix=r.fix) for r in results)
    return run


def smoke_flags_of(run: "PreflightRun") -> dict[str, str]:
    """The smoke flags a preflight ran with ({} for a preflight of the spec as written)."""
    return dict(json.loads(run.result_json or "{}").get("smoke_flags") or {})


def _no_store_yet() -> bool:
    """No shared store and no SQLite file: nothing is recorded, and a read must not create the store (a dry
    run or a refused submit, a bad ``$IDMCTL_HOME``, leaves nothing behind)."""
    return not shared_url() and not db_path().exists()


def latest_run(spec_hash: str, code_version: str, profile_hash: str,
               with_smoke: bool | None = None, smoke_flags: dict[str, str] | None = None) -> "PreflightRun | None":
    """The newest preflight of exactly this key (optionally only full / only static ones).

    Read with plain sqlite3 when the store is at head (submit never imports the ORM), else the ORM."""
    from idmctl.record.fast import connect, rows  # start-up: 4 more project modules only this path needs

    wanted = smoke_flags or {}
    with connect() as db:
        if db is not None:
            sql = ("SELECT id, experiment, spec_hash, code_version, profile_hash, profile_name, with_smoke, passed, "
                   "seconds, result_json FROM preflight_run WHERE spec_hash = ? AND code_version = ? AND profile_hash = ?")
            params: tuple[object, ...] = (spec_hash, code_version, profile_hash)
            if with_smoke is not None:
                sql, params = sql + " AND with_smoke = ?", (*params, int(with_smoke))
            runs = rows(db, sql + " ORDER BY id DESC", params)
            for run in runs:
                run.with_smoke, run.passed = bool(run.with_smoke), bool(run.passed)
            return next((run for run in runs if smoke_flags_of(run) == wanted), None)  # type: ignore[return-value]
    if _no_store_yet():
        return None
    from sqlmodel import col, select

    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use
    from idmctl.record.models import PreflightRun  # start-up: pulls sqlalchemy and pydantic

    query = select(PreflightRun).where(PreflightRun.spec_hash == spec_hash, PreflightRun.code_version == code_version,
                                       PreflightRun.profile_hash == profile_hash)
    if with_smoke is not None:
        query = query.where(PreflightRun.with_smoke == with_smoke)
    with session() as orm:
        found = orm.exec(query.order_by(col(PreflightRun.id).desc())).all()
    return next((run for run in found if smoke_flags_of(run) == wanted), None)


def run_checks(run_id: int) -> list["PreflightCheck"]:
    from sqlmodel import col, select

    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use
    from idmctl.record.models import PreflightCheck  # start-up: pulls sqlalchemy and pydantic

    with session() as db:
        return list(db.exec(select(PreflightCheck).where(PreflightCheck.run_id == run_id)
                            .order_by(col(PreflightCheck.id))).all())


def preflight_run(run_id: int | None) -> "PreflightRun | None":
    """The preflight run with this id (detached: its columns stay readable), or None (none, or no id)."""
    if not run_id:
        return None
    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use
    from idmctl.record.models import PreflightRun  # start-up: as above

    with session() as orm:
        run = orm.get(PreflightRun, run_id)
        if run is not None:
            orm.expunge(run)
        return run


def _failed_names(run: "PreflightRun") -> list[str]:
    return list(json.loads(run.result_json or "{}").get("failed", []))


def flags_text(flags: dict[str, str]) -> str:
    """`` --gres gpu:2 --entry x``: the smoke flags as they go on a command line (empty when none)."""
    return "".join(f" {flag} {value}" for flag, value in sorted(flags.items()))


def _why_no_match(resolved: "ResolvedSpec", profile_name: str, profile_hash: str, version: str,
                  smoke_flags: dict[str, str]) -> str:
    """Say what changed since this experiment's newest preflight on this cluster profile."""
    from sqlmodel import col, select

    from idmctl.record import session  # start-up: record's session loads SQLAlchemy on first use
    from idmctl.record.models import PreflightRun  # start-up: pulls sqlalchemy and pydantic

    newest = same_profile = None
    if not _no_store_yet():
        with session() as db:
            newest = db.exec(select(PreflightRun).where(PreflightRun.experiment == resolved.name)
                             .order_by(col(PreflightRun.id).desc())).first()
            same_profile = db.exec(select(PreflightRun).where(PreflightRun.experiment == resolved.name,
                                                              PreflightRun.profile_hash == profile_hash)
                                   .order_by(col(PreflightRun.id).desc())).first()
    run_it = f"run `idmctl preflight {resolved.name} --cluster {profile_name}{flags_text(smoke_flags)}`"
    if newest is not None and same_profile is not None and same_profile.spec_hash == resolved.hash \
            and same_profile.code_version == version and smoke_flags_of(same_profile) != smoke_flags:
        return (f"no preflight of {resolved.name} with{flags_text(smoke_flags) or 'out smoke flags'} "
                f"(the smoke measured the job as run with{flags_text(smoke_flags_of(same_profile)) or 'out --gres/--entry'}; "
                f"--gres and --entry change what it measures): {run_it}")
    if newest is None:
        return f"no preflight for {resolved.name}: {run_it}"
    if same_profile is None:
        return (f"no preflight of {resolved.name} for cluster profile {profile_name} ({profile_hash[:12]}); "
                f"the last one was for {newest.profile_name}: {run_it}")
    if same_profile.spec_hash != resolved.hash:
        return (f"spec changed since preflight #{same_profile.id} of {resolved.name} (hash {same_profile.spec_hash[:12]} → "
                f"{resolved.hash[:12]}): {run_it}")
    return (f"code changed since preflight #{same_profile.id} of {resolved.name} (code {same_profile.code_version} → "
            f"{version}): {run_it}")


def require_pass(resolved: "ResolvedSpec", profile: "ClusterProfile", profile_hash: str,
                 smoke_flags: dict[str, str] | None = None, version: str | None = None) -> "PreflightRun":
    """The passing full preflight for (this spec, this code, this profile, these smoke flags), or
    CheckFailed saying why not.

    The newest preflight of the key must have no FAIL, and a full one (with the smoke) must have
    passed: ``--no-smoke`` can confirm a pass but never create one.
    """
    wanted = smoke_flags or {}
    version = version or version_for(resolved.spec)
    latest = latest_run(resolved.hash, version, profile_hash, smoke_flags=wanted)
    if latest is None:
        raise CheckFailed(f"preflight required: {_why_no_match(resolved, profile.name, profile_hash, version, wanted)}")
    command = f"idmctl preflight {resolved.name} --cluster {profile.name}{flags_text(wanted)}"
    run_it = f"fix it and rerun `{command}`"
    failed = _failed_names(latest)
    if failed:
        raise CheckFailed(f"preflight #{latest.id} of {resolved.name} failed ({', '.join(failed)}): {run_it}")
    full = latest if latest.with_smoke else latest_run(resolved.hash, version, profile_hash, with_smoke=True,
                                                       smoke_flags=wanted)
    if full is None:
        raise CheckFailed(f"preflight #{latest.id} of {resolved.name} was static-only (--no-smoke cannot unlock "
                          f"submit): run `{command}` with the smoke")
    if not full.passed:
        raise CheckFailed(f"preflight #{full.id} of {resolved.name} failed ({', '.join(_failed_names(full)) or 'smoke'}): "
                          f"{run_it}")
    return full


def latest_passing(resolved: "ResolvedSpec", profile_hash: str, smoke_flags: dict[str, str] | None = None,
                   version: str | None = None) -> "PreflightRun | None":
    """What :func:`require_pass` would return, or None where it would refuse."""
    from types import SimpleNamespace

    try:
        return require_pass(resolved, SimpleNamespace(name="?"), profile_hash, smoke_flags, version)  # type: ignore[arg-type]
    except CheckFailed:
        return None


def latest_smoke_numbers(spec_hash: str) -> tuple[str | None, int | None]:
    """(numbers_json, preflight run id) of the newest smoke check of this spec that ran (any cluster), or
    (None, None). Plain sqlite3 when the store is at head (submit imports no ORM); an older store is
    migrated once by the ORM, then read the same way. A read never creates a store."""
    from idmctl.record.fast import connect, rows  # start-up: 4 more project modules only this path needs

    query = ("SELECT c.numbers_json, r.id AS run_id FROM preflight_check c JOIN preflight_run r ON c.run_id = r.id "
             "WHERE r.spec_hash = ? AND c.name = 'smoke' AND c.status != 'SKIP' ORDER BY r.id DESC LIMIT 1")
    for attempt in range(2):
        with connect() as fast:
            if fast is not None:
                found = rows(fast, query, (spec_hash,))
                return (found[0].numbers_json, found[0].run_id) if found else (None, None)
        if attempt == 0:
            if not db_path().exists():
                return None, None  # no store, no smoke recorded (a dry-run writes nothing)
            from idmctl.record.db import open_store  # start-up: SQLAlchemy's import is ~0.3 s of a cold preflight

            open_store()  # an older revision: the ORM migrates it, once
    return None, None
