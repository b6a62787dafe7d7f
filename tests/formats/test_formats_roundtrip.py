"""Round trips through ShardWriter and the readers, and WebDataset compatibility
both ways (with the real ``webdataset`` library and its published test shards)."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import tarfile

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from conftest import labelled_sample
from shardfeed.formats import ShardWriter, compact, decode_field, open_index, open_shard, read_log, verify_shard
from shardfeed.formats.index import INDEX_NAME

WDS_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-testdata")


def _jpeg(i: int) -> bytes:
    arr = np.full((8, 8, 3), i % 256, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG")
    return buf.getvalue()


def rich_sample(i: int) -> dict:
    """One of every field type the writer encodes."""
    return {
        "__key__": f"dir/{i:05d}",  # a '/' in a key is legal WebDataset and must survive
        "cls": i,
        "txt": f"text {i} \u00e9",
        "json": {"i": i, "tags": ["a", str(i)]},
        "npy": np.arange(i, i + 6, dtype=np.float32).reshape(2, 3),
        "jpg": _jpeg(i),
        "seg.png": np.full((4, 5, 3), i, np.uint8),
        "bin": bytes([i % 256]) * (i + 1),
    }


def assert_same(decoded: dict, original: dict) -> None:
    assert decoded["__key__"] == original["__key__"]
    assert set(decoded) == set(original)
    for ext, want in original.items():
        if ext == "__key__":
            continue
        got = decode_field(ext, decoded[ext])
        if ext == "seg.png":
            np.testing.assert_array_equal(got, want)  # PNG is lossless
        elif ext == "npy":
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        elif ext == "jpg":
            assert decoded[ext] == want  # bytes in, same bytes out
            assert got.shape == (8, 8, 3)
        else:
            assert got == want, ext


@pytest.mark.parametrize("fmt,compression", [("tar", None), ("tar", "zstd"), ("parquet", None),
                                             ("parquet", "zstd"), ("arrow", None)])
def test_round_trip_every_field_type_in_order(tmp_path, fmt, compression):
    root = str(tmp_path / "ds")
    originals = [rich_sample(i) for i in range(23)]
    with ShardWriter(root, format=fmt, compression=compression, max_shard_samples=10) as w:
        for s in originals:
            w.write(s)
    idx = open_index(root)
    assert idx.counts.tolist() == [10, 10, 3]
    assert idx.num_samples == 23
    back = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            back += list(r)
            verify_shard(idx, i)
    assert len(back) == 23
    for got, want in zip(back, originals):
        assert_same(got, want)
    # random access by global id agrees with sequential order
    shard, local = idx.locate(np.array([22, 0, 13]))
    for s, j, gid in zip(shard.tolist(), local.tolist(), [22, 0, 13]):
        with open_shard(idx, s) as r:
            assert_same(r.read(j), originals[gid])


def test_tar_tf_lists_members_with_plain_ustar_headers(make_dataset):
    root = make_dataset(n=6, shard_samples=6)
    path = open_index(root).path(0)
    out = subprocess.run(["tar", "tf", path], capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"{i:08d}.{ext}" for i in range(6) for ext in ("cls", "txt", "bin")]
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    # one 512-byte header per member: no PAX headers in front of each member
    assert all(m.pax_headers == {} for m in members)
    data_blocks = sum(-(-m.size // 512) for m in members)
    assert os.path.getsize(path) == 512 * (len(members) + data_blocks + 2)


def test_shard_rolls_by_bytes(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_bytes=10_000) as w:
        for i in range(40):
            w.write({"__key__": f"{i:04d}", "bin": b"x" * 1000})
    idx = open_index(root)
    assert idx.num_samples == 40 and len(idx) > 3
    # a shard is closed at the first sample that reaches the limit
    assert all(s <= 10_000 + 1536 + 1024 for s in idx.sizes.tolist())


def test_webdataset_reads_our_shards(make_dataset):
    root = make_dataset(n=30, shard_samples=10)
    idx = open_index(root)
    urls = [idx.path(i) for i in range(len(idx))]
    got = list(wds.WebDataset(urls, shardshuffle=False))
    assert [s["__key__"] for s in got] == [f"{i:08d}" for i in range(30)]
    for s in got:
        want = labelled_sample(int(s["__key__"]))
        assert s["cls"] == str(want["cls"]).encode()
        assert s["txt"] == want["txt"].encode()
        assert s["bin"] == want["bin"]


def test_webdataset_decoded_values_match_ours(tmp_path):
    root = str(tmp_path / "ds")
    originals = [rich_sample(i) for i in range(5)]
    with ShardWriter(root) as w:
        for s in originals:
            w.write(s)
    got = list(wds.WebDataset(open_index(root).path(0), shardshuffle=False).decode("rgb8"))
    for g, want in zip(got, originals):
        assert g["__key__"] == want["__key__"]
        assert g["cls"] == want["cls"] and g["txt"] == want["txt"] and g["json"] == want["json"]
        np.testing.assert_array_equal(g["npy"], want["npy"])
        np.testing.assert_array_equal(g["seg.png"], want["seg.png"])


@pytest.mark.parametrize("writer", ["TarWriter", "ShardWriter"])
def test_we_read_tars_written_by_webdataset(tmp_path, writer):
    samples = [{"__key__": f"k{i:04d}", "cls": i, "txt": f"t{i}", "json": {"i": i},
                "npy": np.arange(i + 1, dtype=np.int64), "bin": bytes([i]) * 7} for i in range(25)]
    if writer == "TarWriter":
        paths = [str(tmp_path / "w.tar")]
        with wds.TarWriter(paths[0]) as w:
            for s in samples:
                w.write(s)
    else:
        with wds.ShardWriter(str(tmp_path / "w-%04d.tar"), maxcount=10, verbose=0) as w:
            for s in samples:
                w.write(s)
        paths = sorted(str(p) for p in tmp_path.glob("w-*.tar"))
        assert len(paths) == 3
    idx = open_index(str(tmp_path))  # a folder of foreign tars, no index: scanned once
    assert idx.names == [os.path.basename(p) for p in paths]
    back = [s for i in range(len(idx)) for s in open_shard(idx, i)]
    assert [s["__key__"] for s in back] == [s["__key__"] for s in samples]
    for got, want in zip(back, samples):
        assert decode_field("cls", got["cls"]) == want["cls"]
        assert decode_field("txt", got["txt"]) == want["txt"]
        assert decode_field("json", got["json"]) == want["json"]
        np.testing.assert_array_equal(decode_field("npy", got["npy"]), want["npy"])
        assert got["bin"] == want["bin"]


@pytest.mark.parametrize("name,count", [("sample.tgz", 90), ("tendata.tar", 100), ("testgz.tar", 1000)])
def test_published_webdataset_testdata_matches_the_library(name, count):
    path = os.path.join(WDS_DATA, name)
    theirs = [{k: v for k, v in s.items() if k == "__key__" or not k.startswith("__")}
              for s in wds.WebDataset(path, shardshuffle=False)]
    idx = open_index(path)
    assert idx.num_samples == count == len(theirs)
    with open_shard(idx, 0) as r:
        ours = list(r)
        assert ours == theirs  # same keys, same fields, same payload bytes, same order
        j = count // 2  # random access agrees with the stream
        assert r.read(j) == theirs[j]


def test_testdata_folder_opens_as_one_scanned_dataset():
    idx = open_index("file://" + WDS_DATA)
    assert idx.names == ["sample.tgz", "tendata.tar", "testgz.tar"]
    assert idx.formats == ["tar.gz", "tar", "tar"]
    assert idx.counts.tolist() == [90, 100, 1000]
    assert {"png", "cls", "ten", "txt.gz"} <= set(idx.fields)


def test_file_url_and_plain_path_give_the_same_index(make_dataset):
    root = make_dataset(n=12, shard_samples=5)
    a, b = open_index(root), open_index("file://" + root)
    assert a.names == b.names and a.counts.tolist() == b.counts.tolist() == [5, 5, 2]
    assert a.hashes == b.hashes


def test_index_counts_agree_with_sidecars(make_dataset):
    from shardfeed.formats import read_sidecar
    root = make_dataset(n=37, shard_samples=8)
    idx = open_index(root)
    for i in range(len(idx)):
        table, meta = read_sidecar(idx.path(i) + ".idx", idx.path(i))
        assert len(table) == idx.counts[i]
        assert meta["shard_bytes"] == idx.sizes[i] == os.path.getsize(idx.path(i))
        assert meta["shard_hash"] == idx.hashes[i]


@pytest.mark.parametrize("fmt", ["tar", "parquet", "arrow"])
def test_empty_dataset(tmp_path, fmt):
    root = str(tmp_path / "empty")
    with ShardWriter(root, format=fmt):
        pass
    idx = open_index(root)
    assert len(idx) == 0 and idx.num_samples == 0 and idx.offsets.tolist() == [0]


def test_zero_sample_foreign_tar(tmp_path):
    """A tar holding only an end-of-archive marker (or only directories) is a
    shard of zero samples, not an error."""
    p = tmp_path / "empty.tar"
    with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tf:
        info = tarfile.TarInfo("somedir")
        info.type = tarfile.DIRTYPE
        tf.addfile(info)
    idx = open_index(str(p))
    assert idx.counts.tolist() == [0]
    with open_shard(idx, 0) as r:
        assert len(r) == 0 and list(r) == []


def test_append_publishes_each_shard_in_order(tmp_path):
    root = str(tmp_path / "live")
    w = ShardWriter(root, append=True, max_shard_samples=4)
    assert open_index(root).num_samples == 0  # a live dataset exists before its first shard
    seen = []
    for i in range(10):
        w.write(labelled_sample(i))
        idx = open_index(root)
        seen.append(idx.num_samples)
    w.close()
    assert seen == [0, 0, 0, 4, 4, 4, 4, 8, 8, 8]  # each shard visible once finished, never partly
    idx = open_index(root)
    assert idx.counts.tolist() == [4, 4, 2]
    assert [seq for seq, _ in read_log(root)] == [1, 2, 3]
    keys = [s["__key__"] for i in range(len(idx)) for s in open_shard(idx, i)]
    assert keys == [f"{i:08d}" for i in range(10)]
    assert not os.path.exists(os.path.join(root, INDEX_NAME))  # append never rewrites the index


def test_append_after_plain_write_then_compact(make_dataset):
    root = make_dataset(n=10, shard_samples=5)
    with ShardWriter(root, append=True, max_shard_samples=3) as w:
        for i in range(10, 17):
            w.write(labelled_sample(i))
    before = open_index(root)
    assert before.counts.tolist() == [5, 5, 3, 3, 1]
    compacted = compact(root)
    after = open_index(root)
    assert after.names == before.names == compacted.names
    assert after.meta["log_seq"] == 3
    # the log is folded in: reading the index alone already gives every shard
    assert open_index(root, follow_log=False).names == before.names
    # a shard published after compaction is still seen, after the compacted ones
    with ShardWriter(root, append=True) as w:
        w.write(labelled_sample(17))
    final = open_index(root)
    assert final.counts.tolist() == [5, 5, 3, 3, 1, 1]
    assert [seq for seq, _ in read_log(root, after=final.meta["log_seq"] - 1)] == [4]
    keys = [s["__key__"] for i in range(len(final)) for s in open_shard(final, i)]
    assert keys == [f"{i:08d}" for i in range(18)]


def test_writing_over_an_existing_dataset_needs_append(make_dataset):
    from shardfeed.formats import ShardError
    root = make_dataset(n=3)
    with pytest.raises(ShardError, match="append=True"):
        ShardWriter(root)


def test_pickle_fields_stay_bytes_unless_named(tmp_path):
    root = str(tmp_path / "ds")
    payload = pickle.dumps({"x": 1})
    with ShardWriter(root) as w:
        w.write({"__key__": "a", "pkl": payload, "pyd": payload})
    with open_shard(open_index(root), 0) as r:
        s = r.read(0)
    assert decode_field("pkl", s["pkl"]) == payload  # not unpickled
    assert decode_field("pyd", s["pyd"]) == payload
    assert decode_field("pkl", s["pkl"], unsafe=("pkl",)) == {"x": 1}


def test_path_like_keys_are_rejected_at_write_time(tmp_path):
    with ShardWriter(str(tmp_path / "ds")) as w:
        for bad in ["../x", "/abs", "a/../b", "a//b", "a\\b", "", "x.y"]:
            with pytest.raises(ValueError):
                w.write({"__key__": bad, "txt": "t"})
        w.write({"__key__": "ok", "txt": "t"})
    assert open_index(str(tmp_path / "ds")).num_samples == 1
