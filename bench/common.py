"""Shared benchmark plumbing: repeat a measurement, keep every sample, report median/min/max.

Every figure is reported beside a reference measured in the same run (absolute times drift on
shared machines), so ``BENCHMARKS.md`` states ratios, not just seconds.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Figure:
    """One measured quantity and, optionally, the reference it is compared with."""

    name: str
    unit: str
    samples: list[float]
    reference_name: str | None = None
    reference_samples: list[float] = field(default_factory=list)
    target: str = ""
    """What the issue asks for, in words (e.g. '< 0.5 s and ≥ 3× faster than the reference')."""
    note: str = ""
    higher_is_better: bool = False

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def reference_median(self) -> float | None:
        return statistics.median(self.reference_samples) if self.reference_samples else None

    @property
    def ratio(self) -> float | None:
        """figure ÷ reference (medians)."""
        ref = self.reference_median
        return self.median / ref if ref else None

    @property
    def verdict(self) -> str:
        """``met`` or ``MISSED`` when every clause of the target is a comparison this can read (see
        :func:`judge`), else ``""`` (a target in words, judged by the reader)."""
        return judge(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "unit": self.unit, "median": self.median, "min": min(self.samples),
            "max": max(self.samples), "n": len(self.samples), "reference": self.reference_name,
            "reference_median": self.reference_median, "ratio": self.ratio, "target": self.target,
            "verdict": self.verdict, "note": self.note,
        }


_COMPARE = {"<": lambda a, b: a < b, "≤": lambda a, b: a <= b, ">": lambda a, b: a > b, "≥": lambda a, b: a >= b}
_SECONDS = {"s": 1.0, "ms": 1e-3}
_ABSOLUTE = re.compile(r"^([<≤>≥])\s*([\d.]+)\s*(ms|s)\b")
_SPEEDUP = re.compile(r"^([<≤>≥])\s*([\d.]+)×\s+faster\b")
_TIMES = re.compile(r"^([<≤>≥])\s*([\d.]+)×")
_PLUS = re.compile(r"^\S+\s*≤\s*\S+\s*\+\s*([\d.]+)\s*s\b")
_PERCENT = re.compile(r"^([<≤>≥])\s*([\d.]+)\s*%$")


def _clause(figure: Figure, clause: str) -> bool | None:
    """One comparison of a target: absolute seconds against the median; ``N× faster`` against
    reference ÷ median; ``N×`` against the ratio (or the median itself for a figure measured in ×);
    ``A ≤ B + N s`` against reference + N. None: not a comparison this reads."""
    median, ratio, reference = figure.median, figure.ratio, figure.reference_median
    if (match := _ABSOLUTE.match(clause)) and figure.unit in _SECONDS:
        op, value, unit = match.groups()
        return _COMPARE[op](median * _SECONDS[figure.unit], float(value) * _SECONDS[unit])
    if (match := _PERCENT.match(clause)) and figure.unit == "%":
        return _COMPARE[match.group(1)](median, float(match.group(2)))
    if (match := _SPEEDUP.match(clause)) and ratio:
        return _COMPARE[match.group(1)](1 / ratio, float(match.group(2)))
    if match := _TIMES.match(clause):
        measured = median if figure.unit == "×" else ratio
        return None if measured is None else _COMPARE[match.group(1)](measured, float(match.group(2)))
    if (match := _PLUS.match(clause)) and reference is not None and figure.unit in _SECONDS:
        return median <= reference + float(match.group(1)) / _SECONDS[figure.unit]
    return None


def judge(figure: Figure) -> str:
    """``met`` / ``MISSED`` for a target made of comparisons joined by "and"; ``""`` otherwise."""
    if not figure.target.strip():
        return ""
    results = [_clause(figure, clause.strip()) for clause in figure.target.split(" and ")]
    if any(result is None for result in results):
        return ""
    return "met" if all(results) else "MISSED"


def time_call(fn: Callable[[], Any], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


FAST_MODE = False
"""Set by ``bench.run --fast``: single samples for CI, so commands skip their unmeasured warm-up run."""


def time_command(argv: list[str], repeats: int, env: dict[str, str] | None = None,
                 warmup: bool | None = None) -> list[float]:
    """Wall seconds of ``argv`` as a whole process, ``repeats`` times (after one unmeasured warm-up run,
    unless ``warmup`` is False or, by default, in fast mode)."""
    def run() -> None:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        if done.returncode != 0:  # a failing command's time measures nothing; say why
            raise RuntimeError(f"{' '.join(argv[:4])}… exited {done.returncode}: {done.stderr.decode()[-300:].strip()}")

    if warmup if warmup is not None else not FAST_MODE:
        run()  # warm the page cache and .pyc files; the first run is not a sample
    return time_call(run, repeats)


def print_figures(figures: "list[Figure] | str") -> None:
    """A bench module's standalone output: its figures as JSON, or the reason it could not measure."""
    import json

    print(json.dumps(figures if isinstance(figures, str) else [f.as_dict() for f in figures], indent=2))


def saved_environ(*keys: str) -> dict[str, str | None]:
    """The current values of ``keys`` (None: unset), for :func:`restore_environ` after a benchmark
    that points ``IDMCTL_HOME``/``IDMCTL_CLUSTER`` somewhere else in this process."""
    return {key: os.environ.get(key) for key in keys}


def restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

