"""Sample keys kept as the sidecar's UTF-8 blob (formats/key_blob.py): the same
keys as a list of str everywhere they are read, and a key the gather cannot
carry (a NUL byte) still refused when the shard opens."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from shardfeed.formats import ShardError, ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.formats.engine.open_shards import OpenShards
from shardfeed.formats.key_blob import Keys, key_blob
from shardfeed.formats.own_tables import read_sidecar
from shardfeed.formats.readers import open_shard
from shardfeed.formats.sidecar import SIDECAR_SUFFIX, write_sidecar
from shardfeed.loader import Loader, ShardDataset

KEYS = [f"{i:03d}-{'é' * (i % 3)}{'日本' if i % 4 == 1 else ''}" for i in range(23)]


def _write(root: str, keys=KEYS, shard_samples: int = 10) -> str:
    with ShardWriter(root, format="tar", max_shard_samples=shard_samples) as w:
        for i, k in enumerate(keys):
            w.write({"__key__": k, "cls": i, "bin": bytes([i]) * (i + 1)})
    return root


def test_sidecar_keys_are_the_written_keys_as_a_blob(tmp_path):
    idx = open_index(_write(str(tmp_path / "ds")))
    got = []
    for s in range(len(idx)):
        r = open_shard(idx, s)
        keys = r.table.keys
        assert isinstance(keys, Keys)  # no list of str made at open
        expect = KEYS[10 * s:10 * s + len(keys)]
        assert len(keys) == len(expect) and keys == expect and expect == keys and not (keys != expect)
        assert [keys[i] for i in range(len(keys))] == expect and keys[-1] == expect[-1]
        assert keys[1:3] == expect[1:3] and list(keys) == expect and keys.tolist() == expect
        with pytest.raises(IndexError):
            keys[len(keys)]
        data, off = key_blob(keys)
        assert data.tobytes() == "".join(expect).encode() and off.tolist() == [0, *np.cumsum(
            [len(k.encode()) for k in expect]).tolist()]
        assert key_blob(expect)[0].tobytes() == data.tobytes() and key_blob(expect)[1].tolist() == off.tolist()
        got += list(keys)
        r.close()
    assert got == KEYS


def test_batches_carry_the_keys_in_every_read_order(tmp_path):
    root = _write(str(tmp_path / "ds"))
    reader = BatchReader(open_index(root))
    ids = np.array([22, 0, 13, 13, 5, 21], np.int64)
    batch = reader.read(ids)
    assert batch.keys == [KEYS[i] for i in ids]
    assert reader.read(ids[::-1]).keys == [KEYS[i] for i in ids[::-1]]  # the steady path (shards open now)
    for shuffle in ("none", "global"):
        seen = [k for b in Loader(ShardDataset(root, shuffle=shuffle, seed=3), batch_size=4) for k in b["__key__"]]
        assert sorted(seen) == sorted(KEYS) and (shuffle != "none" or seen == KEYS)
    reader.close()


def test_a_sidecar_key_holding_a_nul_byte_is_refused_at_open(tmp_path):
    root = _write(str(tmp_path / "ds"), shard_samples=100)
    shard = sorted(glob.glob(os.path.join(root, "*.tar")))[0]
    table, meta = read_sidecar(shard + SIDECAR_SUFFIX, shard)
    forged = table.keys.tolist()
    forged[4] = "004\0x"
    table.keys = forged
    write_sidecar(shard + SIDECAR_SUFFIX, table, meta["shard_bytes"], meta["shard_hash"])  # a valid digest
    t = OpenShards(open_index(root))
    with pytest.raises(ShardError, match="NUL byte"):
        t.get(0)
    t.close()


def test_keys_of_a_sliced_arrow_column_start_at_the_slice():
    import pyarrow as pa

    keys = Keys.from_arrow(pa.array(KEYS, pa.string()).slice(3, 7))
    assert keys == KEYS[3:10] and key_blob(keys)[0].tobytes() == "".join(KEYS[3:10]).encode()
    assert Keys.from_arrow(pa.array([], pa.string())) == [] and len(Keys.from_arrow(pa.array([""] * 2))) == 2
