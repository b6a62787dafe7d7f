"""Hardening, class "unbounded allocation": every allocation a file's claims
drive has a bound, checked as a whole (not claim by claim), that the user
can see and set."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pytest
import zstandard

from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard, tar_stream
from shardfeed.formats.engine import decoded_budget
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.own_tables import read_sidecar
from shardfeed.formats.sidecar import table_digest
from shardfeed.tools.cli import main

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)


def _forge_sidecar(side: str, shard: str, edit) -> None:
    """Rewrite a sidecar with ``edit(table)`` applied and a valid digest (an attacker's forgery)."""
    tbl = pa.ipc.open_file(pa.BufferReader(open(side, "rb").read())).read_all()  # a copy: the file is rewritten
    meta = json.loads(tbl.schema.metadata[b"shardfeed.sidecar"])
    tbl = edit(tbl.replace_schema_metadata(None))
    meta["digest"] = table_digest(tbl, meta)
    tbl = tbl.replace_schema_metadata({b"shardfeed.sidecar": json.dumps(meta).encode()})
    with pa.OSFile(side, "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as w:
        w.write_table(tbl)


def test_forged_sidecar_whose_ranges_each_pass_but_sum_past_the_shard(make_dataset):
    """Regression: ranges were checked one by one; 10 ranges each spanning the
    whole shard made one sample allocate 10x the shard (gigabytes at scale)."""
    idx = open_index(make_dataset(n=4, shard_samples=4))
    path = idx.path(0)
    size = os.path.getsize(path)

    def overlap(tbl):
        def lists(col, values):
            t = tbl.schema.field(col).type
            return pa.ListArray.from_arrays(pa.array([0, 40, 40, 40, 40], pa.int32()),
                                            pa.array(values, t.value_type), type=t)
        return tbl.set_column(2, tbl.schema.field(2), lists(2, [0] * 40)) \
                  .set_column(3, tbl.schema.field(3), lists(3, [size - 1024] * 40)) \
                  .set_column(4, tbl.schema.field(4), lists(4, [0] * 40))
    _forge_sidecar(path + ".idx", path, overlap)
    read_sidecar(path + ".idx", path)  # the forgery itself parses: its digest is valid
    with pytest.raises(ShardError, match="overlapping ranges|more than a"):
        open_shard(idx, 0)


def test_per_shard_decompression_default_fits_a_node():
    assert tar_stream.MAX_DECOMPRESSED_BYTES <= 1 << 30 or "SHARDFEED_MAX_DECOMPRESSED_BYTES" in os.environ


def _zst_tars(tmp_path, n: int, payload: int) -> list[str]:
    paths = []
    for s in range(n):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
            data = np.random.default_rng(s).bytes(payload)
            info = tarfile.TarInfo(f"s{s}.bin")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        p = tmp_path / f"f{s}.tar.zst"
        p.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
        paths.append(str(p))
    return paths


def test_open_compressed_shards_share_one_budget(tmp_path, monkeypatch):
    """Regression: every open .tar.zst stayed decompressed in memory (16 shards
    of 32 MiB grew memory by 719 MiB). The total is bounded: shards not in use
    are closed to make room, shards in use over the budget are an error."""
    paths = _zst_tars(tmp_path, 6, 100_000)
    monkeypatch.setattr(decoded_budget, "LIMIT", 250_000)  # room for two ~100 kB shards
    idx = open_index(paths)
    reader = BatchReader(idx)
    try:
        for s in range(6):  # one shard per batch: older ones are closed to make room
            assert reader.read(np.array([s])).keys == [f"s{s}"]
            assert decoded_budget.used() <= 250_000
        assert len(reader.shards.views) <= 2
        with pytest.raises(ShardError, match="SHARDFEED_MAX_DECOMPRESSED_TOTAL_BYTES"):
            reader.read(np.arange(6))  # all six at once cannot fit
    finally:
        reader.close()
    assert decoded_budget.used() == 0


def test_field_file_from_dev_zero_or_a_fifo_is_refused(tmp_path, capsys):
    """Regression: `convert --field col=bin:file` read /dev/zero until memory ran out."""
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 100)
    for target, reason in (("/dev/zero", "character device"), (fifo, "FIFO")):
        src = tmp_path / "rows.jsonl"
        src.write_text(json.dumps({"__key__": "a", "f": target}) + "\n")
        code = main(["convert", "--quiet", str(src), str(tmp_path / f"out{len(reason)}"), "--field", "f=bin:file"])
        assert code != 0
        assert reason in capsys.readouterr().err


def test_field_file_over_the_bound_is_refused(tmp_path, monkeypatch, capsys):
    from shardfeed.tools.convert import field_map
    monkeypatch.setattr(field_map, "MAX_FIELD_FILE_BYTES", 64)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 100)
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"__key__": "a", "f": str(big)}) + "\n")
    assert main(["convert", "--quiet", str(src), str(tmp_path / "out"), "--field", "f=bin:file"]) != 0
    assert "SHARDFEED_MAX_FIELD_FILE_BYTES" in capsys.readouterr().err


def test_index_counts_overflowing_int64_are_a_shard_error(tmp_path):
    root = str(tmp_path / "live")
    with ShardWriter(root, append=True, max_shard_samples=2) as w:
        for i in range(4):
            w.write({"__key__": f"k{i}", "cls": i})
    log = os.path.join(root, "_log")
    first = sorted(os.listdir(log))[0]
    rec = json.load(open(os.path.join(log, first)))
    for bad in (2 ** 63 + 5, 2 ** 62):
        rec["samples"] = bad
        json.dump(rec, open(os.path.join(log, first), "w"))
        with pytest.raises(ShardError, match="malformed|bad values|overflow"):
            open_index(root)
    rec["samples"] = 2 ** 61
    json.dump(rec, open(os.path.join(log, first), "w"))
    second = sorted(os.listdir(log))[1]
    rec2 = json.load(open(os.path.join(log, second)))
    rec2["samples"] = 2 ** 61 + 2 ** 60 + 2 ** 60  # each fits, the sum does not
    json.dump(rec2, open(os.path.join(log, second), "w"))
    with pytest.raises(ShardError, match="overflow"):
        open_index(root)
