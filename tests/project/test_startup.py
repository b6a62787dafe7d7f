"""What a fresh process pays before its first batch: no pandas, no pyarrow.compute,
and the pandas-free paths agree with pyarrow's own."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardError, ShardWriter
from shardfeed.formats.own_tables import _FEW_NAMES, check_shard_names
from shardfeed.formats.sidecar import as_numpy, decode_dictionary

FIRST_BATCH = """
import json, sys
from shardfeed.loader import Loader, ShardDataset
with Loader(ShardDataset({root!r}, shuffle="global"), 8) as loader:
    keys = next(iter(loader))["__key__"]
print(json.dumps({{"keys": len(keys), "modules": [m for m in ("pandas", "pyarrow.compute") if m in sys.modules]}}))
"""


@pytest.mark.parametrize("fmt", ["tar", "parquet", "arrow"])
def test_a_first_batch_imports_neither_pandas_nor_pyarrow_compute(tmp_path, fmt):
    root = str(tmp_path / "ds")
    with ShardWriter(root, format=fmt, max_shard_samples=10) as w:
        for i in range(30):
            w.write(labelled_sample(i))
    out = subprocess.run([sys.executable, "-c", FIRST_BATCH.format(root=root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got == {"keys": 8, "modules": []}


@pytest.mark.parametrize("arr", [
    pa.array([1, 2, 3], pa.int64()).slice(1), pa.array([1.5, -2.0], pa.float32()), pa.array([], pa.uint64()),
    pa.array([2**64 - 1], pa.uint64()), pa.array([-3, 4], pa.int16()), pa.array([[1, 2], [3]]).offsets,
    pa.array([[1, 2], [3], [4, 5, 6]]).slice(1).offsets, pa.chunked_array([pa.array([7], pa.int32())]),
    pa.chunked_array([pa.array([1], pa.int8()), pa.array([2, 3], pa.int8())]),
    pa.array([0.25, 1e300], pa.float64()), pa.array([1, None], pa.int64()).fill_null(0),
])
def test_as_numpy_is_to_numpy(arr):
    got, want = as_numpy(arr), arr.to_numpy()
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert got.flags.writeable == want.flags.writeable


@pytest.mark.parametrize("arr", [
    pa.array(["x", "yy", "x", ""]).dictionary_encode(), pa.array(["x", "yy", "x", ""]).dictionary_encode().slice(1, 2),
    pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int8()), pa.array(["ab", "c"])),
    pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array(["ab"])),
    pa.DictionaryArray.from_arrays(pa.array([1, 0], pa.int32()), pa.array(["q", "ab", "c"]).slice(1)),
    pa.array([b"x", b"yz"]).dictionary_encode(), pa.array(["a", None]).dictionary_encode(),
    pa.array([1, 5, 1]).dictionary_encode(),
])
def test_decode_dictionary_is_dictionary_decode(arr):
    got = decode_dictionary(arr)
    got.validate(full=True)
    assert got.type == arr.type.value_type and got.equals(arr.dictionary_decode())


NAMES = ["a.tar", "d/a.tar", "", "/a", "a/", "a//b", "./a", "../a", "a/..", "a/.", "a/./b", ".", "..", "a\\b",
         "a\x00b", "..a.tar", "a..tar", ".h.tar", "a/.b/c", "a/\n", "a\n", "\n/a", "a/..\n", "x/\n/y"]


@pytest.mark.parametrize("name", NAMES)
def test_few_and_many_shard_names_are_checked_alike(name):
    """Few names are checked in Python (no pyarrow.compute at start-up), many in Arrow: same verdicts."""
    def verdict(n):
        names = pa.array(["ok.tar"] * (n - 1) + [name])
        try:
            check_shard_names(names, "w")
            return True
        except ShardError:
            return False

    assert verdict(2) == verdict(_FEW_NAMES + 1)


def test_the_python_name_check_refuses_what_it_should():
    bad = [n for n in NAMES if not _accepts(n)]
    assert bad == ["", "/a", "a/", "a//b", "./a", "../a", "a/..", "a/.", "a/./b", ".", "..", "a\\b", "a\x00b"]
    assert np.all([_accepts(n) for n in ("a/\n", "a\n", "\n/a")])  # RE2's $ is the end, newline or not


def _accepts(name):
    try:
        check_shard_names(pa.array([name]), "w")
        return True
    except ShardError:
        return False


START_UP_GC = """
import gc, json, sys
import torch
{disable}
full, seen = [], []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "start" and info["generation"] == 2 else None)

def churn(sample):  # a first batch that allocates as much as torch's next full pass is away (and more)
    seen.append(gc.isenabled())
    [[i] for i in range(20000)]
    return sample

from shardfeed.loader import Loader, ShardDataset
loader = Loader(ShardDataset({root!r}, shuffle="global", transform=churn), 8)
it = iter(loader)
next(it)
start_up = len(full)
for _ in it:
    pass
print(json.dumps({{"full_in_start_up": start_up, "enabled": gc.isenabled(), "seen": seen}}))
"""


@pytest.mark.parametrize("disabled", [False, True])
def test_start_up_runs_no_full_collection_and_leaves_the_collector_as_it_was(tmp_path, disabled):
    """Import, dataset and first batch run with the collector paused (formats/base/lazy.py): torch's due full
    pass stays out of them, and the collector comes back as the program had it."""
    root = str(tmp_path / "ds")
    with ShardWriter(root, format="tar", max_shard_samples=10) as w:
        for i in range(24):
            w.write(labelled_sample(i))
    code = START_UP_GC.format(root=root, disable="gc.disable()" if disabled else "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["full_in_start_up"] == 0
    assert got["enabled"] is not disabled
    assert got["seen"] == [False] * 8 + [not disabled] * 16  # paused for the first batch only
