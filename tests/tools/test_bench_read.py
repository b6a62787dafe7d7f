"""Smoke tests of `shardfeed bench read` on tiny data, and of its content check.

The end-to-end run uses the two libraries that need nothing optional
(shardfeed and a DataLoader over one file per sample), so it runs everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re

import pytest

from shardfeed.tools.bench import read as bench_read
from shardfeed.tools.bench.child import run as run_job
from shardfeed.tools.bench.report import MIN_BATCHES, targets
from shardfeed.tools.bench.samples import ContentCheck, SampleSpec

COLUMNS = ["library", "sample size", "samples", "workers", "shuffle", "samples/s", "MB/s", "fraction of cat",
           "first batch ms", "peak RSS MiB", "status"]


def _parse(argv):
    parser = argparse.ArgumentParser()
    bench_read.add_arguments(parser)
    return parser.parse_args(argv)


def _args(tmp_path, *extra, out="out"):
    # One size, one worker count, one shuffle: 6 fresh processes in all, so
    # the file stays well under a minute on 2 busy cores. Batch 64: 600
    # samples are 10 batches, enough for a steady state.
    return _parse(["--out", str(tmp_path / out), "--data", str(tmp_path / "out" / "data"), "--samples-2k", "600",
                   "--sizes", "2KiB", "--libraries", "shardfeed,files", "--workers", "0", "--shuffle", "on",
                   "--growth", "2", "--batch-size", "64", *extra])


def _run(args, out):
    code = bench_read.main(args)
    with open(out / "bench_read.json") as f:
        report = json.load(f)
    return code, out, report, args


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    return _run(_args(tmp), tmp / "out")


@pytest.fixture(scope="module")
def tiny_run(small_run):
    """The same data read in batches of 256: 3 batches per pass (5 for the growth row)."""
    tmp = small_run[1].parent
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = _run(_args(tmp, "--batch-size", "256", "--no-plot", out="out-tiny"), tmp / "out-tiny")
    return (*result, err.getvalue())


def _md_rows(path):
    rows = []
    for line in open(path).read().splitlines():
        if line.startswith("| ") and not line.startswith("| library") and not line.startswith("| target"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_small_run_reports_every_configuration_with_checked_content(small_run):
    code, out, report, _ = small_run
    assert code == 0
    rows = report["rows"]
    want = {("shardfeed", "2KiB", 600), ("files", "2KiB", 600), ("shardfeed", "2KiB", 1200)}
    assert {(r["library"], r["size"], r["count"]) for r in rows} == want
    for r in rows:
        assert r["status"] == "ok", r
        # the pass delivered every sample exactly once with the right bytes
        spec = SampleSpec(r["count"], bench_read.SIZES[r["size"]])
        assert (r["count"], r["bytes"], r["digest"]) == tuple(spec.expected()[k] for k in ("count", "bytes", "digest"))
        assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0 and 0 < r["frac_cat"]
        assert 0 < r["first_batch_ms"] <= r["elapsed_s"] * 1000
        # steady state = the pass less its first batch (64 samples here)
        assert r["steady_count"] == r["count"] - 64 and 0 < r["steady_s"] < r["elapsed_s"]
        assert r["batches"] == -(-r["count"] // 64) >= MIN_BATCHES and "too_small" not in r
        assert r["samples_per_s"] == pytest.approx(r["steady_count"] / r["steady_s"])
        assert r["peak_rss_mib"] > 50  # a Python process with torch imported, at least
    assert set(report["limits"]) == {"2KiB"}
    assert all(lim["library"] == "shardfeed" and lim["mb_per_s"] > 0 for lim in report["limits"].values())


def test_small_run_writes_markdown_table_and_plot(small_run):
    _, out, report, _ = small_run
    md = open(out / "bench_read.md").read()
    header = next(line for line in md.splitlines() if line.startswith("| library"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    rows = _md_rows(out / "bench_read.md")
    table_rows = [r for r in rows if len(r) == len(COLUMNS)]
    assert len(table_rows) == len(report["rows"]) + 2  # + the `cat` and the check-alone rows
    assert sum(r[0].startswith("`cat`") for r in table_rows) == 1
    assert sum(r[0].startswith("content check alone") for r in table_rows) == 1
    for r in table_rows:
        assert r[-1] == "ok"
        assert re.fullmatch(r"[\d,]+", r[5]) and re.fullmatch(r"[\d,]+", r[6])
    assert "Targets:" in md and "peak RSS flat as the dataset grows" in md
    with open(out / "bench_read.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_run_big_enough_is_judged_on_every_target(small_run):
    _, out, report, _ = small_run
    items = report["targets"]
    assert {t["target"].split(":")[0] for t in items} == {
        "2 KiB", "peak RSS <= the leanest peer's", "peak RSS flat as the dataset grows (<= +10%)"}
    for t in items:
        assert t["met"] in (True, False) and t["result"] == ("met" if t["met"] else "MISSED"), t
    assert "0 not judged" in open(out / "bench_read.md").read()


def test_rows_too_small_to_measure_say_so_and_judge_no_target(tiny_run):
    """Regression: `bench read --quick` read 100 KiB data of one batch, reported
    start-up as throughput and marked 18 targets MISSED without a caveat."""
    code, out, report, _, err = tiny_run
    assert code == 0
    small = {(r["library"], r["role"]): r for r in report["rows"]}
    assert set(small) == {("shardfeed", "main"), ("files", "main"), ("shardfeed", "growth")}
    for r in small.values():
        assert r["status"] == "ok"  # the content was checked and right...
        want = 3 if r["role"] == "main" else 5
        assert r["batches"] == want and r["too_small"] == f"too small: {want} batches"
        assert not {"samples_per_s", "mb_per_s", "frac_cat"} & set(r)  # ...but no rate is given
        assert r["first_batch_ms"] > 0 and r["whole_pass_samples_per_s"] > 0
    assert report["targets"] and all(t["met"] is None and t["result"] == "not judged" for t in report["targets"])
    assert all("too small" in t["detail"] and "no steady state" in t["detail"] for t in report["targets"])
    md = open(out / "bench_read.md").read()
    rows = [r for r in _md_rows(out / "bench_read.md") if len(r) == len(COLUMNS)]
    measured = [r for r in rows if not r[0].startswith(("`cat`", "content check"))]
    assert [r[-1] for r in measured] == ["ok, too small: 3 batches"] * 2 + ["ok, too small: 5 batches"]
    assert all(r[5] == r[6] == r[7] == "" for r in measured)
    assert "MISSED" not in md and f"Targets: 0 met, 0 missed, 0 not measured, {len(report['targets'])} not judged" in md
    assert "2KiB: 600 samples at batch 256 is too small: 3 batches" in err


def test_quick_sizes_give_every_pass_a_steady_state(tmp_path):
    for extra in ([], ["--batch-size", "1024"], ["--batch-size", "1"]):
        plan = bench_read.Plan(_parse(["--quick", "--out", str(tmp_path), *extra]))
        for size in plan.sizes:
            assert plan.batches(plan.counts[size]) >= MIN_BATCHES, (extra, size, plan.counts)
        assert plan.notes() == []
    plan = bench_read.Plan(_parse(["--out", str(tmp_path), "--samples-100k", "256"]))
    assert plan.notes() == ["100KiB: 256 samples at batch 256 is too small: 1 batch (< 8): "
                            "reported, no rate, no target judged"]


def test_a_one_batch_pass_gets_no_rate():
    row = {"status": "ok", "count": 256, "bytes": 256 * 2048, "elapsed_s": 0.5, "first_batch_s": 0.5,
           "batches": 1}
    bench_read.add_rates(row, {"mb_per_s": 1000.0}, 256)
    assert row["too_small"] == "too small: 1 batch" and "samples_per_s" not in row
    row = {"status": "ok", "count": 2048, "bytes": 2048 * 2048, "elapsed_s": 1.0, "first_batch_s": 0.3,
           "steady_s": 0.7, "steady_count": 1792, "steady_bytes": 1792 * 2048}  # an old child: no "batches"
    bench_read.add_rates(row, {"mb_per_s": 1000.0}, 256)
    assert row["batches"] == 8 and "too_small" not in row
    assert row["samples_per_s"] == pytest.approx(2560) and row["frac_cat"] == pytest.approx(1792 * 2048 / 0.7 / 1e9)


def test_damaged_data_is_reported_failed_not_as_a_number(small_run, tmp_path):
    """A library that delivers wrong bytes gets FAILED, never a throughput."""
    _, _, _, args = small_run
    plan = bench_read.Plan(args)
    folder = plan.folder("files", "2KiB", 600)
    victim = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".bin"))[5]
    data = bytearray(open(victim, "rb").read())
    data[500] ^= 0xFF  # same size: the dataset still looks complete
    with open(victim, "wb") as f:
        f.write(data)
    try:
        result = bench_read.run_pass({"mode": "read", "library": "files", "folder": folder, "count": 600,
                                       "size": 2048, "workers": 0, "shuffle": False, "batch_size": 64,
                                       "expected": SampleSpec(600, 2048).expected()}, timeout=120)
    finally:
        data[500] ^= 0xFF
        with open(victim, "wb") as f:
            f.write(data)
    assert result["status"].startswith("FAILED: wrong content (digest"), result
    assert "samples_per_s" not in result


def test_missing_library_is_an_error_row_not_a_crash(tmp_path):
    spec = SampleSpec(4, 64)
    result = run_job({"mode": "read", "library": "files", "folder": str(tmp_path / "absent"), "count": 4,
                      "size": 64, "workers": 0, "shuffle": False, "batch_size": 2, "expected": spec.expected()})
    assert result["status"].startswith("error: FileNotFoundError"), result


def test_bad_arguments_fail_fast(tmp_path, capsys):
    assert bench_read.main(_args(tmp_path, "--libraries", "shardfeed,nosuchlib")) == 2
    assert "nosuchlib" in capsys.readouterr().err
    assert bench_read.main(_args(tmp_path, "--samples-2k", "0")) == 2


# --- the content check ------------------------------------------------------------------

def _batches(spec, ids, size=5):
    ids = list(ids)
    for s in range(0, len(ids), size):
        part = ids[s:s + size]
        yield [spec.key(i) for i in part], [spec.payload(i) for i in part], [spec.cls(i) for i in part]


@pytest.mark.parametrize("case", ["exact", "shuffled", "missing", "repeated", "swapped payloads", "wrong class",
                                  "flipped byte"])
def test_content_check_accepts_exactly_the_expected_samples(case):
    spec = SampleSpec(40, 64)
    ids = list(range(40))
    if case == "shuffled":
        ids = ids[::-1]
    elif case == "missing":
        ids = ids[:-1]
    elif case == "repeated":
        ids = ids[:-1] + [3]
    check = ContentCheck()
    for keys, payloads, classes in _batches(spec, ids):
        if case == "swapped payloads" and keys[0] == spec.key(0):
            payloads[0], payloads[1] = payloads[1], payloads[0]
        if case == "wrong class" and keys[0] == spec.key(10):
            classes[2] += 1
        if case == "flipped byte" and keys[0] == spec.key(20):
            payloads[3] = payloads[3][:30] + bytes([payloads[3][30] ^ 1]) + payloads[3][31:]
        check.add(keys, payloads, classes)
    wrong = check.mismatch(spec.expected())
    assert (wrong is None) == (case in ("exact", "shuffled")), wrong


def test_content_check_takes_tensors_arrays_and_undecoded_fields():
    import numpy as np
    import torch
    spec = SampleSpec(6, 32)
    check = ContentCheck()
    keys = [spec.key(i) for i in range(6)]
    check.add(keys[:3], np.stack([np.frombuffer(spec.payload(i), np.uint8) for i in range(3)]),
              torch.tensor([spec.cls(i) for i in range(3)]))
    check.add([k.encode() for k in keys[3:]], torch.from_numpy(
        np.stack([np.frombuffer(spec.payload(i), np.uint8) for i in range(3, 6)])),
        [str(spec.cls(i)).encode() for i in range(3, 6)])
    assert check.mismatch(spec.expected()) is None


# --- targets from a run's rows ---------------------------------------------------------

def _row(lib, size, workers, sps, rss, shuffle=False, role="main", count=1000, status="ok"):
    mbps = sps * bench_read.SIZES[size] / 1e6
    return {"library": lib, "label": lib, "peer": lib != "shardfeed", "size": size, "count": count,
            "workers": workers, "shuffle": shuffle, "role": role, "status": status, "samples_per_s": sps,
            "mb_per_s": mbps, "frac_cat": mbps / 1000.0, "peak_rss_mib": rss}


def test_targets_compare_within_the_same_worker_count():
    report = {"limits": {"2KiB": {"mb_per_s": 1000.0}, "100KiB": {"mb_per_s": 1000.0}}, "rows": [
        _row("shardfeed", "2KiB", 0, 250_000, 200), _row("peer", "2KiB", 0, 100_000, 250),
        _row("shardfeed", "2KiB", 2, 150_000, 300), _row("peer", "2KiB", 2, 90_000, 280),
        _row("shardfeed", "100KiB", 0, 6_000, 200), _row("peer", "100KiB", 0, 3_000, 200),
        _row("shardfeed", "2KiB", 0, 0, 240, role="growth", count=4000),
        _row("peer", "100KiB", 2, 3_000, 200),
        _row("shardfeed", "100KiB", 2, 0, 0, status="error: boom"),
    ]}
    items = targets(report)
    got = {(t["target"].split(":")[0].split(" ")[0], t["config"]): t["met"] for t in items}
    assert got[("2", "2KiB, 0 workers, shuffle off")] is True          # 2.5x >= 2x
    assert got[("2", "2KiB, 2 workers, shuffle off")] is False         # 1.67x
    assert got[("100", "100KiB, 0 workers, shuffle off")] is True      # 614 of 1000 MB/s
    assert got[("100", "100KiB, 2 workers, shuffle off")] is None      # shardfeed errored
    assert got[("peak", "2KiB, 0 workers, shuffle off")] is True       # 200 <= 250
    assert got[("peak", "2KiB, 2 workers, shuffle off")] is False      # 300 > 280
    assert got[("2", "2KiB, shuffle off")] is False                    # 2 workers slower than 0
    assert got[("peak", "2KiB, 0 workers, 1,000 -> 4,000 samples")] is False  # +20%
    assert {t["result"] for t in items} == {"met", "MISSED", "not measured"}


def test_a_too_small_row_is_not_judged_and_is_no_peer_to_compare_with():
    small = {"too_small": "too small: 2 batches"}
    report = {"limits": {"2KiB": {"mb_per_s": 1000.0}}, "rows": [
        _row("shardfeed", "2KiB", 0, 250_000, 200), {**_row("peer", "2KiB", 0, 1_000, 900), **small},
        {**_row("shardfeed", "2KiB", 2, 150_000, 300), **small}, _row("peer", "2KiB", 2, 90_000, 280),
    ]}
    got = {(t["target"].split(":")[0].split(" ")[0], t["config"]): t for t in targets(report)}
    for key in [("2", "2KiB, 0 workers, shuffle off"), ("peak", "2KiB, 0 workers, shuffle off"),
                ("2", "2KiB, 2 workers, shuffle off"), ("peak", "2KiB, 2 workers, shuffle off"),
                ("2", "2KiB, shuffle off")]:
        assert got[key]["met"] is None and got[key]["result"] == "not judged", got[key]
        assert "too small: 2 batches (< 8, no steady state)" in got[key]["detail"]


def test_peak_rss_is_not_inherited_from_the_spawning_process(small_run):
    """Regression: getrusage's ru_maxrss survives exec on Linux, so every fresh
    child reported at least the orchestrator's own peak (all peers showed the
    same 381 MiB). The child now reports its own VmHWM."""
    _, _, _, args = small_run
    plan = bench_read.Plan(args)
    ballast = b"\x01" * (700 << 20)  # touched pages: this process's peak RSS is now > 700 MiB
    result = bench_read.run_pass({"mode": "read", "library": "files", "folder": plan.folder("files", "2KiB", 600),
                                   "count": 600, "size": 2048, "workers": 0, "shuffle": False, "batch_size": 64,
                                   "expected": SampleSpec(600, 2048).expected()}, timeout=120)
    del ballast
    assert result["status"] == "ok", result
    assert 50 < result["child_peak_rss_mib"] < 600 and result["peak_rss_mib"] < 600, result
