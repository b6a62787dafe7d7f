"""Fields as WebDataset decodes them: ``KEY.EXT.gz`` members are gunzipped
(bounded) and decoded by EXT, under the full extension as the field name;
decoded arrays are writable."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from shardfeed.formats import ShardError, ShardWriter, codecs, decode_field, encode_field, open_index, open_shard
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.random_access import SampleLookup

TESTGZ = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-testdata", "testgz.tar")


def _python_reads_testgz() -> dict[str, str]:
    """key -> text, as Python's tarfile and gzip read WebDataset's shard."""
    out = {}
    with tarfile.open(TESTGZ) as tf:
        for m in tf.getmembers():
            if m.isfile():
                key, ext = m.name.split(".", 1)
                assert ext == "txt.gz"
                out[key] = gzip.decompress(tf.extractfile(m).read()).decode("utf-8")
    return out


def test_webdataset_testgz_decodes_to_what_python_gzip_reads():
    want = _python_reads_testgz()
    assert len(want) == 1000
    idx = open_index(TESTGZ)
    got = {}
    with open_shard(idx, 0) as r:
        for i in range(len(r)):
            s = r.read(i)
            assert set(s) == {"__key__", "txt.gz"}  # the field keeps WebDataset's name
            got[s["__key__"]] = decode_field("txt.gz", s["txt.gz"])
    assert got == want


def test_webdataset_testgz_through_the_loader_and_a_torch_dataloader():
    want = _python_reads_testgz()
    ds = ShardDataset(TESTGZ, shuffle="none")
    got = {}
    for batch in Loader(ds, batch_size=128):  # the batch path: columns, no sample dicts
        got.update(zip(batch["__key__"], batch["txt.gz"]))
    assert got == want
    got = {}
    for batch in torch.utils.data.DataLoader(ds, batch_size=100):  # sample dicts, torch's collate
        got.update(zip(batch["__key__"], batch["txt.gz"]))
    assert got == want


def _gz_sample(i: int) -> dict:
    return {"__key__": f"{i:06d}", "json.gz": {"i": i, "tags": ["a", str(i)]},
            "npy.gz": np.arange(i, i + 12, dtype=np.float32).reshape(3, 4),
            "txt.gz": f"text {i} \u00e9", "cls.gz": i % 7,
            "bin.gz": gzip.compress(bytes([i % 256]) * 5)}  # bytes: stored as given (already gzipped)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_json_npy_txt_cls_gz_written_and_read_back(tmp_path, fmt):
    root = str(tmp_path / "ds")
    with ShardWriter(root, format=fmt, max_shard_samples=8) as w:
        for i in range(20):
            w.write(_gz_sample(i))
    with open_shard(open_index(root), 0) as r:
        raw = r.read(1)
    assert gzip.decompress(raw["json.gz"]) == b'{"i":1,"tags":["a","1"]}'  # really gzipped on disk
    lookup = SampleLookup(open_index(root))
    for i in range(20):
        s = lookup[i]
        assert s["json.gz"] == {"i": i, "tags": ["a", str(i)]}
        np.testing.assert_array_equal(s["npy.gz"], np.arange(i, i + 12, dtype=np.float32).reshape(3, 4))
        assert s["npy.gz"].dtype == np.float32 and s["npy.gz"].flags.writeable
        assert s["txt.gz"] == f"text {i} \u00e9" and s["cls.gz"] == i % 7
        assert s["bin.gz"] == bytes([i % 256]) * 5  # no codec inside: the decompressed bytes
    batch = next(iter(Loader(ShardDataset(root, shuffle="none"), batch_size=20)))
    assert batch["npy.gz"].shape == (20, 3, 4) and batch["cls.gz"].tolist() == [i % 7 for i in range(20)]
    assert batch["json.gz"][5] == {"i": 5, "tags": ["a", "5"]}


def test_decode_false_keeps_the_compressed_bytes(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root) as w:
        w.write(_gz_sample(3))
    s = SampleLookup(open_index(root), decode=False)[0]
    assert json.loads(gzip.decompress(s["json.gz"])) == {"i": 3, "tags": ["a", "3"]}


def _bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (~1000x smaller), made without holding them."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1 << 20)
    parts = [c.compress(chunk) for _ in range(inflated >> 20)]
    parts.append(c.compress(b"\0" * (inflated & ((1 << 20) - 1))))
    parts.append(c.flush())
    return b"".join(parts)


def _write_bomb(root: str, inflated: int) -> None:
    with ShardWriter(root) as w:
        w.write({"__key__": "fine", "txt.gz": "ok"})
        w.write({"__key__": "bomb", "txt.gz": _bomb(inflated)})


def test_a_gzip_bomb_is_refused_at_the_default_limit(tmp_path):
    """300 MiB of zeros in ~300 KiB: refused once 256 MiB are out, naming shard, key and limit."""
    root = str(tmp_path / "ds")
    _write_bomb(root, 300 << 20)
    idx = open_index(root)
    assert idx.sizes.sum() < 1 << 20
    lookup = SampleLookup(idx)
    assert lookup.get("fine")["txt.gz"] == "ok"
    with pytest.raises(ShardError) as e:
        lookup.get("bomb")
    assert e.value.shard == idx.path(0)
    assert "'bomb'" in e.value.reason and str(codecs.MAX_FIELD_BYTES) in e.value.reason
    assert "SHARDFEED_MAX_FIELD_BYTES" in e.value.reason


def test_a_gzip_bomb_is_refused_on_every_read_path(tmp_path, monkeypatch):
    monkeypatch.setattr(codecs, "MAX_FIELD_BYTES", 1 << 20)
    root = str(tmp_path / "ds")
    _write_bomb(root, 2 << 20)
    paths = [lambda: list(ShardDataset(root, shuffle="none")),  # sample dicts
             lambda: list(Loader(ShardDataset(root, shuffle="none"), batch_size=2))]  # columns
    for read in paths:
        with pytest.raises(ShardError, match=r"sample 'bomb'.*more than 1048576 bytes"):
            read()
    batches = list(Loader(ShardDataset(root, shuffle="none", on_error="skip"), batch_size=2))
    assert [b["__key__"] for b in batches] == [["fine"]]
    assert SampleLookup(open_index(root), on_error="skip").get("bomb") is None


def test_the_field_limit_comes_from_the_environment(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root) as w:
        w.write({"__key__": "k", "txt.gz": "x" * 5000})
    code = ("import sys; from shardfeed.formats import ShardError, open_index\n"
            "from shardfeed.loader.random_access import SampleLookup\n"
            "try: SampleLookup(open_index(sys.argv[1]))[0]\n"
            "except ShardError as e: print(e.reason)\n")
    env = dict(os.environ, SHARDFEED_MAX_FIELD_BYTES="4096")
    out = subprocess.run([sys.executable, "-c", code, root], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "more than 4096 bytes" in out


@pytest.mark.parametrize("payload, why", [
    (gzip.compress(b"some text", mtime=0)[:-4], "truncated"),
    (b"not gzip at all", "corrupt"),
])
def test_a_damaged_gzip_field_raises_naming_the_sample(tmp_path, payload, why):
    root = str(tmp_path / "ds")
    with ShardWriter(root) as w:
        w.write({"__key__": "k1", "txt.gz": payload})
    with pytest.raises(ShardError, match=f"sample 'k1'.*{why}"):
        SampleLookup(open_index(root))[0]


def test_gzip_members_concatenated_and_nul_padding_read_as_gzip_does():
    data = gzip.compress(b"ab") + gzip.compress(b"cd") + b"\0" * 7
    assert decode_field("txt.gz", data) == gzip.decompress(gzip.compress(b"ab") + gzip.compress(b"cd")).decode()


def test_pickle_inside_gz_is_decoded_only_when_named():
    import pickle

    data = gzip.compress(pickle.dumps({"x": 1}))
    assert encode_field("pyd.gz", data) == data  # bytes are stored as given (already gzipped)
    assert decode_field("pyd.gz", data) == pickle.dumps({"x": 1})  # inflated, not unpickled
    assert decode_field("pyd.gz", data, unsafe=("pyd.gz",)) == {"x": 1}
    assert decode_field("pyd.gz", data, unsafe=("pyd",)) == {"x": 1}


def test_npy_header_claiming_more_than_the_payload_is_refused_before_allocating():
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    with pytest.raises(ValueError, match="claims 8000000000000 bytes"):
        decode_field("npy", head.getvalue() + b"\0" * 8)


@pytest.mark.parametrize("arr", [np.arange(12, dtype=np.int16).reshape(3, 4),
                                 np.asfortranarray(np.arange(12.0).reshape(3, 4)), np.zeros((0, 2)),
                                 np.array(5, np.uint8), np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")])])
def test_decoded_npy_is_a_writable_copy_equal_to_the_original(arr):
    buf = bytearray(encode_field("npy", arr))
    got = decode_field("npy", memoryview(buf))
    assert got.dtype == arr.dtype and got.shape == arr.shape and got.flags.writeable
    np.testing.assert_array_equal(got, arr)
    buf[-1] ^= 0xFF  # the reader's buffer is reused: the array must not change with it
    np.testing.assert_array_equal(got, arr)


def _png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), i, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_decoded_arrays_are_writable_and_torch_does_not_warn(tmp_path):
    """Regression: images came back read-only from pillow's bytes, and a plain
    torch DataLoader warned "The given NumPy array is not writable" per batch."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=10) as w:
        for i in range(20):
            w.write({"__key__": f"{i:04d}", "npy": np.full((2, 3), i, np.float32), "png": _png(i),
                     "npy.gz": np.arange(4) + i, "cls": i})
    ds = ShardDataset(root, shuffle="none")
    sample = next(iter(ds))
    assert all(sample[f].flags.writeable for f in ("npy", "png", "npy.gz"))
    lookup = SampleLookup(open_index(root))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        n = 0
        for batch in torch.utils.data.DataLoader(ds, batch_size=4):
            assert batch["png"].shape == (4, 4, 5, 3) and batch["npy.gz"].shape == (4, 4)
            n += 4
        for batch in torch.utils.data.DataLoader(lookup, batch_size=4, shuffle=True):  # map-style
            assert batch["npy"].shape == (4, 2, 3)
            torch.testing.assert_close(batch["npy"][:, 0, 0], batch["cls"].float())
    assert n == 20
