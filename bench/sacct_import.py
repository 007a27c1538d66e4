"""``jobs import --since 365d`` over a 100,000-job history: how long it takes, and its peak memory.

The sacct here is a FAKE, because 100,000 real jobs cannot run on the local two-node cluster: a script
first on PATH that serves lines recorded on that cluster (tests/idmctl/ops/slurm_drift/fixtures/
local-22.05-sacct-import.out: the import format, a name with a ``|`` and a newline, held and
heterogeneous jobs) at their real sizes, one per job, with the ids and times of a year of a busy
cluster, and answers ``-S``/``-E`` (read in local time) the way sacct does: a job is listed when it
was pending or running inside the window. It logs each call's line count.

Figures: the windowed import (idmctl's `jobs import`) against the one-call import it replaces, both
in a fresh process with its own store, peak RSS from ``getrusage`` of that process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.common import Figure, print_figures
from ground.contract import ENV_DB_URL, ENV_HOME

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests/idmctl/ops/slurm_drift/fixtures/local-22.05-sacct-import.out"
SEP = "\x1f"
MAX_DURATION_S = 4 * 3600

_FAKE_SACCT = r'''#!{python}
"""A fake sacct serving a recorded history (bench/sacct_import.py): -S/-E in local time, the window rule of sacct."""
import bisect, sys, time
args = sys.argv[1:]
def arg(flag):
    return args[args.index(flag) + 1] if flag in args else None
def local(text):
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
start = local(arg("-S")) if arg("-S") else 0.0
end = local(arg("-E")) if arg("-E") else time.time()
submits, rows = [], []
with open({history!r}) as handle:
    for line in handle:
        submit, finish, text = line.split("\t", 2)
        submits.append(float(submit)); rows.append((float(finish), text))
lo = bisect.bisect_left(submits, start - {max_duration})
hi = bisect.bisect_right(submits, end)
printed = 0
out = sys.stdout
for finish, text in rows[lo:hi]:
    if finish >= start:
        out.write(text[:-1].replace("\\n", "\n"))
        printed += 1
with open({log!r}, "a") as log:
    log.write(f"{{printed}}\n")
'''


def recorded_rows() -> list[list[str]]:
    """The recorded import lines as rows (a name's newline kept inside its row)."""
    rows: list[list[str]] = []
    for line in RECORDED.read_text().split("\n"):
        parts = line.split(SEP)
        if len(parts) == 1 and rows and line:
            rows[-1][-1] += "\n" + line
        elif len(parts) > 1:
            rows.append(parts)
    return rows


def write_history(path: Path, n_jobs: int, now: datetime, seed: int = 5) -> int:
    """``n_jobs`` recorded rows with new ids and times spread over the 365 days before ``now``, sorted by
    Submit; returns the bytes of sacct output they make."""
    rng = random.Random(seed)
    rows = recorded_rows()
    year = 365 * 86400
    jobs = []
    for i in range(n_jobs):
        row = list(rows[i % len(rows)])
        submit = now.timestamp() - year + rng.uniform(0, year - 3600)
        ran = known_start = not row[8].startswith("None")
        start = submit + rng.uniform(5, 1800)
        finish = start + rng.uniform(30, MAX_DURATION_S - 1800) if ran else submit + rng.uniform(5, 600)
        stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))  # noqa: E731  (sacct: local time)
        row[0] = str(2_000_000 + i) + (row[0][row[0].index("_"):] if "_" in row[0] else "")
        row[5], row[6], row[7] = stamp(submit), stamp(start) if known_start else "None", stamp(finish)
        jobs.append((submit, finish, SEP.join(row) + "\n"))
    jobs.sort()
    size = 0
    with open(path, "w") as handle:
        for submit, finish, text in jobs:
            size += len(text.encode())
            handle.write(f"{submit}\t{finish}\t{text.replace(chr(10), chr(92) + 'n')[:-2]}\\n\n")
    return size


_CHILD = r'''
import json, sys, time
from datetime import datetime, timezone
from idmctl.ops.failures import importer
from idmctl.ops.failures.postmortem import parse_since
mode = sys.argv[1]
started = time.perf_counter()
if mode == "windows":
    result, failed = importer.import_windows(parse_since("365d"))
else:  # the reader this replaces: one sacct call for the whole year, every record in one transaction
    since = parse_since("365d")
    records = importer.parse_history(importer.run_bounded(importer.history_args(since, None), 10**9, 3600))
    result, failed = importer.import_and_classify(records)
# VmHWM, not ru_maxrss: Linux keeps the latter across exec, so the parent's peak would count
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.perf_counter() - started, "peak_rss_kib": hwm,
                  "seen": result["seen"], "imported": len(result["imported"]), "failed_runs": failed}))
'''


def measure(n_jobs: int, mode: str) -> dict[str, float]:
    """One import of an ``n_jobs`` history in a fresh process and store; its figures and sacct's calls."""
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-import-") as tmp:
        base = Path(tmp)
        history, log = base / "history.tsv", base / "calls.log"
        output_bytes = write_history(history, n_jobs, datetime.now(timezone.utc))
        (base / "bin").mkdir()
        fake = base / "bin" / "sacct"
        fake.write_text(_FAKE_SACCT.format(python=sys.executable, history=str(history), log=str(log),
                                           max_duration=MAX_DURATION_S))
        fake.chmod(0o755)
        env = {**os.environ, "PATH": f"{base / 'bin'}{os.pathsep}{os.environ['PATH']}",
               ENV_HOME: str(base / "home")}
        env.pop(ENV_DB_URL, None)  # a store of its own (SQLite), whatever the shell points at
        done = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True, text=True,
                              cwd=REPO, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        calls = [int(x) for x in log.read_text().split()]
        figures.update(calls=len(calls), max_lines=max(calls), output_mib=output_bytes / 2**20)
        return figures


def run(fast: bool = False) -> list[Figure] | str:
    sizes = [500] if fast else [10_000, 100_000]
    figures: list[Figure] = []
    for n_jobs in sizes:
        windows, one_call = measure(n_jobs, "windows"), measure(n_jobs, "one-call")
        assert windows["seen"] == one_call["seen"] == n_jobs, (windows, one_call)
        note = (f"FAKE sacct serving recorded 22.05.8 lines ({windows['output_mib']:.1f} MiB for {n_jobs:,} jobs); "
                f"windowed: {windows['calls']} sacct calls, at most {windows['max_lines']:,} lines each; "
                f"{windows['imported']:,} imported, {windows['failed_runs']:,} failed runs classified")
        figures.append(Figure(f"jobs import --since 365d, {n_jobs:,}-job history: wall time", "s",
                              [windows["seconds"]], reference_name="one sacct call for the year (the old import)",
                              reference_samples=[one_call["seconds"]], target="bounded calls; says how long it took",
                              note=note))
        figures.append(Figure(f"jobs import --since 365d, {n_jobs:,}-job history: peak RSS", "B",
                              [windows["peak_rss_kib"] * 1024.0], reference_name="one sacct call for the year",
                              reference_samples=[one_call["peak_rss_kib"] * 1024.0],
                              target="bounded memory: the same at 10× the history",
                              note="VmHWM of the importing process (the fake sacct is a child)"))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()
