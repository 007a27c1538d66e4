"""bench/fio.py: the job file reads exactly the given byte ranges (widened to 4 KiB blocks for O_DIRECT),
a real fio run on a few MiB reads those bytes, and the JSON is parsed per wave. bench.run --update
replaces only the sections it ran. fio is a test dependency (scripts/system_deps.sh test)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import fio
from bench.run import update_sections

MIB = 1 << 20


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "ranges.bin"
    path.write_bytes(os.urandom(4 * MIB + 100))  # an unaligned end of file
    return path


def _sections(text: str) -> list[dict[str, str]]:
    jobs = []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("[w"):
            jobs.append({"name": lines[0], **dict(line.split("=", 1) for line in lines[1:] if "=" in line),
                         "stonewall": str("stonewall" in lines)})
    return jobs


def test_job_file_widens_ranges_to_blocks_and_splits_a_remainder(data_file: Path) -> None:
    size = data_file.stat().st_size
    waves = [[(data_file, 0, MIB), (data_file, MIB + MIB // 2 + 10, 300_000)], [(data_file, size - 50, 50)]]
    text, expected = fio.job_file(waves, iodepth=4, block_size=MIB)
    assert "ioengine=io_uring" in text and "iodepth=4" in text
    jobs = _sections(text)
    second_start = (MIB + MIB // 2 + 10) // 4096 * 4096
    second_end = -(-(MIB + MIB // 2 + 10 + 300_000) // 4096) * 4096
    tail_start = (size - 50) // 4096 * 4096
    assert [(j["offset"], j["size"], j["bs"], j["direct"], j["stonewall"]) for j in jobs] == [
        ("0", str(MIB), str(MIB), "1", "False"),
        # 300,010 B from an unaligned start: the 4 KiB blocks holding them, under one request of that size
        (str(second_start), str(second_end - second_start), str(second_end - second_start), "1", "False"),
        # inside the file's last, partial block: O_DIRECT cannot read it, so buffered; a new wave (stonewall)
        (str(tail_start), str(size - tail_start), str(size - tail_start), "0", "True"),
    ]
    whole_file, whole_expected = fio.job_file([[(data_file, 0, size)]], iodepth=4, block_size=MIB)
    assert [(j["offset"], j["size"], j["bs"], j["direct"]) for j in _sections(whole_file)] == [
        ("0", str(4 * MIB), str(MIB), "1"), (str(4 * MIB), "100", "100", "0")]  # the aligned part stays O_DIRECT
    assert whole_expected == size
    assert expected == MIB + (second_end - second_start) + (size - tail_start)
    assert {j["filename"] for j in jobs} == {str(data_file)}


def test_buffered_job_file_reads_the_exact_ranges_through_the_page_cache(data_file: Path) -> None:
    """The buffered reference (the kernel's own cost of the page-cache path): no block widening, every job
    ``direct=0``, and the loader's advice (``fadvise_hint=random``: no readahead beyond the ranges)."""
    size = data_file.stat().st_size
    waves = [[(data_file, 10, MIB + 5), (data_file, 2 * MIB, 300_000)], [(data_file, size - 50, 50)]]
    text, expected = fio.job_file(waves, iodepth=4, block_size=MIB, buffered="random")
    assert "fadvise_hint=random" in text.split("\n\n")[0]
    assert [(j["offset"], j["size"], j["bs"], j["direct"], j["stonewall"]) for j in _sections(text)] == [
        ("10", str(MIB), str(MIB), "0", "False"), (str(MIB + 10), "5", "5", "0", "False"),
        (str(2 * MIB), "300000", "300000", "0", "False"), (str(size - 50), "50", "50", "0", "True")]
    assert expected == MIB + 5 + 300_000 + 50
    assert "fadvise_hint" not in fio.job_file(waves, iodepth=4)[0]
    result = fio.read_ranges(waves, iodepth=4, buffered="random")
    assert result.bytes == expected


def test_a_range_longer_than_a_request_but_not_a_multiple_gets_a_remainder_job(data_file: Path) -> None:
    text, expected = fio.job_file([[(data_file, 0, 3 * MIB + 8192)]], iodepth=1, block_size=MIB)
    jobs = _sections(text)
    assert [(j["offset"], j["size"], j["bs"]) for j in jobs] == [("0", str(3 * MIB), str(MIB)),
                                                                 (str(3 * MIB), "8192", "8192")]
    assert expected == 3 * MIB + 8192


def test_a_range_outside_the_file_is_refused(data_file: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        fio.job_file([[(data_file, 4 * MIB, MIB)]], iodepth=1)


def test_real_fio_reads_exactly_the_ranges(data_file: Path) -> None:
    assert fio.unavailable() is None, "fio is missing: scripts/system_deps.sh test installs it"
    size = data_file.stat().st_size
    waves = [[(data_file, 0, MIB), (data_file, 2 * MIB + 10, 300_000)], [(data_file, size - 50, 50)]]
    _, expected = fio.job_file(waves, iodepth=4)
    result = fio.read_ranges(waves, iodepth=4)
    assert result.bytes == expected and result.iodepth == 4
    assert result.seconds >= 2e-3  # two waves, each at least fio's 1 ms resolution
    depth, rates = fio.best_depth(waves, depths=(1, 4))
    assert depth in (1, 4) and set(rates) == {1, 4} and all(rate > 0 for rate in rates.values())


def test_parse_sums_the_slowest_job_of_each_wave() -> None:
    def job(name: str, group: int, io_bytes: int, runtime_ms: int, error: int = 0) -> dict:
        return {"jobname": name, "groupid": group, "error": error, "read": {"io_bytes": io_bytes, "runtime": runtime_ms}}

    report = {"jobs": [job("a", 0, 100, 20), job("b", 0, 100, 30), job("c", 1, 50, 0)]}
    result = fio.parse(report, iodepth=16)
    assert (result.bytes, result.seconds) == (250, 0.031)  # 30 ms + a sub-millisecond wave counted as 1 ms
    with pytest.raises(RuntimeError, match="job a failed"):
        fio.parse({"jobs": [job("a", 0, 0, 0, error=5)]}, iodepth=1)


def test_without_fio_the_read_figures_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import hidden_reads, loader_steady

    monkeypatch.setattr(fio, "FIO", "fio-not-installed-here")
    reason = fio.unavailable()
    assert reason is not None and "fio is not installed" in reason
    assert hidden_reads.run(True) == f"not measured: {reason}"
    assert loader_steady.run(True) == f"not measured: {reason}"


def test_update_replaces_only_the_sections_it_ran() -> None:
    old = ("# Benchmarks\n\n- commit: abc\n\n## CLI latency\n\ncli row\n\n## Hidden-cache reads\n\nold row\n\n"
           "## Three-way latent cache\n\nlatent row\n\n_total wall time of this run: 444 s_\n")
    fresh = {"Hidden-cache reads": ["## Hidden-cache reads", "", "new row", ""],
             "DataLoader steady state against fio": ["## DataLoader steady state against fio", "", "loader row", ""]}
    text = update_sections(old, fresh, "_stamp_")
    assert text == ("# Benchmarks\n\n- commit: abc\n\n## CLI latency\n\ncli row\n\n## Hidden-cache reads\n\nnew row\n\n"
                    "_stamp_\n\n## DataLoader steady state against fio\n\nloader row\n\n_stamp_\n\n"
                    "## Three-way latent cache\n\nlatent row\n\n_total wall time of this run: 444 s_\n")
