"""The formats benchmark runs end to end at a small size and reports every figure."""

from __future__ import annotations

import argparse

from shardfeed.tools.bench import formats as bench_formats


def test_bench_formats_small(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_formats.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "out"), "--write-mib", "4", "--reads", "300", "--small-samples", "2000",
                              "--index-shards", "2000", "--scan-members", "3000"])
    assert bench_formats.main(args) == 0
    text = (tmp_path / "out" / "bench_formats.md").read_text()
    assert text in capsys.readouterr().out
    for needle in ("fraction of dd", "| 100 KiB | tar |", "| 2 KiB | arrow |", "| 2 KiB | parquet |",
                   "2,000 shards / 1,000,000,000 samples", "numba scan_headers", "Python tarfile"):
        assert needle in text
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bench_formats.md"]  # scratch removed
