"""Preflight results in the store, keyed by (spec hash, code version, cluster profile hash), and the
gate ``submit`` calls: :func:`require_pass`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ground.errors import CheckFailed
from ground.contract import code_version
from idmctl.preflight.result import CheckResult, Status

if TYPE_CHECKING:
    from idmctl.profile import ClusterProfile
    from ground.spec.loader import ResolvedSpec
    from idmctl.store.models import PreflightCheck, PreflightRun


def record_run(resolved: "ResolvedSpec", profile_name: str, profile_hash: str, version: str,
               results: list[CheckResult], with_smoke: bool, seconds: float) -> "PreflightRun":
    """Store one preflight and its checks in one transaction; returns the run (with its id)."""
    from idmctl.store import session
    from idmctl.store.models import PreflightCheck, PreflightRun

    failed = [r.name for r in results if r.status is Status.FAIL]
    document = {"checks": [r.as_dict() for r in results], "failed": failed}
    with session() as db:
        run = PreflightRun(experiment=resolved.name, spec_hash=resolved.hash, code_version=version,
                           profile_hash=profile_hash, profile_name=profile_name, with_smoke=with_smoke,
                           passed=not failed and with_smoke, seconds=seconds,
                           result_json=json.dumps(document, default=str))
        db.add(run)
        db.flush()
        db.add_all(PreflightCheck(run_id=run.id, name=r.name, status=r.status.value, summary=r.summary,
                                  numbers_json=json.dumps(r.numbers, default=str), fix=r.fix) for r in results)
    return run


def latest_run(spec_hash: str, code_version: str, profile_hash: str,
               with_smoke: bool | None = None) -> "PreflightRun | None":
    """The newest preflight of exactly this key (optionally only full / only static ones)."""
    from sqlmodel import col, select

    from idmctl.store import session
    from idmctl.store.models import PreflightRun

    query = select(PreflightRun).where(PreflightRun.spec_hash == spec_hash, PreflightRun.code_version == code_version,
                                       PreflightRun.profile_hash == profile_hash)
    if with_smoke is not None:
        query = query.where(PreflightRun.with_smoke == with_smoke)
    with session() as db:
        return db.exec(query.order_by(col(PreflightRun.id).desc())).first()


def run_checks(run_id: int) -> list["PreflightCheck"]:
    from sqlmodel import col, select

    from idmctl.store import session
    from idmctl.store.models import PreflightCheck

    with session() as db:
        return list(db.exec(select(PreflightCheck).where(PreflightCheck.run_id == run_id)
                            .order_by(col(PreflightCheck.id))).all())


def _failed_names(run: "PreflightRun") -> list[str]:
    return list(json.loads(run.result_json or "{}").get("failed", []))


def _why_no_match(resolved: "ResolvedSpec", profile_name: str, profile_hash: str, version: str) -> str:
    """Say what changed since this experiment's newest preflight on this cluster profile."""
    from sqlmodel import col, select

    from idmctl.store import session
    from idmctl.store.models import PreflightRun

    with session() as db:
        newest = db.exec(select(PreflightRun).where(PreflightRun.experiment == resolved.name)
                         .order_by(col(PreflightRun.id).desc())).first()
        same_profile = db.exec(select(PreflightRun).where(PreflightRun.experiment == resolved.name,
                                                          PreflightRun.profile_hash == profile_hash)
                               .order_by(col(PreflightRun.id).desc())).first()
    run_it = f"run `idmctl preflight {resolved.name} --cluster {profile_name}`"
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


def require_pass(resolved: "ResolvedSpec", profile: "ClusterProfile", profile_hash: str) -> "PreflightRun":
    """The passing full preflight for (this spec, this code, this profile), or CheckFailed saying why not.

    The newest preflight of the key must have no FAIL, and a full one (with the smoke) must have
    passed: ``--no-smoke`` can confirm a pass but never create one.
    """
    version = code_version()
    latest = latest_run(resolved.hash, version, profile_hash)
    if latest is None:
        raise CheckFailed(f"preflight required: {_why_no_match(resolved, profile.name, profile_hash, version)}")
    run_it = f"fix it and rerun `idmctl preflight {resolved.name} --cluster {profile.name}`"
    failed = _failed_names(latest)
    if failed:
        raise CheckFailed(f"preflight #{latest.id} of {resolved.name} failed ({', '.join(failed)}): {run_it}")
    full = latest if latest.with_smoke else latest_run(resolved.hash, version, profile_hash, with_smoke=True)
    if full is None:
        raise CheckFailed(f"preflight #{latest.id} of {resolved.name} was static-only (--no-smoke cannot unlock "
                          f"submit): run `idmctl preflight {resolved.name} --cluster {profile.name}` with the smoke")
    if not full.passed:
        raise CheckFailed(f"preflight #{full.id} of {resolved.name} failed ({', '.join(_failed_names(full)) or 'smoke'}): "
                          f"{run_it}")
    return full
