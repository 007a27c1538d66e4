"""Byte sizes, bandwidths and durations: parsed from specs and profiles, printed with units.

Decimal units (kB, MB, GB, TB) are powers of 1000 and binary ones (KiB, MiB, GiB, TiB) powers of
1024, as the lab cards mix them ("264 MB", "3.56 GiB"). A job's memory is Slurm's quantity and is read
as Slurm reads it (:func:`parse_slurm_mem`): its K, M, G, T (with or without a trailing B) are 1024-based,
so ``--mem 1600GB`` asks for the 1600 GiB card A's sbatch got. Durations accept Slurm's forms
(``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) and ``90s``, ``2h``, ``18d``.
"""

from __future__ import annotations

import math
import re

_BYTE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(value: int | float | str) -> int:
    """``"1600GB"`` → 1_600_000_000_000; ``"24GiB"`` → 25_769_803_776; plain numbers are bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or isinstance(value, float) and not math.isfinite(value):  # isfinite(10**400) overflows
            raise ValueError(f"not a size: {value!r}")
        return int(value)
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _BYTE_UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 512MB, 24GiB, 6.6TB)")
    amount = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(amount):  # "1e400" is inf: int() of it was an OverflowError traceback
        raise ValueError(f"not a finite size: {value!r}")
    return int(amount)


_SLURM_MEM = re.compile(r"^([0-9]+)([KMGT]?)(I?B)?$", re.IGNORECASE)
SLURM_MEM_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
"""Slurm's memory suffixes (``--mem``, ``RealMemory``): 1024-based; a bare number is M (MiB)."""
SLURM_MEM_HELP = ("Slurm's units: K, M, G, T = KiB, MiB, GiB, TiB (1024-based; 1600GB is 1600 GiB, as sbatch "
                  "reads it); a bare number is MiB; whole numbers only")
"""What a memory size means, said once: ``--help``, the runbook and every refusal quote it."""


def parse_slurm_mem(value: int | str) -> int:
    """Bytes of a memory size as Slurm reads it (``--mem``/``resources.mem``): ``1600GB``/``1600G``/``1600GiB``
    → 1600 × 1024³; ``4096`` → 4096 MiB. Slurm's grammar is a whole number, one of K/M/G/T and an optional
    B (``GiB`` is accepted too: it means exactly Slurm's G). Anything else (``1.5G``, ``1PB``, ``1 XB``)
    is a ValueError naming the units, never a silently different allocation."""
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"not a memory size: {value!r}")
        return value * 2**20
    match = _SLURM_MEM.fullmatch(str(value).strip())
    if not match or (match.group(3) and not match.group(2)):
        raise ValueError(f"{value!r} is not a size Slurm reads ({SLURM_MEM_HELP})")
    unit = match.group(2).upper() or "M"
    return int(match.group(1)) * SLURM_MEM_UNITS[unit]


def slurm_mem(value: int | str) -> str:
    """A memory size in Slurm's own words: the number and unit as written (``1600GB`` → ``1600G``,
    ``400MiB`` → ``400M``), so the ``#SBATCH`` line says what the spec says."""
    size = parse_slurm_mem(value)
    for unit in ("T", "G", "M", "K"):
        if size % SLURM_MEM_UNITS[unit] == 0 and size // SLURM_MEM_UNITS[unit] > 0:
            return f"{size // SLURM_MEM_UNITS[unit]}{unit}"
    return "0"


def parse_bandwidth(value: int | float | str) -> float:
    """``"8GB/s"`` → 8e9 bytes per second."""
    if isinstance(value, str):
        text = value.strip()
        if not text.lower().endswith("/s"):
            raise ValueError(f"not a bandwidth: {value!r} (use e.g. 8GB/s)")
        return float(parse_bytes(text[:-2]))
    return float(parse_bytes(value))


def format_bytes(n: float, binary: bool = False) -> str:
    """1 decimal place, with unit: 265420800 → '265.4 MB' (or '253.1 MiB' when ``binary``)."""
    base, units = (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) if binary else (1000.0, ["B", "kB", "MB", "GB", "TB", "PB"])
    value = float(n)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= base
    raise AssertionError("unreachable")


_SUFFIX = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([smhd])\s*$", re.IGNORECASE)
_SUFFIX_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SLURM = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


MAX_DURATION_S = 100 * 365 * 86400
"""The longest finite duration anything here can mean (a time limit, a look-back, a wait): a century.
A longer number is a typo, and past ~1e14 days Python's dates overflow (``--since 1e23d`` raised
OverflowError); "UNLIMITED" is the way to say no limit."""


def _bounded(seconds: int | float, value: object) -> float:
    """``seconds`` as a float within ``0 … MAX_DURATION_S``; a 400-digit number is an error, not an OverflowError."""
    if not seconds <= MAX_DURATION_S:  # also catches NaN
        raise ValueError(f"{_shown(value)} is longer than a century (a typo? use UNLIMITED for no limit)")
    return float(seconds)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…'"


def parse_duration(value: int | float | str) -> float:
    """Seconds from Slurm's time formats or a suffixed number; a bare number is minutes, as in Slurm.
    Finite results are at most :data:`MAX_DURATION_S`."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value):
            raise ValueError(f"not a duration: {_shown(value)}")
        if value == float("inf"):
            return float("inf")
        return _bounded(value * 60, value)
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    suffixed = _SUFFIX.fullmatch(text)
    if suffixed:
        return _bounded(float(suffixed.group(1)) * _SUFFIX_SECONDS[suffixed.group(2).lower()], value)
    match = _SLURM.fullmatch(text)
    if not match:
        raise ValueError(f"not a duration: {_shown(value)} (use Slurm's D-HH:MM:SS, or 90s / 2h / 18d)")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return _bounded(int(days) * 86400 + hours * 3600 + minutes * 60 + seconds, value)
    if third is not None:  # HH:MM:SS
        return _bounded(int(first) * 3600 + int(second) * 60 + int(third), value)
    if second is not None:  # MM:SS
        return _bounded(int(first) * 60 + int(second), value)
    return _bounded(int(first) * 60, value)  # MM


def format_duration(seconds: float) -> str:
    """Human scale: '34.0 s', '2.2 h', '70.4 d'."""
    if seconds == float("inf"):
        return "unlimited"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def slurm_time(seconds: float) -> str:
    """Seconds → Slurm's D-HH:MM:SS for ``#SBATCH --time``."""
    total = int(round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
