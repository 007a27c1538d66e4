"""Every cluster-profile field has a domain, judged at load in one line naming the field: read rates above
0 B/s (plans divide by them), a relative ``code_store`` resolved against the profile's own folder (never
the working directory of whichever command reads it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ground.errors import UserError
from ground.paths import clusters_dir
from idmctl.core.profile import load_profile
from idmctl.job.code import store_for


def _profile(folder: Path, **changes: object) -> Path:
    data = yaml.safe_load((clusters_dir() / "local.yaml").read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for name in parents:
            target = target.setdefault(name, {})
        target[last] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("field", ["nas_read", "nvme_read", "page_cache_read", "direct_read"])
@pytest.mark.parametrize("rate", ["0GB/s", "0B/s", "-1GB/s"])
def test_a_read_rate_of_zero_or_less_is_refused_at_load_naming_the_field(tmp_path: Path, field: str, rate: str) -> None:
    path = _profile(tmp_path, **{f"storage__{field}": rate})
    with pytest.raises(UserError) as caught:
        load_profile(str(path))
    line = caught.value.line()
    assert f"storage.{field}" in line and str(path) in line and "\n" not in line, line


def test_the_cli_says_a_zero_rate_in_one_line(cli, tmp_path: Path) -> None:
    path = _profile(tmp_path, storage__nas_read="0GB/s")
    result = cli("controller", "show", "--cluster", str(path))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "storage.nas_read" in lines[0], result.output


def test_a_relative_code_store_is_the_profiles_neighbour_whatever_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _profile(tmp_path / "profiles", code_store="../stores/code")
    seen = set()
    for cwd in (tmp_path, tmp_path / "profiles", Path("/")):
        monkeypatch.chdir(cwd)
        seen.add(os.path.normpath(store_for(load_profile(str(path))[0])))
    assert seen == {str(tmp_path / "stores" / "code")}
    # An absolute one, or one under ~ or $IDMCTL_HOME, is kept as written.
    assert load_profile(str(_profile(tmp_path / "abs", code_store="/srv/code")))[0].code_store == "/srv/code"
    assert load_profile(str(_profile(tmp_path / "home", code_store="~/code")))[0].code_store == "~/code"
