"""The forked introspection (idmctl/gate/background.py): the parent gets exactly the child's
CheckResult, and whenever the child gives none (it died, it hung past its deadline) the check runs in
the parent instead — a cold preflight is never worse off for having forked."""

from __future__ import annotations

import os
import time

from idmctl.gate import background
from idmctl.core.checks import CheckResult, Status

NOT_IMPORTED = "idmctl_test_module_that_is_never_imported"


def _result(where: str) -> CheckResult:
    return CheckResult("introspection", Status.FAIL, f"ran in {where}", {"pid": os.getpid(), "kwargs": ["a", "b"]},
                       "a fix")


def test_the_child_s_result_comes_back_whole() -> None:
    parent = os.getpid()
    forked = background.start(lambda: _result("child"), heavy_module=NOT_IMPORTED)
    assert forked is not None
    got = background.collect(forked, lambda: _result("parent"))
    assert got.summary == "ran in child" and got.numbers["pid"] != parent
    assert got == CheckResult("introspection", Status.FAIL, "ran in child", {"pid": got.numbers["pid"],
                                                                               "kwargs": ["a", "b"]}, "a fix")


def test_no_fork_when_the_heavy_module_is_already_imported() -> None:
    assert background.start(lambda: _result("child"), heavy_module="os") is None
    assert background.collect(None, lambda: _result("parent")).summary == "ran in parent"


def test_a_child_that_dies_is_replaced_by_running_the_check_here() -> None:
    forked = background.start(lambda: os._exit(3), heavy_module=NOT_IMPORTED)  # type: ignore[arg-type, return-value]
    assert background.collect(forked, lambda: _result("parent")).summary == "ran in parent"


def test_a_child_that_returns_something_else_is_not_trusted() -> None:
    forked = background.start(lambda: "not a CheckResult", heavy_module=NOT_IMPORTED)  # type: ignore[arg-type, return-value]
    assert background.collect(forked, lambda: _result("parent")).summary == "ran in parent"


def test_a_hung_child_is_killed_at_the_deadline_and_the_check_runs_here() -> None:
    forked = background.start(lambda: (time.sleep(600), _result("child"))[1], heavy_module=NOT_IMPORTED)
    assert forked is not None
    assert background.collect(forked, lambda: _result("parent"), deadline_s=0.5).summary == "ran in parent"
    assert forked.reaped
    try:
        os.kill(forked.pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"child {forked.pid} still exists after collect")


def test_cancel_kills_and_reaps_a_child_nobody_collects() -> None:
    forked = background.start(lambda: (time.sleep(600), _result("child"))[1], heavy_module=NOT_IMPORTED)
    assert forked is not None
    background.cancel(forked)
    background.cancel(forked)  # idempotent: the error path calls it after a collect too
    assert background.collect(forked, lambda: _result("parent")).summary == "ran in parent"


def test_a_cold_cli_preflight_reports_the_same_introspection_fail_as_the_check_in_process(tmp_path) -> None:
    """Whole process, fresh home (no memo, torch not imported: the fork path), on a spec whose dataset
    class rejects a kwarg: the row equals ``introspection.check`` run here, message and fix included."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from ground.contract import ENV_HOME
    from ground.spec import load_spec
    from idmctl.gate import introspection
    from idmctl.core.checks import PreflightContext
    from idmctl.core.profile import load_profile

    repo = Path(__file__).resolve().parents[3]
    spec = repo / "experiments" / "mistakes" / "wrong_class_kwarg.yaml"
    env = {**os.environ, ENV_HOME: str(tmp_path / "home"), "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-m", "idmctl", "preflight", str(spec), "--cluster", "card", "--no-smoke",
                           "--json"], capture_output=True, text=True, env=env, cwd=repo, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    row = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "introspection")
    here = introspection.check(PreflightContext(load_spec(str(spec)), load_profile("card")[0]))
    assert row["status"] == "FAIL" and "unexpected keyword argument 'selected_layer_indices'" in row["summary"]
    assert row == json.loads(json.dumps(here.as_dict()))
