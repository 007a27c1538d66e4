"""Regenerate ``fixtures/releases/<release>.json`` from a clone of SchedMD/slurm (its release tags):
what each release's own source says sacct, squeue, sbatch, scontrol and sacctmgr print, for the parts
idmctl reads. Run by hand, not by the tests (they read the JSON files it wrote):

    python tests/idmctl/ops/slurm_drift/extract_release_facts.py /path/to/slurm-clone

Source: https://github.com/SchedMD/slurm, GPL-2.0-or-later (the facts are short lists of names and
format strings quoted from it, with the tag and commit they came from).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

TAGS = {"20.11": "slurm-20-11-9-1", "21.08": "slurm-21-08-8-1", "22.05": "slurm-22-05-11-1",
        "23.02": "slurm-23-02-8-1", "23.11": "slurm-23-11-11-1", "24.05": "slurm-24-05-8-1",
        "24.11": "slurm-24-11-7-1", "25.05": "slurm-25-05-8-1", "25.11": "slurm-25-11-7-1"}
SQUEUE_LETTERS = "iTrVSeN"
"""The letters of idmctl's squeue format (%i|%T|%r|%V|%S|%e|%N)."""


def show(repo: Path, tag: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def facts(repo: Path, release: str, tag: str) -> dict[str, object]:
    commit = subprocess.run(["git", "-C", str(repo), "rev-list", "-n", "1", tag], capture_output=True, text=True,
                            check=True).stdout.strip()
    sacct = show(repo, tag, "src/sacct/sacct.c")
    fields = re.findall(r'\{\s*-?\d+,\s*"([A-Za-z]+)",\s*print_fields', sacct)
    defs = show(repo, tag, "src/common/slurm_protocol_defs.c")
    body = defs[defs.index("extern char *job_state_string(uint32_t inx)"):]
    body = body[:body.index("extern char *job_state_string_compact")]
    states = [s for s in re.findall(r'return "([A-Z_?]+)"', body) if s != "?"]
    printer = show(repo, tag, "src/sacct/print.c")
    req_mem = printer[printer.index("case PRINT_REQ_MEM:"):][:1500]
    cancelled = re.search(r'"%s by %[ud]"', printer) is not None
    squeue = show(repo, tag, "src/squeue/opts.c")
    letters = {c: bool(re.search(rf"field\[0\] == '{c}'|,\s*'{c}',\s*_print_job", squeue)) for c in SQUEUE_LETTERS}
    sbatch = show(repo, tag, "src/sbatch/sbatch.c")
    branch = sbatch[sbatch.index("parsable) {"):][:600] if "parsable) {" in sbatch else ""
    parsable = re.findall(r'printf\("([^"]*)"', branch.split("} else {")[1] if "} else {" in branch else branch)
    config = show(repo, tag, "src/api/config_info.c")
    qos = show(repo, tag, "src/sacctmgr/qos_functions.c")
    return {
        "release": release, "tag": tag, "commit": commit,
        "source": f"https://github.com/SchedMD/slurm/tree/{tag}", "licence": "GPL-2.0-or-later",
        "sacct_fields": fields, "job_states": states, "cancelled_by_uid": cancelled,
        "req_mem_per_node_or_cpu_suffix": "per_cpu" in req_mem,
        "squeue_letters": letters, "sbatch_parsable_printf": parsable,
        "scontrol_config_keys": sorted(k for k in ("PreemptMode", "PreemptType") if f'"{k}"' in config),
        "sacctmgr_qos_preempt_mode": "PreemptMode" in qos,
    }


def main(repo: Path) -> None:
    out = Path(__file__).parent / "fixtures" / "releases"
    for release, tag in TAGS.items():
        (out / f"{release}.json").write_text(json.dumps(facts(repo, release, tag), indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
