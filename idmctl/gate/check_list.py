"""The preflight's checks, one module each, in the order of ``CHECK_NAMES`` (declared once, in
``idmctl.core.checks``, where failure postmortems read it without importing a check), and how one is run."""

from __future__ import annotations

from idmctl.core.checks import CHECK_NAMES, CheckResult, PreflightContext, Status
from idmctl.gate import cache, disk, introspection, io, loader, qos, shm, smoke, spec
from idmctl.plan import whatif

_BY_NAME = {module.NAME: module for module in (spec, introspection, loader, shm, io, qos, disk, cache, smoke)}
CHECKS = tuple(_BY_NAME[name] for name in CHECK_NAMES)
STATIC_CHECKS = tuple(module for module in CHECKS if module is not smoke)
"""Every check but the smoke: what submit re-runs on the effective job without starting the trainer."""


def run_check(check_module: object, ctx: PreflightContext) -> CheckResult:
    """A crashing check is a FAIL with its error, never a traceback that hides the other rows.
    A FAIL or WARN comes with its fixes recomputed by the same check on the altered spec (whatif)."""
    name = getattr(check_module, "NAME")
    try:
        return whatif.with_fixes(ctx, check_module, check_module.check(ctx))  # type: ignore[attr-defined]
    except Exception as exc:
        return CheckResult(name, Status.FAIL, f"check crashed: {type(exc).__name__}: {exc}", {},
                           "report this as an idmctl bug")
