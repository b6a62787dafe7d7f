"""`shardfeed bench tokens` on a tiny stream: every variant delivers every token (checked by the token
sum inside each pass, a wrong pass is FAILED), rates and the copy-bandwidth share are reported. No timing
is asserted."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from shardfeed.tools.bench import tokens as bench_tokens


def test_tiny_run_reports_both_variants_checked(tmp_path):
    parser = argparse.ArgumentParser()
    bench_tokens.add_arguments(parser)
    args = parser.parse_args(["--tokens", "40000", "--window", "256", "--batch-size", "8", "--workers", "0",
                              "--repeat", "1", "--out", str(tmp_path), "--peers-python", "none"])
    assert bench_tokens.main(args) == 0
    report = json.loads((tmp_path / "bench_tokens.json").read_text())
    assert {r["variant"] for r in report["rows"]} == {"shardfeed", "megatron", "streaming"}
    for r in report["rows"]:
        if r["variant"] == "streaming":  # left out here (its own test below): a row saying so, not a rate
            assert r["status"].startswith("skipped: no venv for MosaicML Streaming") and "whole" not in r
            continue
        assert r["status"] == "ok" and r["whole"] > 0 and 0 < r["share_of_copy"] < 10
    assert report["tokens"] == 40000 // 256 * 256 and report["copy_gb_s"] > 0
    assert "Megatron-style" in (tmp_path / "bench_tokens.md").read_text()


def test_megatron_style_window_is_the_slice_of_the_bin(tmp_path):
    t = np.arange(1000, dtype=np.uint16)
    t.tofile(tmp_path / "d.bin")
    np.save(tmp_path / "d.idx.npy", np.array([0, 1000], np.int64))
    ds = bench_tokens.MegatronStyle(str(tmp_path / "d.bin"), str(tmp_path / "d.idx.npy"), 64)
    assert len(ds) == 15
    np.testing.assert_array_equal(ds[3].numpy(), t[192:256])


@pytest.mark.timeout(600)  # three processes of Streaming's venv, and 2-worker passes of each variant
def test_streaming_windows_are_slices_of_the_stream(tmp_path):
    """MosaicML Streaming's rows, where its venv exists, at uint32 (ids past 65,535): through 0 and 2
    workers every variant's pass delivers the stream's token sum (a wrong window, a lost one or ids read
    as uint16 is FAILED, not a rate)."""
    from shardfeed.tools.bench.peers import peers_python

    if peers_python(None) is None:
        pytest.skip("no venv for MosaicML Streaming (tools/bench/install_peers.sh)")
    parser = argparse.ArgumentParser()
    bench_tokens.add_arguments(parser)
    args = parser.parse_args(["--tokens", "65536", "--window", "512", "--batch-size", "8", "--workers", "0,2",
                              "--repeat", "1", "--dtype", "uint32", "--out", str(tmp_path)])
    assert bench_tokens.main(args) == 0
    rows = [r for r in json.loads((tmp_path / "bench_tokens.json").read_text())["rows"] if r["variant"] == "streaming"]
    assert [(r["workers"], r["status"]) for r in rows] == [(0, "ok"), (2, "ok")]
    assert all(r["whole"] > 0 for r in rows)
    import os
    assert any(n.endswith(".mds") for n in os.listdir(tmp_path / "data" / "tokens-65536-w512-uint32" / "streaming"))
    assert all(r["status"] == "ok" for r in json.loads((tmp_path / "bench_tokens.json").read_text())["rows"])
