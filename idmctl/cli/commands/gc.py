"""``idmctl gc [--dry-run] [--json]``: remove the code snapshots no unfinished chain uses."""

from __future__ import annotations

from typing import Annotated

import typer

from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json


def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    cluster: options.Cluster = None,
    as_json: options.Json = False,
) -> None:
    """Remove the code snapshots no pending, running or unfinished chain uses (never one in use).

    File contents no remaining snapshot links to go with them. Only what submit wrote is removed: a folder
    without a snapshot manifest, or a file in the object store not named like an object, stays."""
    from ground.units import format_bytes  # start-up: only this command needs it (2 more project modules)
    from idmctl.job.code import store_for  # start-up: only this command needs it (16 more project modules)
    from idmctl.job.code_gc import collect  # start-up: only this command needs it
    from idmctl.core.profile import load_profile  # start-up: pulls pydantic

    store = store_for(load_profile(cluster)[0])
    done = collect(store, dry_run=dry_run)
    if as_json:
        emit_json({"store": str(done.store), "dry_run": dry_run, "kept": done.kept, "removed": done.removed,
                   "freed_bytes": done.freed_bytes, "foreign": done.foreign, "others": list(done.others),
                   "refused": list(done.refused)})
        return
    verb = "would remove" if dry_run else "removed"
    console.print(f"{done.store}: {verb} {len(done.removed)} snapshot(s), {format_bytes(done.freed_bytes)} of file "
                  f"contents; kept {len(done.kept)} in use", markup=False)
    for name in done.removed:
        console.print(f"  {verb} {name}", markup=False)
    if done.foreign:
        shown = ", ".join(done.foreign[:5]) + (f" and {len(done.foreign) - 5} more" if len(done.foreign) > 5 else "")
        console.print(f"  left {len(done.foreign)} entr{'y' if len(done.foreign) == 1 else 'ies'} idmctl did not "
                      f"write: {shown}", markup=False)
    if done.others:
        console.print(f"  left {len(done.others)} snapshot(s) other users wrote (theirs to collect): "
                      f"{', '.join(done.others[:5])}{' …' if len(done.others) > 5 else ''}", markup=False)
    for entry in done.refused:
        console.print(f"  could not remove {entry}", markup=False)
