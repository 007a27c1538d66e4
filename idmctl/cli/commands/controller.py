"""``idmctl controller show|install|remove``: the scheduled sync inside Slurm (a scrontab entry)."""

from __future__ import annotations

from typing import Annotated

import typer

from idmctl.cli.output import console

app = typer.Typer(help="The scheduled sync inside Slurm (scrontab): running jobs looked at every few minutes.",
                  no_args_is_help=True)
Cluster = Annotated[str | None, typer.Option("--cluster", help="Cluster profile (default $IDMCTL_CLUSTER or local).")]


def _block(cluster: str | None) -> str:
    from idmctl.core.profile import load_profile, profile_path  # pydantic: only when the command runs
    from idmctl.ops.scron import render_block  # as above

    return render_block(load_profile(cluster)[0], str(profile_path(cluster)))


@app.command("show")
def show(cluster: Cluster = None) -> None:
    """Print the scrontab block `install` would put in place (nothing is changed)."""
    console.print(_block(cluster), markup=False, end="")


@app.command("install")
def install(cluster: Cluster = None) -> None:
    """Add (or replace) idmctl's block in your scrontab: `idmctl sync` on the profile's controller.schedule."""
    from idmctl.ops.scron import install as put  # only when the command runs

    block = _block(cluster)
    put(block)
    console.print(f"installed in your scrontab:\n{block}", markup=False, end="")


@app.command("remove")
def remove() -> None:
    """Take idmctl's block out of your scrontab (the rest is kept)."""
    from idmctl.ops.scron import remove as take_out  # only when the command runs

    take_out()
    console.print("removed idmctl's block from your scrontab", markup=False)
