"""``idmctl ui``: the MLflow UI on this user's store, in the foreground until Ctrl-C."""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Annotated

import typer

from ground.errors import CheckFailed
from idmctl.cli.commands import options
from idmctl.cli.output import console
from ground.redact import redacted


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def ui(
    host: Annotated[str, typer.Option("--host", help="Interface to bind; 0.0.0.0 serves other machines.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", **options.PORT, help="Port to listen on.")] = 5000,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="Extra host name people use to reach it (repeatable).")] = None,
    auth: Annotated[bool, typer.Option(
        "--auth", help="Require MLflow's basic-auth login (needed to bind beyond 127.0.0.1).")] = False,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="Bind beyond 127.0.0.1 WITHOUT a login: anyone who can reach the port can write.")] = False,
) -> None:
    """Serve the MLflow UI for $IDMCTL_HOME's runs; prints the URL; Ctrl-C stops it and its workers."""
    from idmctl.track.mlflow_server import admin_password_file, backend_store_uri, require_auth_policy, start_server  # start-up: only this command needs it (5 more project modules)

    warning = require_auth_policy(host, auth, insecure_no_auth)
    if warning:
        typer.echo(warning.format(host=host, port=port), err=True)
    started = time.monotonic()
    # `kill <pid>` stops the server as cleanly as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    server = None
    try:
        server = start_server(host, port, allowed_host, auth=auth)
        console.print(f"MLflow UI: {server.url}  (ready in {time.monotonic() - started:.1f} s; Ctrl-C stops it)",
                      markup=False)
        console.print(f"store: {redacted(backend_store_uri())}  log: {server.log_path}", markup=False)
        from idmctl.track.runs_view import goal_view_lines, runs_chart_line  # start-up: only this command needs it (6 more project modules)

        console.print(runs_chart_line("runs, EEF mm charts first", server.url), markup=False, soft_wrap=True)
        for line in goal_view_lines(server.url):
            console.print(line, markup=False, soft_wrap=True)
        if auth:
            console.print(f"login: admin, password in {admin_password_file()} (add users through MLflow's "
                          "/signup page or its users API)", markup=False)
        code = server.process.wait()
        raise CheckFailed(f"mlflow server exited on its own with code {code}; see {server.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()
            console.print("MLflow UI stopped", markup=False)
        signal.signal(signal.SIGTERM, previous)
