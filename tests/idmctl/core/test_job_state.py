"""Slurm's job states, one enum: what sync, retries, the ledger and the classifier read from a stored state."""

from __future__ import annotations

import pytest

from idmctl.core.job_state import IDMCTL_OWN, UNFINISHED, JobState, is_failed, is_terminal


def test_each_state_is_spelled_as_sacct_prints_it() -> None:
    assert all(state.value == state.name and state.value.isupper() for state in JobState)
    assert f"{JobState.OUT_OF_MEMORY}" == "OUT_OF_MEMORY" and JobState.FAILED == "FAILED"  # stored and shown as text


@pytest.mark.parametrize(("stored", "state"), [
    ("CANCELLED by 0", JobState.CANCELLED), ("NODE_FAIL", JobState.NODE_FAIL), ("REQUEUED", JobState.REQUEUED),
    ("SUBMIT_FAILED", None), ("UNCONFIRMED", None), ("", None), (None, None),
])
def test_a_stored_state_is_read_by_its_first_word(stored: str | None, state: JobState | None) -> None:
    assert JobState.of(stored) is state


def test_terminal_and_failed() -> None:
    terminal = {state for state in JobState if state.is_terminal}
    assert terminal == set(JobState) - UNFINISHED - {JobState.SUBMITTING, JobState.UNCONFIRMED}
    assert JobState.SUBMIT_FAILED.is_terminal and JobState.SUBMIT_FAILED.is_failed  # refused: it never ran
    assert {state for state in JobState if state.is_failed} == terminal - {JobState.COMPLETED}
    assert is_terminal("CANCELLED by 0") and is_terminal("COMPLETED") and not is_terminal("RUNNING")
    assert not is_terminal("UNCONFIRMED")  # sacct has yet to say how it ended: every sync asks again
    assert not is_terminal("SUBMIT_FAILED")  # idmctl's own word, never a scheduler's


@pytest.mark.parametrize("word", ["SUBMITTING", "SUBMIT_FAILED", "UNCONFIRMED"])
def test_idmctls_own_words_are_members_that_no_scheduler_prints(word: str) -> None:
    assert JobState.of(word) is None and JobState.stored(word) is JobState(word) and JobState(word) in IDMCTL_OWN
    assert JobState.stored("CANCELLED by 0") is JobState.CANCELLED and JobState.stored("nonsense") is None


def test_what_gets_classified() -> None:
    assert is_failed("OUT_OF_MEMORY") and is_failed("PREEMPTED") and is_failed("CANCELLED by 0")
    assert is_failed("SUBMIT_FAILED")  # the job never ran: a failure all the same
    assert not is_failed("COMPLETED") and not is_failed("RUNNING") and not is_failed("REQUEUED")
    assert not is_failed(None) and not is_failed("")
