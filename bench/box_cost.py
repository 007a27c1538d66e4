"""What the box (``idmctl.gate.box``) costs a preflight, against ``import torch`` in a new interpreter.

Figures: the box around nothing (fork, two pipes, the child's setsid, the two ``/proc`` sweeps for what it
left behind); the introspection check in the box against the same check in-process (torch already
imported by the parent in both, so only the box differs); ``box.command`` against ``subprocess.run`` of
``true`` (the smoke's path). The reference is ``python -c 'import torch'`` in a new interpreter: with the
page cache warm, a lower bound on a cold import, so "< 1×" against it holds a fortiori against a cold one.
``python -m bench.box_cost [--fast]`` prints the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Figure, print_figures, restore_environ, saved_environ, time_call
from ground.contract import ENV_HOME


def run(fast: bool = False) -> list[Figure] | str:
    from idmctl.core.checks import PreflightContext
    from idmctl.core.profile import load_profile
    from idmctl.gate import box, introspection
    from ground.spec import load_spec

    repeats = 3 if fast else 15
    torch_import = time_call(lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True),
                             2 if fast else 5)
    saved = saved_environ(ENV_HOME)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="idmctl-bench-box-") as tmp:
        os.environ[ENV_HOME] = str(Path(tmp) / "home")
        try:
            empty = time_call(lambda: box.call(lambda: None, 60), repeats)
            figures.append(Figure("the box around nothing (fork, setsid, pipes, /proc sweeps)", "s", empty,
                                  reference_name="python -c 'import torch' (new interpreter, warm page cache)",
                                  reference_samples=torch_import, target="< 1× the reference"))
            # What a cold preflight pays: a new interpreter, torch not imported; in-process the check imports
            # it, in the box the box's child does (and the parent never does).
            cold = 2 if fast else 5
            in_process = [_cold_check("_check_here") for _ in range(cold)]
            boxed = [_cold_check("check") for _ in range(cold)]
            figures.append(Figure("cold introspection of quickstart in the box (a new interpreter)", "s", boxed,
                                  reference_name="the same check in-process (a new interpreter)",
                                  reference_samples=in_process, target="box − in-process < 1× import torch",
                                  note=f"import torch in a new interpreter: {sorted(torch_import)[len(torch_import) // 2]:.3f} s"))
            # The worst case: a parent that already imported torch (its fork copies a large address space).
            resolved = load_spec("quickstart")
            profile, _ = load_profile("local")
            ctx = PreflightContext(resolved, profile)
            import cache.registry  # noqa: F401

            warm_in = time_call(lambda: introspection._check_here(ctx), repeats)
            warm_box = time_call(lambda: introspection.check(ctx), repeats)
            figures.append(Figure("introspection in the box, torch already in the parent", "s", warm_box,
                                  reference_name="the same check in-process", reference_samples=warm_in,
                                  target="box − in-process < 1× import torch"))
            bare = time_call(lambda: subprocess.run(["true"], check=True), repeats)
            command = time_call(lambda: box.command(["true"], env=dict(os.environ), cwd=tmp, deadline_s=60), repeats)
            figures.append(Figure("box.command(['true']) (the smoke's path)", "s", command,
                                  reference_name="subprocess.run(['true'])", reference_samples=bare,
                                  target="box − bare < 1× import torch"))
        finally:
            restore_environ(saved)
    return figures


COLD = """
import sys, time
from idmctl.core.checks import PreflightContext
from idmctl.core.profile import load_profile
from idmctl.gate import introspection
from ground.spec import load_spec
ctx = PreflightContext(load_spec("quickstart"), load_profile("local")[0])
started = time.perf_counter()
result = getattr(introspection, sys.argv[1])(ctx)
assert result.status.value == "PASS", result
print(time.perf_counter() - started)
"""


def _cold_check(function: str) -> float:
    done = subprocess.run([sys.executable, "-c", COLD, function], capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true")
    print_figures(run(parser.parse_args().fast))


if __name__ == "__main__":
    main()
