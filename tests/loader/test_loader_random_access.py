"""Random access: ``lookup[i]`` over the whole dataset in stored order and
``lookup.get(key)``, through the index and sidecars, checksums included."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard
from shardfeed.loader.random_access import SampleLookup

FORMATS = ["tar", "parquet", "arrow"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_index_and_every_key_gives_its_sample(make_dataset, fmt):
    n = 103  # shards of 25, 25, 25, 25, 3
    lookup = SampleLookup(open_index(make_dataset(n, shard_samples=25, format=fmt)))
    assert len(lookup) == n
    for i in range(n):
        assert lookup[i] == labelled_sample(i)
        assert lookup[np.int64(i)]["__key__"] == f"{i:08d}"
    for i in np.random.default_rng(0).permutation(n).tolist():  # keys in any order, shards reopened
        assert lookup.get(f"{i:08d}") == labelled_sample(i)
        assert lookup.index_of(f"{i:08d}") == i
    assert lookup._router.ordered  # ShardWriter keys are in stored order: the binary-search path


@pytest.mark.parametrize("fmt", FORMATS)
def test_negative_and_out_of_range_indices_behave_like_a_list(make_dataset, fmt):
    lookup = SampleLookup(open_index(make_dataset(30, shard_samples=7, format=fmt)))
    assert lookup[-1] == labelled_sample(29)
    assert lookup[-30] == labelled_sample(0)
    for bad in (30, -31, 10**12):
        with pytest.raises(IndexError, match=r"out of range .* of 30 samples \(valid: -30\.\.29\)"):
            lookup[bad]
    for bad in ("3", 1.0, True, None):
        with pytest.raises(TypeError, match="must be an int"):
            lookup[bad]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_missing_key_raises_key_error_naming_it(make_dataset, fmt):
    lookup = SampleLookup(open_index(make_dataset(30, shard_samples=7, format=fmt)))
    for missing in ("nope", "", "00000005x", "0000000", "99999999", "\uffff"):
        with pytest.raises(KeyError) as e:
            lookup.get(missing)
        assert f"no sample has key {missing!r}" in e.value.args[0]
        assert missing not in lookup
    assert "00000005" in lookup


def _write(root: str, keys: list[str], shard_samples: int, fmt: str = "tar") -> None:
    with ShardWriter(root, format=fmt, max_shard_samples=shard_samples) as w:
        for i, k in enumerate(keys):
            w.write(dict(labelled_sample(i), __key__=k))


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_keys_not_in_stored_order_are_found_through_the_hash_table(tmp_path, fmt):
    keys = [f"k{x:x}" for x in np.random.default_rng(1).permutation(200).tolist()]
    root = str(tmp_path / "ds")
    _write(root, keys, 30, fmt)
    lookup = SampleLookup(open_index(root))
    for i, k in enumerate(keys):
        assert lookup.get(k) == dict(labelled_sample(i), __key__=k)
    assert not lookup._router.ordered
    with pytest.raises(KeyError, match="'k-none'"):
        lookup.get("k-none")


@pytest.mark.parametrize("keys", [
    # a repeat spanning shard boundaries (shards of 2); never twice in a row inside one tar,
    # which the writer refuses since a tar reader would merge the two samples
    ["a", "b", "b", "c", "c", "d"],
    ["b", "a", "b", "c", "a", "d"],  # unordered, with repeats
])
def test_a_repeated_key_resolves_to_its_first_sample_in_stored_order(tmp_path, keys):
    root = str(tmp_path / "ds")
    _write(root, keys, 2)
    lookup = SampleLookup(open_index(root))
    for k in set(keys):
        assert lookup.index_of(k) == keys.index(k)
        assert lookup.get(k)["bin"] == labelled_sample(keys.index(k))["bin"]


def test_a_webdataset_tar_without_index_is_read_by_position_and_key():
    import tarfile

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-testdata", "testgz.tar")
    with tarfile.open(path) as tf:
        names = [m.name.split(".", 1)[0] for m in tf.getmembers() if m.isfile()]
    lookup = SampleLookup(open_index(path))
    assert len(lookup) == len(names) == 1000
    assert [lookup[i]["__key__"] for i in (0, 1, -1)] == [names[0], names[1], names[-1]]
    for i in (0, 17, 999):
        assert lookup.index_of(names[i]) == i  # uuid keys: not ordered, the hash table finds them


def _flip_payload(idx, shard: int, row: int) -> None:
    """Flip one byte of sample ``row``'s ``bin`` payload, found by its bytes."""
    path = idx.path(shard)
    with open_shard(idx, shard) as r:
        payload = r.read(row)["bin"]
    raw = bytearray(open(path, "rb").read())
    at = raw.find(payload)
    assert at >= 0 and raw.find(payload, at + 1) < 0
    raw[at + 5] ^= 0x10
    with open(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_a_flipped_payload_byte_raises_shard_error_on_access(make_dataset, fmt):
    """Arrow IPC has no per-sample or page checksum: its damage is found by
    the shard's content hash (verify_shard), not on access."""
    idx = open_index(make_dataset(40, shard_samples=20, format=fmt))
    _flip_payload(idx, 1, 3)
    lookup = SampleLookup(open_index(idx.root))
    assert lookup[19] == labelled_sample(19)  # another shard reads fine
    with pytest.raises(ShardError) as e:
        lookup[23]
    assert e.value.shard == idx.path(1)
    with pytest.raises(ShardError):
        lookup.get("00000023")
    skipping = SampleLookup(open_index(idx.root), on_error="skip")
    assert skipping[23] is None and skipping.skipped == 1
    assert skipping[0] == labelled_sample(0)


def test_decode_false_transform_and_pickling_for_dataloader_workers(make_dataset):
    idx = open_index(make_dataset(50, shard_samples=10))
    raw = SampleLookup(idx, decode=False)[7]
    assert raw["cls"] == b"7" and raw["txt"] == b"sample 7"
    lookup = SampleLookup(idx, transform=lambda s: (s["__key__"], s["cls"]))
    assert lookup[12] == ("00000012", 2)
    plain = SampleLookup(idx)
    plain.prepare_keys()
    plain[3]
    clone = pickle.loads(pickle.dumps(plain))  # open readers stay behind, the key routing travels
    assert clone._router is not None and not clone._readers
    assert clone.get("00000044") == labelled_sample(44)


def test_open_shards_are_bounded(make_dataset):
    lookup = SampleLookup(open_index(make_dataset(60, shard_samples=5)), max_open=3)
    for i in range(0, 60, 5):
        assert lookup[i]["__key__"] == f"{i:08d}"
        assert len(lookup._readers) <= 3
    lookup.close()
    lookup.close()
    assert lookup[59] == labelled_sample(59)  # reopens after close
    with pytest.raises(ValueError, match="max_open"):
        SampleLookup(lookup.index, max_open=0)


def test_shard_dataset_indexes_the_whole_dataset_and_finds_keys(make_dataset):
    from shardfeed.loader import ShardDataset

    root = make_dataset(60, shard_samples=25)
    ds = ShardDataset(root, rank=1, world_size=2)
    assert len(ds) == 30  # this rank's share of an epoch
    for i in (0, 24, 25, 59, -1):
        want = labelled_sample(i % 60)
        got = ds[i]
        assert got["__key__"] == want["__key__"] and got["bin"] == want["bin"] and got["cls"] == want["cls"]
    assert ds.get("00000042")["txt"] == "sample 42"
    with pytest.raises(KeyError, match="nope"):
        ds.get("nope")
    with pytest.raises(IndexError):
        ds[60]
