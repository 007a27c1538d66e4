"""The command line: typer only. ``idmctl.cli.app`` builds the app and registers the commands of
``idmctl.cli.commands``, each of which parses, calls library functions and prints.

``main`` is the console script (pyproject.toml). It imports the app when called, so a library module
that imports ``idmctl.cli.output`` does not pull typer and every command with it.
"""

from __future__ import annotations


def main() -> None:
    from idmctl.cli.app import main as run_app  # start-up: pulls typer

    run_app()
