"""Check ``cache``: every episode of the training split has its hidden-state file, with the
geometry the spec (and so the model) expects, and so has every held-out episode the spec's evaluations
read (``eval.episodes`` counts of ``data.eval_split``): a run whose 24-episode held-out cache was never
built would train for hours and then fail, or score fewer episodes, at its first evaluation. The card
builds held-out caches separately (~7 min), so the FAIL names that build and what it encodes."""

from __future__ import annotations

from ground.paths import expand_path, why_not_a_directory
from idmctl.core.checks import CacheInspection, CheckResult, PreflightContext, Status
from ground.spec.schema import DataSpec, ExperimentSpec
from ground.tracking import eef_metric

NAME = "cache"
SHOWN = 3
"""Missing/mismatched episodes named in the summary; the count says how many more."""


def inspect_split(spec: ExperimentSpec, split: str) -> CacheInspection:
    """Open every cache file of ``split`` and compare its header with the spec (imports torch)."""
    from cache.episodes import list_demos
    from cache.hidden import cache_file, check_matches, inspect_file
    from ground.errors import UserError

    data = spec.data
    try:
        demos = list_demos(expand_path(data.episodes), split)
    except UserError as exc:
        return CacheInspection(split, 0, error=exc.line().removeprefix("error: "))
    root = expand_path(data.cache_root)
    missing: list[str] = []
    mismatched: list[str] = []
    for demo in demos:
        path = cache_file(root, demo, data.cache_format)
        if not path.exists():
            missing.append(demo)
            continue
        try:
            info = inspect_file(path)
            check_matches(info, layers=data.cached_layers, frames=data.frames, token_grid=data.token_grid,
                          channels=data.channels, dtype=data.dtype, routed=data.selected_blocks)
        except UserError as exc:
            mismatched.append(f"{demo}: {exc.what}")
            continue
        stale = stale_models(data, info.meta)
        if stale:
            mismatched.append(f"{demo}: stale cache, {stale}")
    return CacheInspection(split, len(demos), missing, mismatched)


def stale_models(data: DataSpec, meta: dict[str, object]) -> str | None:
    """When the spec names the models and the file was built by others: both identities side by side."""
    differ = [f"{key} built by {meta.get(key) or 'unrecorded'!s} ≠ spec {want}"
              for key, want in (("vae", data.vae_id), ("transformer", data.transformer_id))
              if want is not None and meta.get(key) != want]
    return "; ".join(differ) or None


def _describe(found: CacheInspection) -> str:
    if found.error:
        return f"{found.split}: {found.error}"
    parts = [f"{found.split}: {found.episodes - len(found.missing) - len(found.mismatched)}/{found.episodes} episodes ok"]
    if found.missing:
        more = f" (+{len(found.missing) - SHOWN} more)" if len(found.missing) > SHOWN else ""
        parts.append(f"missing {', '.join(found.missing[:SHOWN])}{more}")
    if found.mismatched:
        more = f" (+{len(found.mismatched) - SHOWN} more)" if len(found.mismatched) > SHOWN else ""
        parts.append(f"mismatched {'; '.join(found.mismatched[:SHOWN])}{more}")
    return ", ".join(parts)


def held_out_problem(experiment: str, spec: ExperimentSpec, found: CacheInspection | None) -> tuple[str, str] | None:
    """(what is missing, the build that makes it and its cost) when the held-out split the evaluations
    read is not all cached with the spec's geometry (the eval loader opens every file of the split);
    None when it is."""
    data = spec.data
    if found is None or data.eval_split == data.train_split:
        return None
    metrics = ", ".join(eef_metric(n) for n in spec.eval.episodes)
    build = f"`idmctl submit {experiment} --build hidden` (or `idmctl cache build-hidden {experiment}`)"
    if found.error:
        return (f"the evaluations ({metrics}) cannot read held-out split {data.eval_split!r}: {found.error}",
                f"fix data.episodes / data.eval_split so the held-out mask exists, then build it: {build}")
    todo = len(found.missing) + len(found.mismatched)
    if not todo:
        return None
    return (f"the evaluations ({metrics}) read held-out split {data.eval_split!r} and {todo} of its "
            f"{found.episodes} episodes have no usable cache file",
            f"build them before training: {build}; cost: {todo} of {found.episodes} {data.eval_split} episodes to "
            f"encode, one hidden-state file each (files already built are skipped; `idmctl preflight {experiment} "
            "--build hidden` measures s/file and bytes/file first)")


def check(ctx: PreflightContext) -> CheckResult:
    data = ctx.spec.data
    measured = ctx.measurements
    root = expand_path(data.cache_root)
    if not measured.cache_present:
        why = why_not_a_directory(root)
        where = f"cache_root {root} {why}" + (" on this machine" if why == "does not exist" else "")
        if data.cache_files:
            where += f" (expected {data.cache_files:,} {data.cache_format} files)"
        if ctx.is_this_machine or why != "does not exist":  # a file or a loop is here, and wrong
            return CheckResult(NAME, Status.FAIL, f"{where}: the run would fail loading its first sample",
                               {"present": False}, "build the cache (idmctl cache build-hidden EXP) or fix data.cache_root")
        return CheckResult(NAME, Status.WARN, f"{where}: not verified here; run preflight on a node that mounts it",
                           {"present": False}, f"run `idmctl preflight` where {data.cache_root} is mounted")
    inspections = {found.split: found for found in measured.cache_inspections}
    train = inspections.get(data.train_split)
    numbers = {"present": True, **{f"{s}_episodes": f.episodes for s, f in inspections.items()},
               **{f"{s}_missing": len(f.missing) for s, f in inspections.items()},
               **{f"{s}_mismatched": len(f.mismatched) for s, f in inspections.items()}}
    summary = "; ".join(_describe(found) for found in inspections.values()) or "nothing inspected"
    if train is None or train.error or train.missing or train.mismatched or train.episodes == 0:
        fix = "build the missing entries (idmctl cache build-hidden EXP) or fix the spec's geometry"
        if train is not None and any("stale cache" in m for m in train.mismatched):
            fix = ("rebuild with the models the spec names (data.models; idmctl submit EXP --build hidden), "
                   "or set data.vae_id / data.transformer_id to the models that built it")
        return CheckResult(NAME, Status.FAIL, summary, numbers, fix)
    held_out = held_out_problem(ctx.resolved.name, ctx.spec, inspections.get(data.eval_split))
    if held_out is not None:
        return CheckResult(NAME, Status.FAIL, f"{summary}; {held_out[0]}", numbers, held_out[1])
    return CheckResult(NAME, Status.PASS, f"{root}: {summary}", numbers)
