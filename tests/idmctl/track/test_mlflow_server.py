"""``idmctl ui``'s server command line and its refusals (the served UI itself: test_ui_browser.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from idmctl.track.mlflow_server import allowed_hosts, server_command


def test_local_server_is_one_worker_on_the_home_store(idmctl_home: Path):
    command = server_command("127.0.0.1", 5123)
    assert command[1:] == ["server", "--backend-store-uri", f"sqlite:///{idmctl_home / 'mlflow.sqlite'}",
                           "--default-artifact-root", (idmctl_home / "mlartifacts").as_uri(),
                           "--host", "127.0.0.1", "--port", "5123", "--workers", "1"]
    assert Path(command[0]).name == "mlflow"


def test_binding_elsewhere_names_this_machine_in_allowed_hosts():
    command = server_command("0.0.0.0", 5123, ["idm-login.example.org"])
    hosts = command[command.index("--allowed-hosts") + 1].split(",")
    for name in ("localhost", "127.0.0.1", socket.gethostname(), "idm-login.example.org"):
        assert name in hosts and f"{name}:5123" in hosts
    assert "0.0.0.0" not in hosts
    assert allowed_hosts("127.0.0.1", 5123) is None


def test_busy_port_is_bad_input_and_starts_nothing(cli, idmctl_home: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("ui", "--port", str(port))
    assert result.exit_code == 2
    assert result.output == (f"error: --port: cannot listen on 127.0.0.1:{port}: Address already in use "
                             "(pick a free port with --port, or stop the server already there)\n")
    assert not (idmctl_home / "mlflow-server.log").exists()


def test_remote_tracking_uri_is_refused(cli, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example.org:5000")
    result = cli("ui")
    assert result.exit_code == 2
    assert result.output.startswith("error: MLFLOW_TRACKING_URI: points at a server already (http://tracking.example.org:5000)")
