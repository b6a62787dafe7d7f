"""Every shard format under every order gives the batches tar gives (issue 13,
"no pathological pairing of format and order").

The fast paths of columnar shards (formats/engine/columns.py: stored-order runs as
slices of their row groups, a whole Parquet or Arrow shard decoded once for
random order) and compressed tars must return exactly the keys and bytes of
the same samples stored as plain tar: through 0 and 2 workers, through a
cache dir, and across a resume. Damage in a compressed or Parquet shard is
raised, never delivered. The bench smoke test checks that `bench pairings
--quick` reports every configuration asked for, content-checked.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import labelled_sample
from loader_helpers import rows_until
from shardfeed.formats import ShardError, ShardWriter
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.open_dataset import open_index
from shardfeed.formats.writer import _ColumnarShard
from shardfeed.loader import Loader, ShardDataset

GROUP = _ColumnarShard.ROWS_PER_GROUP
N = GROUP * 2 + 300  # one shard of three row groups, then a short one
SHARD = GROUP * 2 + 100


def _write(root: str, fmt: str) -> str:
    from shardfeed.tools.bench.pairings import gzip_dataset

    kind, compression = {"tar.zst": ("tar", "zstd"), "tar.gz": ("tar", None)}.get(fmt, (fmt, None))
    with ShardWriter(root, format=kind, max_shard_samples=SHARD, compression=compression) as w:
        for i in range(N):
            w.write(labelled_sample(i, payload_bytes=24))
    if fmt == "tar.gz":
        gzip_dataset(root)
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("pairings")
    return {fmt: _write(str(base / fmt.replace(".", "-")), fmt) for fmt in ("tar", "parquet", "arrow", "tar.zst",
                                                                           "tar.gz")}


def _rows(root, shuffle, workers=0, cache_dir=None, state=None, stop=None):
    """(key, bin, cls) of every sample delivered, batch by batch; and the state after ``stop`` batches."""
    ds = ShardDataset(root, shuffle=shuffle, seed=5, cache_dir=cache_dir, decode=True)
    return rows_until(Loader(ds, batch_size=100, num_workers=workers),
                      lambda b: list(zip(b["__key__"], [bytes(x) for x in b["bin"]], b["cls"].tolist())), state, stop)


@pytest.mark.parametrize("shuffle", ["global", "none"])
@pytest.mark.parametrize("fmt", ["parquet", "arrow", "tar.zst", "tar.gz"])
def test_format_batches_equal_tar_at_0_and_2_workers(datasets, fmt, shuffle):
    want, _ = _rows(datasets["tar"], shuffle)
    assert sorted(k for b in want for k, _, _ in b) == [f"{i:08d}" for i in range(N)]
    assert _rows(datasets[fmt], shuffle)[0] == want
    if shuffle == "global":  # one worker-count change per format keeps the file fast
        assert _rows(datasets[fmt], shuffle, workers=2)[0] == want


@pytest.mark.parametrize("fmt", ["parquet", "tar.gz"])
def test_format_through_a_cache_dir_equals_tar(datasets, fmt, tmp_path):
    want, _ = _rows(datasets["tar"], "global")
    assert _rows(datasets[fmt], "global", cache_dir=str(tmp_path / "cache"))[0] == want


@pytest.mark.parametrize("fmt,workers", [("parquet", 0), ("arrow", 2), ("tar.zst", 0)])
def test_resume_mid_epoch_gives_the_rest_of_tars_epoch(datasets, fmt, workers):
    want, _ = _rows(datasets["tar"], "global")
    head, state = _rows(datasets[fmt], "global", workers=workers, stop=7)
    rest, _ = _rows(datasets[fmt], "global", workers=workers, state=state)
    assert head == want[:7]
    assert rest == want[7:]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_stored_runs_across_row_groups_equal_the_samples(datasets, fmt):
    """Contiguous runs (stored order) are slices of their row groups: a run
    over a group boundary, one inside a group, and one after random reads
    that decoded the whole shard."""
    reader = BatchReader(open_index(datasets[fmt]))
    try:
        for ids in (np.arange(GROUP - 50, GROUP + 70), np.arange(10, 60),
                    np.random.default_rng(1).integers(0, SHARD, 300), np.arange(GROUP * 2 - 5, GROUP * 2 + 20)):
            raw = reader.read(ids)
            assert raw.keys == [f"{i:08d}" for i in ids.tolist()]
            _, starts, sizes = raw.fields["bin"]
            for r, i in enumerate(ids.tolist()):
                assert raw.buf[starts[r]:starts[r] + sizes[r]].tobytes() == labelled_sample(i, 24)["bin"]
            assert raw.fields["cls"][1].tolist() == [i % 10 for i in ids.tolist()]
    finally:
        reader.close()


def _damage(path: str, where: float) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(int(size * where))
        b = f.read(1)
        f.seek(int(size * where))
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("fmt", ["parquet", "tar.zst", "tar.gz"])
@pytest.mark.parametrize("cached", [False, True])
def test_damaged_shard_is_raised_never_delivered(tmp_path, fmt, cached):
    root = _write(str(tmp_path / "ds"), fmt)
    index = open_index(root)
    _damage(index.path(0), 0.5)
    with pytest.raises(ShardError) as e:
        _rows(root, "global", cache_dir=str(tmp_path / "cache") if cached else None)
    assert os.path.basename(index.path(0)) in str(e.value)


def test_bench_pairings_quick_reports_every_configuration(tmp_path):
    from shardfeed.tools.bench import pairings
    from shardfeed.tools.bench.command import BENCHES

    assert "pairings" in BENCHES
    import argparse
    p = argparse.ArgumentParser()
    pairings.add_arguments(p)
    # a slice of the matrix (each configuration is a fresh process, ~3 s here);
    # the cache paths themselves are checked in-process above
    args = p.parse_args(["--quick", "--out", str(tmp_path / "out"), "--samples", "512", "--large-samples", "0",
                         "--formats", "tar,parquet,tar.gz", "--orders", "global", "--caches", "none",
                         "--workers", "0"])
    assert pairings.main(args) == 0
    got = json.load(open(tmp_path / "out" / "bench_pairings.json"))["results"]
    want = {("tar", "none"), ("parquet", "none"), ("tar.gz", "none")}
    assert {(r["format"], r["cache"]) for r in got} == want
    assert all(r["status"] == "ok" and r["whole"] > 0 for r in got)
    text = open(tmp_path / "out" / "bench_pairings.md").read()
    assert text.count("| ok |") == len(want)
