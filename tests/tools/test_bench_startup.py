"""`shardfeed bench startup` on a tiny dataset: each fresh process reads its first batch (and 20 more) and
reports import and first-batch times, wall and CPU, with the full collections it saw. No timing is
asserted beyond what must hold in any run."""

from __future__ import annotations

import argparse
import json

from shardfeed.tools.bench import startup as bench_startup


def test_tiny_run_reports_each_order_from_fresh_processes(tmp_path):
    parser = argparse.ArgumentParser()
    bench_startup.add_arguments(parser)
    args = parser.parse_args(["--samples", "1000", "--size", "64", "--batch-size", "16", "--repeat", "1",
                              "--out", str(tmp_path)])
    assert bench_startup.main(args) == 0
    report = json.loads((tmp_path / "bench_startup.json").read_text())
    assert set(report["rows"]) == {"global", "none"} and "load" in report["machine"]
    for order, row in report["rows"].items():
        assert row["ok"] == row["runs"] == 1, report["runs"][order]
        assert 0 < row["import_s"] < row["first_s"] and 0 < row["import_cpu_s"] <= row["first_cpu_s"]
        assert row["full_gc_in_start"] == 0  # start-up pauses the collector
    text = (tmp_path / "bench_startup.md").read_text()
    assert "| global |" in text and "| none |" in text


def test_a_failing_child_is_reported_not_raised(tmp_path):
    got = bench_startup.fresh(str(tmp_path / "no-such-dataset"), "global", 8)
    assert got["status"].startswith("error:") and "dataset not found" in got["status"]
