"""The gate: results keyed by (spec hash, code version, profile hash); ``require_pass`` refuses
anything but a passing full preflight of exactly this key, and says why in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ground.errors import CheckFailed
from idmctl.record import preflights as record
from idmctl.core.checks import CheckResult, Status
from idmctl.core.profile import load_profile
from ground.spec import load_spec

REPO = Path(__file__).resolve().parents[3]


def _results(*failing: str) -> list[CheckResult]:
    return [CheckResult(name, Status.FAIL if name in failing else Status.PASS, f"{name} summary")
            for name in ("spec", "introspection", "loader", "shm", "io", "qos", "disk", "cache", "smoke")]


def _write_spec(directory: Path, steps: int) -> Path:
    text = (REPO / "experiments" / "quickstart.yaml").read_text().replace("steps: 200", f"steps: {steps}")
    path = directory / "gate_exp.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def pinned_version(monkeypatch):
    """Other commits land in the shared tree while tests run; the gate logic is tested at a fixed version."""
    monkeypatch.setattr(record, "code_version", lambda: "b8f060c+dirty.3fa2c1")


def test_require_pass_reasons_in_order(tmp_path, pinned_version):
    profile, profile_hash = load_profile("local")
    path = _write_spec(tmp_path, 200)
    resolved = load_spec(str(path))
    version = record.code_version()

    with pytest.raises(CheckFailed, match="no preflight for gate_exp"):
        record.require_pass(resolved, profile, profile_hash)

    record.record_run(resolved, profile.name, profile_hash, version, _results(), with_smoke=False, seconds=0.1)
    with pytest.raises(CheckFailed, match=r"static-only \(--no-smoke cannot unlock submit\)"):
        record.require_pass(resolved, profile, profile_hash)

    record.record_run(resolved, profile.name, profile_hash, version, _results("shm"), with_smoke=True, seconds=1.0)
    with pytest.raises(CheckFailed, match=r"failed \(shm\)"):
        record.require_pass(resolved, profile, profile_hash)

    passed = record.record_run(resolved, profile.name, profile_hash, version, _results(), with_smoke=True, seconds=2.0)
    assert record.require_pass(resolved, profile, profile_hash).id == passed.id
    # A later static-only run that still passes keeps the full pass valid ...
    record.record_run(resolved, profile.name, profile_hash, version, _results(), with_smoke=False, seconds=0.1)
    assert record.require_pass(resolved, profile, profile_hash).id == passed.id
    # ... one that finds a FAIL revokes it.
    record.record_run(resolved, profile.name, profile_hash, version, _results("disk"), with_smoke=False, seconds=0.1)
    with pytest.raises(CheckFailed, match=r"failed \(disk\)"):
        record.require_pass(resolved, profile, profile_hash)

    card, card_hash = load_profile("card")
    with pytest.raises(CheckFailed, match="no preflight of gate_exp for cluster profile card"):
        record.require_pass(resolved, card, card_hash)


def test_editing_the_spec_after_a_pass_is_refused(tmp_path, pinned_version):
    profile, profile_hash = load_profile("local")
    path = _write_spec(tmp_path, 200)
    before = load_spec(str(path))
    record.record_run(before, profile.name, profile_hash, record.code_version(), _results(), with_smoke=True, seconds=1.0)
    assert record.require_pass(before, profile, profile_hash).spec_hash == before.hash

    _write_spec(tmp_path, 400)
    after = load_spec(str(path))
    with pytest.raises(CheckFailed) as refused:
        record.require_pass(after, profile, profile_hash)
    assert str(refused.value).startswith(f"preflight required: spec changed since preflight #")
    assert f"(hash {before.hash[:12]} → {after.hash[:12]})" in str(refused.value)


def test_checks_are_stored_with_their_numbers(tmp_path):
    profile, profile_hash = load_profile("local")
    resolved = load_spec(str(_write_spec(tmp_path, 200)))
    results = [CheckResult("shm", Status.FAIL, "overflow", {"need_bytes": 5}, "num_workers 0")]
    run = record.record_run(resolved, profile.name, profile_hash, "abc", results, with_smoke=False, seconds=0.5)
    stored = record.run_checks(run.id)
    assert [(c.name, c.status, c.summary, c.numbers_json, c.fix) for c in stored] == [
        ("shm", "FAIL", "overflow", '{"need_bytes": 5}', "num_workers 0")]
    assert record.latest_run(resolved.hash, "abc", profile_hash).passed is False
