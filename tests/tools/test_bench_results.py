"""The benchmarks' one report writer (tools/bench/results.py): markdown, JSON and CSV files by suffix, a
markdown table whose cells cannot cut a row, the --out option once, and a plot saved as a PNG."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from shardfeed.tools.bench import results


def test_each_file_is_written_by_its_suffix(tmp_path, capsys):
    out = tmp_path / "deep" / "out"  # made when missing
    paths = results.write(str(out), {
        "bench_x.md": "# x\n", "bench_x.json": {"rows": [1, 2], "path": tmp_path},
        "bench_x.csv": results.Rows(("a", "b"), [{"a": 1, "b": 2}, {"a": 3}, {"a": 4, "b": 5, "extra": 6}])},
        say="x")
    assert paths == [str(out / "bench_x.md"), str(out / "bench_x.json"), str(out / "bench_x.csv")]
    assert (out / "bench_x.md").read_text() == "# x\n"
    assert json.loads((out / "bench_x.json").read_text()) == {"rows": [1, 2], "path": str(tmp_path)}
    with open(out / "bench_x.csv", newline="") as f:
        assert list(csv.reader(f)) == [["a", "b"], ["1", "2"], ["3", ""], ["4", "5"]]
    assert capsys.readouterr().out == f"bench x: results in {', '.join(paths)}\n"


def test_a_file_it_cannot_write_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="bench_x.txt: the report writer writes .md, .json and .csv files"):
        results.write(str(tmp_path), {"bench_x.txt": "text"})
    with pytest.raises(TypeError, match="bench_x.csv: a CSV file's content is a results.Rows, not list"):
        results.write(str(tmp_path), {"bench_x.csv": [{"a": 1}]})


def test_a_table_aligns_its_columns_and_a_bar_in_a_cell_cannot_cut_its_row():
    text = results.table(["name", "rate", "status"], [["a", results.cell(1234.5), "error: x | y"],
                                                      ["b", results.cell(None), "ok"]], "lrl")
    assert text.splitlines() == ["| name | rate | status |", "|---|--:|---|", "| a | 1,234 | error: x / y |",
                                 "| b | – | ok |"]
    assert results.cell(0.256, ".1%") == "25.6%"
    with pytest.raises(ValueError, match="3 columns but 2 alignments"):
        results.table(["a", "b", "c"], [], "lr")


def test_out_is_added_once_and_defaults_to_bench_results():
    p = argparse.ArgumentParser()
    results.add_out(p)
    results.add_out(p)  # a benchmark's own and the dispatcher's: one option
    assert p.parse_args([]).out == "bench-results" and p.parse_args(["--out", "x"]).out == "x"


def test_a_plot_is_saved_as_a_png(tmp_path):
    _, fig, axes = results.figure(1, 2, figsize=(4, 2))
    assert axes.shape == (1, 2)
    axes[0][0].bar([0, 1], [1, 2])
    path = results.save(fig, str(tmp_path / "p.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
