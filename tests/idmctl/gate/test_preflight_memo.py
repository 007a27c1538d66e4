"""Repeat preflights (and every submit) skip ``import torch``: introspection and the cache inspection
are remembered per code version (idmctl/record/memo.py), and invalidated when their inputs change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ground.contract import ENV_HOME

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, runpy, sys
sys.argv = ["idmctl", "preflight", sys.argv[1], "--no-smoke", "--json", *sys.argv[2:]]
try:
    runpy.run_module("idmctl", run_name="__main__")
except SystemExit:
    pass
print(json.dumps({"torch_imported": "torch" in sys.modules}))
"""


def _preflight(spec: Path, home: Path, *flags: str) -> tuple[dict, bool]:
    env = {**os.environ, ENV_HOME: str(home), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(spec), *flags], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    report, probe = done.stdout.strip().rsplit("\n", 1)
    return json.loads(report), json.loads(probe)["torch_imported"]


def _checks(report: dict) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["status"], c["summary"]) for c in report["checks"]}


def test_second_preflight_reuses_introspection_and_cache_inspection_without_torch(tiny_cache, idmctl_home: Path) -> None:
    first, torch_first = _preflight(tiny_cache.spec_path, idmctl_home)
    assert torch_first, "the first preflight imports the trainer's registries"
    second, torch_second = _preflight(tiny_cache.spec_path, idmctl_home)
    assert not torch_second, "nothing changed: introspection and the cache inspection come from the memo"
    assert _checks(second) == _checks(first) and _checks(first)["cache"][0] == "PASS"
    # A submit flag changes resources only, which no constructor reads: still no torch.
    flagged, torch_flagged = _preflight(tiny_cache.spec_path, idmctl_home, "--mem", "1GB", "-c", "2")
    assert not torch_flagged and _checks(flagged)["introspection"] == _checks(first)["introspection"]


def test_a_changed_cache_file_is_inspected_again(tiny_cache, idmctl_home: Path, tmp_path: Path) -> None:
    import shutil

    import yaml

    data = tmp_path / "data"
    shutil.copytree(Path(str(tiny_cache.data["cache_root"])).parent, data)
    spec = yaml.safe_load(tiny_cache.spec_path.read_text())
    for key in ("episodes", "cache_root"):
        spec["data"][key] = str(data / Path(spec["data"][key]).relative_to(Path(str(tiny_cache.data["cache_root"])).parent))
    path = tmp_path / "copy.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert _checks(_preflight(path, idmctl_home)[0])["cache"][0] == "PASS"
    victim = next(p for p in sorted(Path(spec["data"]["cache_root"]).rglob("*.safetensors")))
    victim.write_bytes(victim.read_bytes()[:64])  # truncated: its header no longer parses
    report, torch_imported = _preflight(path, idmctl_home)
    assert torch_imported and _checks(report)["cache"][0] == "FAIL", _checks(report)["cache"]


def test_constructor_kwargs_never_read_resources(tiny_cache) -> None:
    """Why the introspection memo leaves ``resources`` out of its key."""
    from cache.registry import dataset_kwargs
    from ground.spec import load_spec
    from trainers.registry import model_kwargs

    spec = load_spec(str(tiny_cache.spec_path)).spec
    other = spec.model_copy(update={"resources": spec.resources.model_copy(update={
        "gpus_per_node": 2, "nodes": 2, "cpus": 7, "mem": "9GB", "qos": "sub", "time_limit": "9:00:00"})})
    assert dataset_kwargs(spec, "train") == dataset_kwargs(other, "train")
    assert repr(model_kwargs(spec)) == repr(model_kwargs(other))
