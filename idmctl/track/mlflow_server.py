"""Start and stop ``mlflow server`` on the MLflow store in ``$IDMCTL_HOME``.

Trainers log straight to the SQLite store whether or not a server runs; the server only serves the
UI. One worker and no job runner: MLflow's default (4 workers + a 7-process job runner) takes
~2.6 GB and leaves temp dirs in /dev/shm. The server runs in its own session so that a Ctrl-C in
the terminal reaches idmctl, which then stops the server and everything it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ground.errors import CheckFailed, UserError
from ground.mlflow_store import store_init_lock
from ground.redact import redacted
from ground.paths import atomic_write_text, home, mlflow_artifacts_dir, mlflow_tracking_uri

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
READY_TIMEOUT_S = 90.0
"""A new database takes ~12 s of migrations before /health answers; a shared 2-core box is slower."""


@dataclass
class MlflowServer:
    process: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        """The address a person opens: this machine's name when bound to every interface."""
        shown = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{_bracket(shown)}:{self.port}"

    @property
    def local_url(self) -> str:
        """The address idmctl itself polls (always answerable from this machine)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host
        return f"http://{_bracket(host)}:{self.port}"

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM to mlflow (it stops its own workers); SIGKILL to its process group if it lingers."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout_s)
        # Workers re-parented after a crash of the mlflow CLI still carry its process group.
        _signal_group(self.process.pid, signal.SIGKILL)
        return self.process.returncode


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def allowed_hosts(host: str, port: int, extra: list[str] | None = None) -> list[str] | None:
    """``--allowed-hosts`` for a server bound beyond localhost; None keeps MLflow's local default.

    MLflow checks the ``Host:`` header (with port) and answers 403 to names it does not know, so
    the list names this machine as people will type it, with and without the port.
    """
    if host in LOCAL_HOSTS and not extra:
        return None
    names = ["localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn(), *(extra or [])]
    if host not in ("0.0.0.0", "::"):
        names.append(host)
    result: list[str] = []
    for name in names:
        for entry in (name, f"{name}:{port}"):
            if name and entry not in result:
                result.append(entry)
    return result


def backend_store_uri() -> str:
    uri = mlflow_tracking_uri()
    if uri.startswith(("http://", "https://")):
        raise UserError(f"points at a server already ({redacted(uri)})", field="MLFLOW_TRACKING_URI",
                        hint="open that server's URL, or unset MLFLOW_TRACKING_URI to serve $IDMCTL_HOME's store")
    return uri


AUTH_DIR_NAME = "mlflow-auth"
INSECURE_WARNING = ("WARNING: the MLflow UI on {host}:{port} has NO authentication (--insecure-no-auth): anyone "
                    "who can reach this port can create, change and delete runs, tags and experiments "
                    "(a remote runs/set-tag answered 200). Use --auth instead unless the network is yours alone.")


def is_loopback(host: str) -> bool:
    return host in LOCAL_HOSTS or host.startswith("127.")


def require_auth_policy(host: str, auth: bool, insecure_no_auth: bool) -> str | None:
    """Binding beyond loopback opens a write endpoint: it needs MLflow's basic-auth (``auth``) or the
    explicit opt-out, which returns the warning to print. UserError otherwise (nothing started)."""
    if auth and insecure_no_auth:
        raise UserError("--auth and --insecure-no-auth contradict each other", field="--insecure-no-auth",
                        hint="keep --auth")
    if is_loopback(host) or auth:
        return None
    if not insecure_no_auth:
        raise UserError(f"serving on {host} lets anyone who can reach the port write runs", field="--host",
                        hint="add --auth (MLflow's basic-auth login; the admin password is kept under "
                             "$IDMCTL_HOME/mlflow-auth), or --insecure-no-auth if the network is yours alone")
    return INSECURE_WARNING


def auth_env() -> dict[str, str]:
    """MLflow's ``--app-name basic-auth`` set up under ``$IDMCTL_HOME/mlflow-auth`` (mode 0700): its user
    store, a config naming it, and a generated admin password and Flask secret key (0600 files, reused)."""
    try:
        import flask_wtf  # noqa: F401  (basic-auth refuses to start without it)
    except ImportError as exc:
        raise UserError("MLflow's basic-auth needs Flask-WTF", field="--auth",
                        hint="pip install 'mlflow[auth]==3.17.2' (pyproject.toml pins it)") from exc
    directory = home() / AUTH_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    config = directory / "basic_auth.ini"
    atomic_write_text(config, "\n".join([
        "[mlflow]",
        "default_permission = READ",
        f"database_uri = sqlite:///{directory / 'users.sqlite'}",
        f"admin_username = {AUTH_ADMIN}",
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth",
        "grant_default_workspace_access = false",
    ]) + "\n")
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": AUTH_ADMIN,
            "MLFLOW_AUTH_ADMIN_PASSWORD": _kept_secret(directory / "admin-password"),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": _kept_secret(directory / "flask-secret-key")}


AUTH_ADMIN = "admin"


def admin_password_file() -> Path:
    return home() / AUTH_DIR_NAME / "admin-password"


def _kept_secret(path: Path) -> str:
    """A random secret made once, readable by this user only; the same one on every later start."""
    if path.exists():
        return path.read_text().strip()
    import secrets

    value = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value


def server_command(host: str, port: int, extra_hosts: list[str] | None = None, auth: bool = False) -> list[str]:
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    launcher = [str(mlflow_cli)] if mlflow_cli.exists() else [sys.executable, "-m", "mlflow"]
    command = [*launcher, "server", "--backend-store-uri", backend_store_uri(),
               "--default-artifact-root", mlflow_artifacts_dir().as_uri(),
               "--host", host, "--port", str(port), "--workers", "1"]
    hosts = allowed_hosts(host, port, extra_hosts)
    if hosts:
        command += ["--allowed-hosts", ",".join(hosts)]
    if auth:
        command += ["--app-name", "basic-auth"]
    return command


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}", field="--port",
                            hint="pick a free port with --port, or stop the server already there") from exc


def start_server(host: str = "127.0.0.1", port: int = 5000, extra_hosts: list[str] | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, auth: bool = False) -> MlflowServer:
    """Start the server and wait until ``/health`` answers; CheckFailed (with its log) if it dies."""
    command = server_command(host, port, extra_hosts, auth)
    check_port_free(host, port)
    mlflow_artifacts_dir().mkdir(parents=True, exist_ok=True)
    with store_init_lock():
        pass  # a new store is seeded from the empty schema, so the server does not run MLflow's migrations
    log_path = home() / "mlflow-server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(auth_env() if auth else {})}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    server = MlflowServer(process=process, host=host, port=port, log_path=log_path)
    try:
        wait_ready(server, ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def wait_ready(server: MlflowServer, timeout_s: float) -> float:
    """Seconds until ``GET /health`` answered 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not server.running():
            raise CheckFailed(f"mlflow server exited with code {server.process.returncode} before it was ready; "
                              f"last lines of {server.log_path}:\n{_tail(server.log_path)}")
        try:
            with urllib.request.urlopen(f"{server.local_url}/health", timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise CheckFailed(f"mlflow server did not answer {server.local_url}/health within {timeout_s:.0f} s; "
                      f"see {server.log_path}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
