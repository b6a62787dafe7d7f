"""`shardfeed bench shuffle` runs end to end and writes its three files."""

import argparse

from shardfeed.tools.bench import shuffle as bench_shuffle


def test_bench_shuffle_quick(tmp_path, capsys):
    """tools/bench.py may pass a namespace with little more than `out`: the rest has defaults."""
    args = argparse.Namespace(out=str(tmp_path), quick=True)
    args.scale_positions = 200_000  # the full 10M-position run belongs to the benchmark, not the tests
    assert bench_shuffle.main(args) == 0
    for name in ("shuffle_quality.md", "shuffle_quality.png", "shuffle_scale.md"):
        assert (tmp_path / name).stat().st_size > 0
    text = (tmp_path / "shuffle_quality.md").read_text()
    assert "| global | one permutation |" in text and "## Trade-off" in text
    assert "remote reads, locality-aware" in text
    assert "M/s per CPU-second" in (tmp_path / "shuffle_scale.md").read_text()
    assert "bench shuffle:" in capsys.readouterr().out


def test_bench_shuffle_arguments():
    parser = argparse.ArgumentParser()
    bench_shuffle.add_arguments(parser)
    args = parser.parse_args([])
    assert args.out == "bench-results" and args.seeds == 2 and not args.quick and not args.no_plot
