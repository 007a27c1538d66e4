"""``idmctl failures [EXP]`` (the postmortem table) and ``idmctl failures fix JOB... --note``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click import Command, Context  # typer 0.29's own click: click itself is ~12 ms more to import
from typer.core import TyperGroup

from idmctl.cli.commands import options
from idmctl.cli.output import console, emit_json, emit_json_rows, make_table


class _ArgumentOrSubcommand(TyperGroup):
    """``failures fix ...`` runs the subcommand; anything else is the report's optional EXP argument."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if args and args[0] in self.commands:
            Command.parse_args(self, ctx, [])  # the report's own options take their defaults
            ctx._protected_args, ctx.args = args[:1], args[1:]
            return ctx.args
        # No subcommand: options may follow EXP (`failures latent_c_n4 --json`), extra words are errors.
        ctx.allow_interspersed_args, ctx.allow_extra_args = True, False
        return Command.parse_args(self, ctx, args)


app = typer.Typer(cls=_ArgumentOrSubcommand, invoke_without_command=True,
                  help="Postmortems: every failed job's cause, evidence and fix (card A's table).")

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output (one object per job).")]


@app.callback()
def report(
    ctx: typer.Context,
    experiment: Annotated[str | None, typer.Argument(help="Only this experiment.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only jobs ended since a date (2026-11-01) or a look-back (7d).")] = None,
    cause: Annotated[str | None, typer.Option("--cause", help="Only this cause (see runbook 'Failure causes').")] = None,
    as_json: JsonOpt = False,
    as_markdown: Annotated[bool, typer.Option("--markdown", help="A progress-card table with the fixes recorded.")] = False,
    limit: Annotated[int, typer.Option("--limit", **options.ROW_LIMIT, help="Show the most recent N table rows (0: all); --json is never cut.")] = 50,
    user: Annotated[str | None, typer.Option("--user", help="Only jobs this user submitted (a team's shared store holds everyone's).")] = None,
) -> None:
    """Classify any newly failed jobs, then print job, setting, cause, evidence, fix and the check that catches it now."""
    if ctx.invoked_subcommand is not None:
        return
    from ground.paths import db_path  # start-up: only this command needs it (3 more project modules)
    from idmctl.ops.failures.classify import get_cause  # start-up: pulls yaml
    from idmctl.ops.failures.report import card_rows, markdown  # start-up: pulls yaml
    from idmctl.ops.failures.rows import parse_since, read_table_rows  # start-up: pulls yaml

    table_only = not (as_json or as_markdown) and since is None
    newest = limit if table_only and limit else None  # --json, --markdown and --since are never cut
    since_at = parse_since(since) if since else None
    if cause is not None:
        get_cause(cause)  # an unknown cause is bad input, not an empty table
    # Nothing to classify (the usual case): read with sqlite3 and never import the ORM (~0.45 s).
    fast = read_table_rows(db_path(), experiment, cause, newest, since_at, user)
    if fast is not None:
        rows, total = fast
    else:
        from idmctl.ops.failures.postmortem import classify_and_read  # start-up: pulls sqlalchemy and pydantic

        rows, total = classify_and_read(experiment=experiment, since=since_at, cause=cause, newest=newest, user=user)
    if not table_only:
        total = len(rows)
    if as_json:
        emit_json_rows([row.as_json() for row in rows])
        return
    if as_markdown:
        sys.stdout.write(markdown(rows))  # not through rich: a markdown row must never wrap
        return
    if not rows:
        console.print("no failed jobs" + (f" for {experiment}" if experiment else ""))
        return
    grouped = card_rows(rows)
    shown = grouped[-limit:] if limit else grouped
    table = make_table("job", "experiment", "setting", "cause", "evidence", "fix", "caught now by")
    for card_row in shown:
        table.add_row(*card_row.cells())
    console.print(table)
    if len(rows) < total or len(shown) < len(grouped):
        console.print(f"showing the {len(shown)} most recent rows of {total:,} failed runs; "
                      "--limit 0 shows all, --cause/--since/EXP narrow it")


@app.command("fix")
def fix_cmd(
    jobs: Annotated[list[str], typer.Argument(help="Slurm job ids (or #store-id) the fix covers.")],
    note: Annotated[str, typer.Option("--note", help="What was changed.")],
    commit: Annotated[str | None, typer.Option("--commit", help="The commit that fixed it.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Record one fix for the failures of one or more jobs (6054 6108 6158 share one)."""
    from idmctl.ops.failures.postmortem import record_fix_in_store  # start-up: pulls sqlalchemy and pydantic

    result: dict[str, Any] = record_fix_in_store(jobs, note, commit)
    if as_json:
        emit_json(result)
        return
    commit_text = f" (commit {commit})" if commit else ""
    console.print(f"fix {result['fix_id']} recorded for {', '.join(result['jobs'])}: {note}{commit_text}", markup=False)


@app.command("explain")
def explain_cmd(
    log: Annotated[Path, typer.Argument(help="A job log file (only its last 64 kB are read).")],
    state: Annotated[str | None, typer.Option("--state", help="Slurm's state for the job (default FAILED).")] = None,
    exit_code: Annotated[str | None, typer.Option("--exit-code", help="sacct's ExitCode, code:signal (e.g. 1:0).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Classify a log file the way sync would: cause, evidence, headline, fix, and what sync would do."""
    from idmctl.ops.failures.explain import explain  # start-up: pulls yaml

    found = explain(log, state=state, exit_code=exit_code)
    if as_json:
        emit_json(found.as_json())
        return
    refines = f" (refines {found.refines})" if found.refines else ""
    lines = [f"cause:     {found.cause}{refines}", f"headline:  {found.headline}", "evidence:",
             *(f"  {line}" for line in found.evidence), f"fix:       {found.fix}",
             f"sync:      {found.sync_would}", f"caught by: {found.caught_by}"]
    sys.stdout.write("\n".join(lines) + "\n")  # not through rich: evidence lines are long and must not wrap


def jobs_import(
    since: Annotated[str, typer.Option("--since", help="Jobs submitted since a date (2026-11-01) or a look-back (7d).")],
    as_json: JsonOpt = False,
) -> None:
    """Pull jobs not submitted by idmctl from sacct into the store (imported), and classify their failures."""
    from idmctl.ops.failures.importer import import_windows  # start-up: pulls sqlalchemy and pydantic
    from idmctl.ops.failures.postmortem import parse_since  # start-up: pulls sqlalchemy and pydantic

    # sacct in time windows, a bounded number of lines and a deadline per call (a year of a busy cluster
    # is ~100,000 jobs); each window's jobs are stored as they come.
    result, failed_runs = import_windows(parse_since(since))
    if as_json:
        emit_json(result)
        return
    console.print(f"sacct listed {result['seen']} jobs since {since}: imported {len(result['imported'])} new, "
                  f"{failed_runs} of them failed (see `idmctl failures`)", markup=False)
