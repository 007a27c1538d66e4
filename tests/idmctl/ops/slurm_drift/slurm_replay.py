"""Serving recorded Slurm output to idmctl's readers.

- :func:`recording` reads a fixture and its SOURCES.yaml entry.
- :func:`project` serves the columns idmctl asks for, by name, from a recording made with another
  project's ``--format`` (a column the recording lacks is served empty: "not known" to idmctl).
- :func:`shim` puts fake ``sacct``/``squeue``/``scontrol``/``sbatch`` first on PATH that answer from a
  queue of recorded answers and log each call (its argv and SLURM_TIME_FORMAT). They are fakes only in
  that they replay: every line they print was printed by a real Slurm (the fixture says which).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).parent / "fixtures"
ALIASES = {"ncpus": "alloccpus", "jobid": "jobid"}


def sources() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((FIXTURES / "SOURCES.yaml").read_text())


def recording(name: str) -> tuple[dict[str, Any], str]:
    """The fixture's metadata and its text, verbatim."""
    return sources()[name], (FIXTURES / name).read_text()


def project(name: str, wanted: tuple[str, ...], delimiter: str) -> str:
    """The recording's rows with idmctl's columns (``wanted``) in idmctl's order and delimiter."""
    meta, text = recording(name)
    fields = [ALIASES.get(f.lower(), f.lower()) for f in meta["fields"]]
    lines = text.split("\n")
    if meta.get("header"):
        lines = lines[1:]
    out = []
    for line in lines:
        if not line:
            continue
        row = dict(zip(fields, line.split(meta["delimiter"])))
        out.append(delimiter.join(row.get(f.lower(), "") for f in wanted))
    return "".join(f"{line}\n" for line in out)


_TOOL = """#!{python}
import json, os, sys
from pathlib import Path
base = Path({base!r})
name = Path(sys.argv[0]).name
with open(base / "calls.jsonl", "a") as log:
    log.write(json.dumps({{"tool": name, "argv": sys.argv[1:],
                          "SLURM_TIME_FORMAT": os.environ.get("SLURM_TIME_FORMAT")}}) + "\\n")
queue_path = base / f"{{name}}.json"
queue = json.loads(queue_path.read_text()) if queue_path.exists() else []
answer = queue.pop(0) if len(queue) > 1 else (queue[0] if queue else {{"stdout": "", "rc": 0}})
queue_path.write_text(json.dumps(queue))
sys.stdout.write(answer.get("stdout", ""))
sys.stderr.write(answer.get("stderr", ""))
sys.exit(answer.get("rc", 0))
"""


class Shim:
    """Fake Slurm tools in ``base``: :meth:`answer` queues what a tool prints next (the last answer repeats)."""

    def __init__(self, base: Path):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        for tool in ("sacct", "squeue", "scontrol", "sbatch", "sacctmgr"):
            path = base / tool
            path.write_text(_TOOL.format(python=sys.executable, base=str(base)))
            path.chmod(0o755)
        self.answer("scontrol", "Slurmctld(primary) at vm is UP\n")  # what `scontrol ping` printed on 22.05.8

    def answer(self, tool: str, *stdouts: str, rc: int = 0, stderr: str = "") -> None:
        (self.base / f"{tool}.json").write_text(json.dumps([{"stdout": s, "rc": rc, "stderr": stderr} for s in stdouts]))

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        path = self.base / "calls.jsonl"
        found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [c for c in found if tool is None or c["tool"] == tool]


def shim(tmp_path: Path, monkeypatch: Any) -> Shim:
    fake = Shim(tmp_path / "slurm-replay")
    monkeypatch.setenv("PATH", f"{fake.base}{os.pathsep}{os.environ['PATH']}")
    return fake
