"""The embedded default: run the same rendered batch script as a local subprocess.

A small detached runner (``python -m idmctl.ops.executors.local``) owns the script's process group and
writes the job's state file atomically (``$IDMCTL_HOME/local-jobs/<id>.json``) as it starts and ends,
in Slurm's words: COMPLETED (exit 0), PREEMPTED (exit 75: checkpointed and asked to be requeued),
CANCELLED (``cancel``), FAILED otherwise, with ExitCode as ``code:signal``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ground import contract
from ground.errors import CheckFailed, UserError
from idmctl.core.executor import JobStatus, RunRecord, SchedulerRefusal, one_line
from idmctl.core.job_state import JobState, is_terminal
from ground.paths import atomic_write_text, home
from ground.processes import alive



def jobs_dir() -> Path:
    return home() / "local-jobs"


def _state_path(scheduler_id: str) -> Path:
    return jobs_dir() / f"{scheduler_id}.json"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _write(path: Path, record: dict[str, object]) -> None:
    atomic_write_text(path, json.dumps(record))


class LocalExecutor:
    name = "local"

    def submit(self, script_path: Path, log_path: str) -> str:
        scheduler_id = f"local-{secrets.token_hex(4)}"
        log = log_path.replace("%j", scheduler_id)
        state_path = _state_path(scheduler_id)
        _write(state_path, {"state": JobState.PENDING.value, "submitted_at": _now(), "log_path": log})
        subprocess.Popen(
            [sys.executable, "-m", "idmctl.ops.executors.local", str(script_path), log, str(state_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, contract.ENV_LOCAL_JOB_ID: scheduler_id},
        )
        return scheduler_id

    def test_only(self, script_path: Path) -> str:
        result = subprocess.run(["bash", "-n", str(script_path)], capture_output=True, text=True)
        if result.returncode != 0:
            raise SchedulerRefusal("bash -n", one_line(result.stderr) or f"exit {result.returncode}")
        return "the script parses (no scheduler to ask)"

    def status(self, scheduler_ids: list[str], submitted: dict[str, datetime] | None = None) -> dict[str, JobStatus]:
        # Local ids are never reused (a state file per id): ``submitted`` has nothing to tell apart.
        statuses: dict[str, JobStatus] = {}
        for scheduler_id in scheduler_ids:
            path = _state_path(scheduler_id)
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            state = record["state"]
            pid = record.get("runner_pid")
            if not is_terminal(state) and pid and not alive(int(pid)):
                # The runner died without writing an end (killed -9, host reboot).
                state, record["exit_code"], record["reason"] = JobState.FAILED.value, "0:9", "RunnerLost"
            parse = lambda key: datetime.fromisoformat(record[key]) if record.get(key) else None  # noqa: E731
            status = JobStatus(
                scheduler_id=scheduler_id, state=state, exit_code=record.get("exit_code"),
                reason=record.get("reason"), submitted_at=parse("submitted_at"), started_at=parse("started_at"),
                ended_at=parse("ended_at"), node_list=record.get("node"),
            )
            status.runs = [RunRecord(state=state, exit_code=status.exit_code, reason=status.reason,
                                     started_at=status.started_at, ended_at=status.ended_at, node_list=status.node_list)]
            statuses[scheduler_id] = status
        return statuses

    def cancel(self, scheduler_id: str) -> None:
        path = _state_path(scheduler_id)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"no local job {scheduler_id!r}", field="JOB", hint="see `idmctl jobs`") from exc
        deadline = time.monotonic() + 10
        while not record.get("runner_pid") and not is_terminal(record["state"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # the runner is starting: it publishes its pid in its first write
            record = json.loads(path.read_text())
        pid = record.get("runner_pid")
        if pid and not is_terminal(record["state"]):
            os.kill(int(pid), signal.SIGTERM)

    def wait(self, scheduler_id: str, timeout_s: float = 3600, poll_s: float = 0.2) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status([scheduler_id]).get(scheduler_id)
            if status is not None and is_terminal(status.state):
                return status
            if time.monotonic() > deadline:
                raise CheckFailed(f"local job {scheduler_id} still {status.state if status else 'unknown'} after {timeout_s:.0f} s")
            time.sleep(poll_s)


def _run_job(script: str, log: str, state_path: Path) -> int:
    cancelled = {"flag": False}
    child: dict[str, subprocess.Popen[bytes] | None] = {"process": None}

    def on_term(_signum: int, _frame: object) -> None:
        cancelled["flag"] = True
        if child["process"] is not None:
            os.killpg(child["process"].pid, signal.SIGTERM)

    # Installed before the pid is published, so a cancel can never hit the default handler.
    signal.signal(signal.SIGTERM, on_term)
    record = json.loads(state_path.read_text())
    record.update(state=JobState.RUNNING.value, started_at=_now(), runner_pid=os.getpid(), node=os.uname().nodename)
    _write(state_path, record)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    returncode = -signal.SIGTERM
    if not cancelled["flag"]:
        with open(log, "ab") as out:
            child["process"] = subprocess.Popen(["bash", script], stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            if cancelled["flag"]:  # cancelled between the check and the spawn
                os.killpg(child["process"].pid, signal.SIGTERM)
            returncode = child["process"].wait()
    if cancelled["flag"]:
        state, reason = JobState.CANCELLED.value, "Cancelled"
    elif returncode == 0:
        state, reason = JobState.COMPLETED.value, None
    elif returncode == contract.EXIT_REQUEUE:
        state, reason = JobState.PREEMPTED.value, "CheckpointedForRequeue"
    else:
        state, reason = JobState.FAILED.value, "NonZeroExitCode"
    exit_code = f"0:{-returncode}" if returncode < 0 else f"{returncode}:0"
    record.update(state=state, reason=reason, exit_code=exit_code, ended_at=_now())
    _write(state_path, record)
    return 0


if __name__ == "__main__":
    sys.exit(_run_job(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
