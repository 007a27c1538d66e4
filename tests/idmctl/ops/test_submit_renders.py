"""Every submission renders its job script once: submit, resume and resubmit go through one path (render →
verdict on that very script → file → scheduler → row), as submitit's ``_submit_command`` does.

The count is measured on real local submissions (the local executor runs the script; its verdict is
``bash -n``): the spy calls the real renderer and only counts the calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from idmctl.core.job_options import JobRequest
from idmctl.ops import submit as submitting
from idmctl.ops.executors.local import LocalExecutor
from idmctl.job import render


def _count_renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the one renderer the submit path holds; each call still renders."""
    calls: list[int] = []
    real: Callable[..., str] = render.render_script

    def counted(*args: object, **kwargs: object) -> str:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(submitting, "render_script", counted)
    return calls


def test_submit_resume_and_resubmit_each_render_the_script_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDMCTL_TEST_BEHAVIOR", "steps:1:0.01")
    request = JobRequest(entry="tests.jobs_entry")
    calls = _count_renders(monkeypatch)

    first = submitting.submit("quickstart", request, None, force_reason="render count")
    assert len(calls) == 1, f"submit rendered the script {len(calls)} times"
    script_path = Path(first.job.script_path)
    assert script_path.read_text() == first.script  # what was rendered is what was sent
    LocalExecutor().wait(first.job.scheduler_id, timeout_s=60)

    calls.clear()
    again = submitting.resubmit(int(first.job.id), {}, "render count", spends_retry=False)
    assert len(calls) == 1, f"resubmit rendered the script {len(calls)} times"
    assert (again.chain_id, again.attempt) == (first.job.chain_id, 2)
    LocalExecutor().wait(again.scheduler_id, timeout_s=60)
    from idmctl.ops.sync import sync  # here: the chain must be seen ended before it can be resumed

    sync()

    calls.clear()
    resumed = submitting.resume("quickstart", int(first.job.chain_id), JobRequest(), None, force_reason="render count")
    assert len(calls) == 1, f"resume rendered the script {len(calls)} times"
    assert resumed.job.attempt == 3
    assert Path(resumed.job.script_path).read_text() == resumed.script
    LocalExecutor().wait(resumed.job.scheduler_id, timeout_s=60)

