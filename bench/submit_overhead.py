"""Submit overhead: what idmctl adds on top of sbatch.

Figures: rendering the batch script from a spec (``submit --dry-run`` in-process: load spec, resolve
options, validate, render) against a bare ``python -c pass``; and the rendered script through
``sbatch --test-only`` against a bare ``sbatch --test-only --wrap true`` (needs the local Slurm
cluster). ``python -m bench.submit_overhead [--fast]`` prints the figures as a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Figure, time_call


def run(fast: bool = False) -> list[Figure] | str:
    from idmctl.jobs.submit import dry_run

    repeats = 3 if fast else 15
    saved = {key: os.environ.get(key) for key in ("IDMCTL_HOME",)}
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-submit-") as tmp:
        os.environ["IDMCTL_HOME"] = str(Path(tmp) / "home")
        try:
            script = dry_run("quickstart", {}, "local-slurm")
            render = time_call(lambda: dry_run("quickstart", {}, "local-slurm"), repeats)
            interpreter = time_call(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats)
            figures.append(Figure("render the batch script (submit --dry-run, in-process)", "s", render,
                                  reference_name="python -c pass", reference_samples=interpreter,
                                  target="well under a second: submit is dominated by sbatch"))
            if os.environ.get("SLURM_CONF") and shutil.which("sbatch"):
                path = Path(tmp) / "job.sbatch"
                path.write_text(script)
                ours = time_call(lambda: subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, check=True), repeats)
                bare = time_call(lambda: subprocess.run(["sbatch", "--test-only", "--wrap", "true"], capture_output=True, check=True), repeats)
                figures.append(Figure("sbatch --test-only of the rendered script", "s", ours,
                                      reference_name="sbatch --test-only --wrap true", reference_samples=bare,
                                      target="ratio ≈ 1: the script adds nothing to the scheduler's work"))
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    figures = run(parser.parse_args().fast)
    print(json.dumps(figures if isinstance(figures, str) else [f.as_dict() for f in figures], indent=2))


if __name__ == "__main__":
    main()
