"""CLI start-up, two trees side by side in one run: ``python -m bench.cli_startup_ab --before DIR --after DIR``.

For a refactor's closing note: the same four commands (``--help``, ``exp list``, ``failures --json`` on a
store of 10,000 jobs / 2,000 failures, ``submit latent_c_n4 --dry-run``) from each tree, interleaved
before/after so both see the same machine load, each run a fresh interpreter (``python -m idmctl`` with the
tree as its working directory, so each imports its own code). Prints one Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ground.contract import ENV_HOME

COMMANDS = (["--help"], ["exp", "list"], ["failures", "--json"], ["submit", "latent_c_n4", "--dry-run"])


def _seconds(tree: Path, argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "idmctl", *argv], cwd=tree, env=env, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: idmctl {' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cli_ab_") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, ENV_HOME: str(home), "PYTHONDONTWRITEBYTECODE": "0"}
        # The store is filled once, by the "before" tree's own models: both trees read the same rows.
        fill = ("import sys; from pathlib import Path; from bench.cli_latency import _populate_store; "
                "_populate_store(Path(sys.argv[1]), 10_000, 2_000)")
        subprocess.run([sys.executable, "-c", fill, str(home)], cwd=args.before, env=env, check=True)
        times: dict[tuple[str, int], list[float]] = {}
        for tree in (args.before, args.after):  # warm-up: byte-code compiled, page cache filled
            for argv_ in COMMANDS:
                _seconds(tree, argv_, env)
        for _ in range(args.repeats):
            for index, argv_ in enumerate(COMMANDS):
                for label, tree in (("before", args.before), ("after", args.after)):
                    times.setdefault((label, index), []).append(_seconds(tree, argv_, env))
    load = os.getloadavg()[0]
    print(f"| command | before (median, min–max) | after (median, min–max) | after ÷ before |")
    print("|---|---|---|---|")
    for index, argv_ in enumerate(COMMANDS):
        b, a = times[("before", index)], times[("after", index)]
        print(f"| idmctl {' '.join(argv_)} | {statistics.median(b) * 1e3:,.0f} ms ({min(b) * 1e3:,.0f}–{max(b) * 1e3:,.0f}) "
              f"| {statistics.median(a) * 1e3:,.0f} ms ({min(a) * 1e3:,.0f}–{max(a) * 1e3:,.0f}) "
              f"| {statistics.median(a) / statistics.median(b):.2f}× |")
    print(f"\n{args.repeats} runs each, interleaved; before {args.before}, after {args.after}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
