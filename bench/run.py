"""Run every benchmark and write BENCHMARKS.md: ``python -m bench.run [--fast] [--out FILE]``.

Each module in ``MODULES`` exposes ``run(fast: bool) -> list[Figure]``. A module that cannot run here
(no GPU, no Slurm) contributes a "not measured: why" line instead of a guess. ``--fast`` runs in CI
to keep the benchmarks from rotting; it asserts no timings. ``--only NAME… --update`` regenerates
just those sections inside the existing ``--out`` file (and their keys of its JSON), leaving every
other section as it was measured, with a line under each new section saying when and at which
commit it was measured.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bench import common
from bench.common import Figure

MODULES = [
    ("CLI latency", "bench.cli_latency"),
    ("Preflight static checks", "bench.preflight_static"),
    ("Hidden-cache reads", "bench.hidden_reads"),
    ("DataLoader steady state against fio", "bench.loader_steady"),
    ("Three-way latent cache", "bench.latent_parallel"),
    ("Latent-cache reads against fio", "bench.latent_reads"),
    ("Page cache: hits, cold reads and O_DIRECT on the reader's ranges", "bench.page_cache"),
    ("Cache build jobs on Slurm", "bench.build_jobs"),
    ("Trainer overhead", "bench.trainer_overhead"),
    ("Tracking: the step loop's MLflow logging with the server up and down", "bench.tracking_spool"),
    ("Sync of many jobs", "bench.sync_jobs"),
    ("jobs import of a year's history in bounded sacct calls", "bench.sacct_import"),
    ("Submit overhead", "bench.submit_overhead"),
    ("Planning: sweeps and ETAs", "bench.planning"),
    ("GPU figures", "bench.gpu"),
    ("GPU proof: smoke, Fabric DDP, full-width build, NVML", "bench.gpu_proof"),
    ("robosuite simulator", "bench.sim"),
]


def _machine() -> str:
    cpus = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{platform.platform()}, Python {platform.python_version()}, {cpus} CPUs, {mem:.0f} GiB RAM"


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit in ("B", "files", "calls"):
        return f"{value:,.0f} {unit}"
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "fraction":
        return f"{value:.1%}"
    if unit == "%":
        return f"{value:.1f}%"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    if unit == "s" and value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:,.3g} {unit}"


def _section(title: str, items: list[Figure | str]) -> list[str]:
    """A table of the figures; a string among them is a part that could not be measured, said below it."""
    figures = [item for item in items if isinstance(item, Figure)]
    unmeasured = [item.removeprefix("not measured:").strip() for item in items if isinstance(item, str)]
    lines = [f"## {title}", "", "| figure | median | min | max | n | reference (median) | ratio | target | verdict | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    if not figures:
        lines = [f"## {title}", ""]
    for f in figures:
        ratio = f"{f.ratio:.2f}×" if f.ratio is not None else "—"
        ref = f"{f.reference_name}: {_fmt(f.reference_median, f.unit)}" if f.reference_name else "—"
        lines.append(f"| {f.name} | {_fmt(f.median, f.unit)} | {_fmt(min(f.samples), f.unit)} | "
                     f"{_fmt(max(f.samples), f.unit)} | {len(f.samples)} | {ref} | {ratio} | {f.target} | {f.verdict or '—'} | {f.note} |")
    return lines + [""] + [f"not measured: {why}" for why in unmeasured] + ([""] if unmeasured else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true", help="small sizes, few repeats (CI)")
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument("--only", nargs="*", help="module names to run")
    parser.add_argument("--update", action="store_true",
                        help="with --only: replace those sections of the existing --out file, keep the rest")
    args = parser.parse_args(argv)
    if args.update and not (args.only and Path(args.out).exists()):
        print(f"bench.run: --update needs --only and an existing {args.out}", file=sys.stderr)
        return 2
    fast_before, common.FAST_MODE = common.FAST_MODE, args.fast
    try:
        return _run(args)
    finally:
        common.FAST_MODE = fast_before  # a caller in the same process (the suite) gets its mode back


def _run(args: argparse.Namespace) -> int:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = "python -m bench.run" + (" --fast" if args.fast else "")
    if args.update:
        command += " --only " + " ".join(args.only) + " --update"
    out = ["# Benchmarks", "", f"- machine: {_machine()}", f"- commit: {commit or 'unknown'}",
           f"- command: `{command}`", f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
           "- every figure: median of n runs with min and max, and the ratio to a reference measured in the same run",
           f"- load average at start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min; the machine is shared)",
           ("- fast mode: tiny sizes and single samples to keep the suite alive in CI — not figures to quote" if args.fast else
            "- repeats: 2–5 samples per figure, 15 for in-process milliseconds (fewer than first planned, so the whole run takes ~5 min on 2 shared cores)"),
           ""]
    results: dict[str, object] = {}
    run_started = time.perf_counter()
    for title, module_name in MODULES:
        if args.only and module_name.split(".")[-1] not in args.only:
            continue
        started = time.perf_counter()
        try:
            module = importlib.import_module(module_name)
            figures = module.run(args.fast)
        except ModuleNotFoundError as exc:
            out += [f"## {title}", "", f"not measured: `{module_name}` is not built yet ({exc.name})", ""]
            continue
        except Exception as exc:  # a broken benchmark must not hide the others
            out += [f"## {title}", "", f"not measured: {type(exc).__name__}: {exc}", ""]
            traceback.print_exc()
            results[module_name] = {"error": repr(exc)}
            continue
        if isinstance(figures, str):  # a module that cannot run here says why
            reason = figures.removeprefix("not measured:").strip()
            out += [f"## {title}", "", f"not measured: {reason}", ""]
            results[module_name] = {"not_measured": reason}
            continue
        out += _section(title, figures)
        results[module_name] = [f.as_dict() if isinstance(f, Figure) else {"not_measured": f} for f in figures]
        print(f"{title}: {len(figures)} figures in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    from ground.paths import atomic_write_text

    if args.update:
        stamp = (f"_this section alone: `{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
                 f"{commit or 'unknown'}, load average {os.getloadavg()[0]:.1f} at the end_")
        text = update_sections(Path(args.out).read_text(), _sections(out), stamp)
        json_path = Path(args.out).with_suffix(".json")
        previous = json.loads(json_path.read_text()) if json_path.exists() else {}
        atomic_write_text(Path(args.out), text)
        atomic_write_text(json_path, json.dumps({**previous, **results}, indent=2, default=str))
        return 0
    out += [f"_total wall time of this run: {time.perf_counter() - run_started:.0f} s_", ""]
    atomic_write_text(Path(args.out), "\n".join(out) + "\n")
    atomic_write_text(Path(args.out).with_suffix(".json"), json.dumps(results, indent=2, default=str))
    return 0


def _sections(lines: list[str]) -> dict[str, list[str]]:
    """Title → the section's lines (from ``## title`` to before the next ``## ``)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith("## "):
            current = sections.setdefault(line[3:], [line])
        elif current is not None:
            current.append(line)
    return sections


def update_sections(text: str, fresh: dict[str, list[str]], stamp: str) -> str:
    """``text`` with each section in ``fresh`` replaced (a new one goes where ``MODULES`` orders it),
    ``stamp`` under its table; the header, the other sections and the closing line stay as they were."""
    lines = text.rstrip("\n").split("\n")
    head_end = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    tail_start = next((i for i in range(len(lines) - 1, head_end - 1, -1) if lines[i].startswith("_total wall")),
                      len(lines))
    old = _sections(lines[head_end:tail_start])
    order = [title for title, _ in MODULES]
    merged = {title: body for title, body in old.items()}
    for title, body in fresh.items():
        body = body[:]
        while body and not body[-1]:
            body.pop()
        merged[title] = body + ["", stamp, ""]
    titles = sorted(merged, key=lambda t: order.index(t) if t in order else len(order))
    body_lines = [line for title in titles for line in merged[title]]
    return "\n".join(lines[:head_end] + body_lines + lines[tail_start:]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
