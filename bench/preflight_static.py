"""Preflight static checks (everything but the smoke) for ``latent_c_n4`` on the card profile.

Target: under 2 s. Figures: a whole ``idmctl preflight latent_c_n4 --cluster card
--no-smoke`` process (CLI start, torch import for introspection, store, checks, recording), the
same checks in a warm process, and the reference ``python -c "import torch"`` measured in the same
run, since importing the trainer's registries (torch) is most of a cold preflight.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Figure, time_call, time_command
from ground.contract import ENV_HOME

VENV_BIN = Path(sys.executable).parent


def _warm_checks(repeats: int) -> tuple[list[float], dict[str, float]]:
    from idmctl.gate.runner import gather, run_preflight
    from idmctl.core.profile import load_profile
    from ground.spec import load_spec

    resolved = load_spec("latent_c_n4")
    profile, profile_hash = load_profile("card")
    run_preflight(resolved, profile, profile_hash, with_smoke=False)  # imports torch, opens the store
    started = time.perf_counter()
    gather(resolved, profile)
    gather_s = time.perf_counter() - started
    samples = time_call(lambda: run_preflight(resolved, profile, profile_hash, with_smoke=False), repeats)
    return samples, {"gather_s": gather_s}


def _cold_samples(argv: list[str], repeats: int, root: Path) -> list[float]:
    """Each sample in a fresh ``IDMCTL_HOME``: no memo, so introspection imports torch (the first
    preflight after a code change)."""
    samples = []
    for i in range(repeats):
        env = {**os.environ, ENV_HOME: str(root / f"cold-{i}")}
        samples += time_command(argv, 1, env, warmup=False)
    return samples


def run(fast: bool) -> list[Figure]:
    repeats = 1 if fast else 5  # a cold preflight process takes seconds here
    argv = [str(VENV_BIN / "idmctl"), "preflight", "latent_c_n4", "--cluster", "card", "--no-smoke", "--json"]
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, ENV_HOME: str(Path(tmp) / "home")}
        os.environ[ENV_HOME] = env[ENV_HOME]
        time_command(argv, 1, env, warmup=False)  # also warms .pyc files for the cold samples
        cold = _cold_samples(argv, repeats, Path(tmp))
        warm_process = time_command(argv, repeats, env, warmup=False)  # the memo from the runs above
        torch_import = time_command([sys.executable, "-c", "import torch"], repeats, env)
        python_pass = time_command([sys.executable, "-c", "pass"], repeats, env)
        warm, parts = _warm_checks(repeats)
    return [
        Figure("idmctl preflight latent_c_n4 --no-smoke, code unchanged since the last preflight (whole process)", "s",
               warm_process, "python -c pass", python_pass, target="< 1 s",
               note="introspection from the memo (per code version): no torch import"),
        Figure("idmctl preflight latent_c_n4 --no-smoke, cold: new code version / fresh home (whole process)", "s", cold,
               "python -c 'import torch'", torch_import, target="< 2 s",
               note="includes CLI start and the torch import of introspection"),
        Figure("static checks, warm process (run_preflight, recorded)", "s", warm, "python -c 'import torch'",
               torch_import, note=f"measurement gathering {parts['gather_s'] * 1000:.1f} ms"),
    ]


if __name__ == "__main__":
    for figure in run(fast="--fast" in sys.argv):
        print(figure.as_dict())


# -- bench.run adapter: the static figures above, plus the quickstart's full
# preflight with the real smoke on CPU, on real data written in the quickstart's geometry. --------

_static_figures = run


def write_quickstart_data(root: Path) -> Path:
    """A spec extending the shipped quickstart over real tiny data in its geometry (as tests do)."""
    from trainers.tiny_data import write_tiny_routed_data

    from ground.paths import REPO_ROOT

    data = write_tiny_routed_data(root / "data", demos=6, valid=2, steps=24, frames=8, frame_stride=2, layers=4,
                                  grid=(4, 4), channels=32, action_dim=7)
    spec = root / "quickstart_here.yaml"
    spec.write_text(f"extends: {REPO_ROOT / 'experiments' / 'quickstart'}\n"
                    f"data:\n  episodes: {data['episodes']}\n  cache_root: {data['cache_root']}\n")
    return spec


def run(fast: bool) -> list[Figure]:  # type: ignore[no-redef]
    figures = _static_figures(fast)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, ENV_HOME: str(Path(tmp) / "home"), "CUDA_VISIBLE_DEVICES": ""}
        spec = write_quickstart_data(Path(tmp))
        argv = [str(VENV_BIN / "idmctl"), "preflight", str(spec), "--cluster", "local", "--json"]
        full = time_command(argv, 1 if fast else 2, env, warmup=not fast)
    figures.append(Figure("idmctl preflight quickstart, full with smoke on CPU (whole process)", "s", full,
                          target="seconds", note="all checks + the real trainer's 3-step smoke in a subprocess"))
    return figures
