"""`idmctl ui` beyond loopback: `--host 0.0.0.0` served an open write endpoint (a remote
runs/set-tag with a spoofed Host header returned 200) and printed no warning. Now it needs MLflow's own
basic-auth (`--auth`) or the loudly warned `--insecure-no-auth`. Real `mlflow server` processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from ground.contract import ENV_HOME

import pytest

from ground.paths import REPO_ROOT
from net_support import free_port


def _idmctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "idmctl", *args]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, ENV_HOME: str(home), "PYTHONPATH": str(REPO_ROOT)}


def test_binding_beyond_loopback_without_auth_is_refused_and_starts_nothing(idmctl_home: Path) -> None:
    port = free_port()
    result = subprocess.run(_idmctl("ui", "--host", "0.0.0.0", "--port", str(port)), capture_output=True, text=True,
                            env=_env(idmctl_home), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: --host: serving on 0.0.0.0 lets anyone who can reach the port write runs (add --auth (MLflow's "
        "basic-auth login; the admin password is kept under $IDMCTL_HOME/mlflow-auth), or --insecure-no-auth if "
        "the network is yours alone)"]
    assert not (idmctl_home / "mlflow-server.log").exists()


def _post(url: str, body: dict, auth: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
def test_auth_server_refuses_anonymous_writes_and_accepts_the_admin(idmctl_home: Path) -> None:
    from idmctl.track.mlflow_server import admin_password_file, start_server

    server = start_server("127.0.0.1", free_port(), auth=True)
    try:
        create = f"{server.local_url}/api/2.0/mlflow/experiments/create"
        assert _post(create, {"name": "anonymous"}) == 401
        password = admin_password_file().read_text().strip()
        assert _post(create, {"name": "by-admin"}, auth=("admin", password)) == 200
        assert _post(create, {"name": "wrong"}, auth=("admin", password + "x")) == 401
    finally:
        server.stop()
    assert oct(admin_password_file().stat().st_mode & 0o777) == "0o600"
    assert oct(admin_password_file().parent.stat().st_mode & 0o777) == "0o700"


@pytest.mark.slow
def test_insecure_opt_out_warns_loudly_before_serving(idmctl_home: Path) -> None:
    port = free_port()
    process = subprocess.Popen(_idmctl("ui", "--host", "0.0.0.0", "--port", str(port), "--insecure-no-auth"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(idmctl_home))
    try:
        assert process.stderr is not None and process.stdout is not None
        warning = process.stderr.readline()
        assert warning.startswith(f"WARNING: the MLflow UI on 0.0.0.0:{port} has NO authentication"), warning
        served = process.stdout.readline()
        assert served.startswith("MLflow UI: "), served + process.stderr.read()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
