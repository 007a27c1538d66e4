from __future__ import annotations

import pytest

from ground.units import format_bytes, parse_bandwidth, parse_bytes, parse_duration, slurm_time


def test_sizes_decimal_and_binary():
    assert parse_bytes("1600GB") == 1_600_000_000_000
    assert parse_bytes("24GiB") == 24 * 1024**3
    assert parse_bytes(512) == 512
    assert parse_bandwidth("8GB/s") == 8e9
    assert format_bytes(265_420_800) == "265.4 MB"
    assert format_bytes(3_822_059_520, binary=True) == "3.6 GiB"
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_durations_in_slurm_forms():
    assert parse_duration("30-00:00:00") == 30 * 86400
    assert parse_duration("1:00:00") == 3600
    assert parse_duration("0:30:00") == 1800
    assert parse_duration("90") == 90 * 60
    assert parse_duration("5:30") == 330
    assert parse_duration("2h") == 7200
    assert parse_duration("2-12") == 2 * 86400 + 12 * 3600
    assert slurm_time(90061) == "1-01:01:01"
    with pytest.raises(ValueError):
        parse_duration("two days")
