"""`shardfeed bench images` on a few photographs the test makes: every variant delivers every image at
the asked size (a wrong count or shape is FAILED), with a rate. No timing is asserted."""

from __future__ import annotations

import argparse
import json

from PIL import Image
from test_image_crops import _photo

from shardfeed.tools.bench import images as bench_images


def test_tiny_run_reports_every_variant(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        (photos / f"p{i}.jpg").write_bytes(_photo(i, 480, 360))
    Image.new("L", (400, 400)).save(photos / "gray.png")  # not RGB: left out
    parser = argparse.ArgumentParser()
    bench_images.add_arguments(parser)
    args = parser.parse_args(["--photos", str(photos), "--samples", "24", "--workers", "0", "--repeat", "1",
                              "--out", str(tmp_path / "out")])
    assert bench_images.main(args) == 0
    report = json.loads((tmp_path / "out" / "bench_images.json").read_text())
    assert report["photos"] == ["p0.jpg", "p1.jpg", "p2.jpg"]
    assert len(report["rows"]) == len(bench_images.VARIANTS)
    for r in report["rows"]:
        assert r["status"] in ("ok",) or r["status"].startswith("skipped"), r
        if r["status"] == "ok":
            assert r["images_per_s"] > 0 and r["per_core"] == r["images_per_s"]


def test_dali_cpu_pipeline_delivers_every_image_where_it_installs(tmp_path):
    """DALI runs in a venv of its own (WITH_DALI=1 tools/bench/install_peers.sh): where one exists its rows
    count every image at 3 x size x size uint8, at 0 and 2 threads."""
    import pytest
    dali = bench_images._dali_python(None)
    if dali is None:
        pytest.skip("no venv with DALI (.venv-dali or $SHARDFEED_DALI_PYTHON)")
    files = tmp_path / "files" / "0000"
    files.mkdir(parents=True)
    for i in range(10):
        (files / f"{i:08d}.jpg").write_bytes(_photo(i, 500, 375))
    for workers in (0, 2):
        r = bench_images._dali_pass(dali, {"files": str(tmp_path / "files")}, 160, workers, 10)
        assert r["status"] == "ok" and r["rate"] > 0, r
