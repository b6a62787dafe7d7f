"""Property tests for the parsers of untrusted bytes: a tar shard (with and
without its sidecar), a sidecar and index.arrow, after random byte flips and
truncations, give either the right data or ShardError: never another
exception, a hang or a huge allocation."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import labelled_sample
from shardfeed.formats import ShardError, ShardWriter, open_index, open_shard
from shardfeed.formats.readers import TarShardReader

pytestmark = pytest.mark.hostile  # bounded time and memory (conftest.py)

N = 12
FUZZ = settings(max_examples=int(os.environ.get("SHARDFEED_FUZZ_EXAMPLES", 60)), deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz") / "ds"
    with ShardWriter(str(root), max_shard_samples=N) as w:
        for i in range(N):
            w.write(labelled_sample(i, payload_bytes=300))
    idx = open_index(str(root))
    with open_shard(idx, 0) as r:
        expected = list(r)
    foreign = root.parent / "foreign.tar"
    with tarfile.open(foreign, "w", format=tarfile.GNU_FORMAT) as tf:
        for s in expected:
            for ext in ("cls", "txt", "bin"):
                info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                info.size = len(s[ext])
                tf.addfile(info, io.BytesIO(s[ext]))
    return {"root": str(root), "shard": os.path.basename(idx.path(0)), "expected": expected,
            "foreign": str(foreign)}


def _damage(data: bytes, flips, cut) -> bytes:
    raw = bytearray(data)
    for pos, bit in flips:
        raw[pos % len(raw)] ^= 1 << bit
    if cut is not None:
        raw = raw[: cut % (len(raw) + 1)]
    return bytes(raw)


def _rewrite(path: str, d) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(_damage(data, *d))


damage = st.tuples(st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 7)), max_size=4),
                   st.one_of(st.none(), st.integers(0, 1 << 30)))


def _copy(pristine, tmp_path):
    dst = tmp_path / "ds"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(pristine["root"], dst)
    return str(dst)


def _read_all(root: str):
    idx = open_index(root)
    with open_shard(idx, 0) as r:
        return list(r)




def _check(fn, expected):
    try:
        got = fn()
    except ShardError:
        return
    assert got == expected


@FUZZ
@given(d=damage)
def test_damaged_tar_with_sidecar_gives_right_data_or_shard_error(pristine, tmp_path, d):
    root = _copy(pristine, tmp_path)
    path = os.path.join(root, pristine["shard"])
    _rewrite(path, d)
    _check(lambda: _read_all(root), pristine["expected"])
    # opened directly, without the index's size check, only the sidecar guards it
    _check(lambda: list(TarShardReader(path)), pristine["expected"])


@FUZZ
@given(d=damage)
def test_damaged_foreign_tar_parses_or_raises_shard_error(pristine, tmp_path, d):
    """Without an index there is nothing to check payloads against, so damaged
    payloads may come back; but the parser never fails in any other way and
    every member it returns lies inside the file."""
    path = str(tmp_path / "f.tar")
    data = _damage(open(pristine["foreign"], "rb").read(), *d)
    open(path, "wb").write(data)
    try:
        samples = _read_all(path)
    except ShardError:
        return
    assert all(isinstance(s["__key__"], str) for s in samples)
    assert sum(len(v) for s in samples for k, v in s.items() if k != "__key__") <= len(data)
    if data == open(pristine["foreign"], "rb").read():
        assert samples == pristine["expected"]


@FUZZ
@given(d=damage)
def test_damaged_sidecar_gives_right_data_or_shard_error(pristine, tmp_path, d):
    root = _copy(pristine, tmp_path)
    side = os.path.join(root, pristine["shard"] + ".idx")
    _rewrite(side, d)
    _check(lambda: _read_all(root), pristine["expected"])


@FUZZ
@given(d=damage)
def test_damaged_index_gives_right_index_or_shard_error(pristine, tmp_path, d):
    root = _copy(pristine, tmp_path)
    good = open_index(root)
    path = os.path.join(root, "index.arrow")
    _rewrite(path, d)
    try:
        idx = open_index(root)
    except ShardError:
        return
    assert (idx.names, idx.formats, idx.counts.tolist(), idx.sizes.tolist(), idx.hashes) == \
        (good.names, good.formats, good.counts.tolist(), good.sizes.tolist(), good.hashes)
    _check(lambda: _read_all(root), pristine["expected"])


# -- columnar footers, commit log entries, compressed frames (issue 12) ----
FUZZ_FEW = settings(FUZZ, max_examples=int(os.environ.get("SHARDFEED_FUZZ_EXAMPLES", 25)))


@pytest.fixture(scope="module")
def columnar(tmp_path_factory):
    out = {}
    for fmt in ("arrow", "parquet"):
        root = tmp_path_factory.mktemp("fuzz-" + fmt) / "ds"
        with ShardWriter(str(root), format=fmt, max_shard_samples=N) as w:
            for i in range(N):
                w.write(labelled_sample(i, payload_bytes=100))
        idx = open_index(str(root))
        with open_shard(idx, 0) as r:
            out[fmt] = (str(root), os.path.basename(idx.path(0)), list(r))
    return out


def _tail_damage():  # footers sit at the end: aim flips at the last 1 KiB as often as anywhere
    near_end = st.tuples(st.integers(-1024, -1), st.integers(0, 7))
    return st.tuples(st.lists(st.one_of(near_end, st.tuples(st.integers(0, 1 << 30), st.integers(0, 7))),
                              min_size=1, max_size=3), st.none())


@FUZZ_FEW
@given(fmt=st.sampled_from(["arrow", "parquet"]), d=_tail_damage())
def test_damaged_columnar_shard_gives_right_rows_or_shard_error(columnar, tmp_path, fmt, d):
    """Single-bit flips in a Parquet or Arrow footer once raised KeyError and
    TypeError, or silently changed values (Arrow)."""
    src, name, expected = columnar[fmt]
    root = str(tmp_path / "ds")
    if os.path.exists(root):
        shutil.rmtree(root)
    shutil.copytree(src, root)
    _rewrite(os.path.join(root, name), d)
    from shardfeed.formats.readers import ColumnarShardReader
    _check(lambda: list(ColumnarShardReader(os.path.join(root, name), fmt)), expected)


@FUZZ_FEW
@given(entry=st.one_of(st.binary(max_size=200), st.dictionaries(
    st.sampled_from(["name", "format", "samples", "bytes", "hash", "kind"]),
    st.one_of(st.integers(-(1 << 70), 1 << 70), st.text(max_size=20), st.none(), st.floats()), max_size=6)))
def test_commit_log_entry_parses_or_raises_shard_error(tmp_path, entry):
    root = tmp_path / "live"
    log = root / "_log"
    log.mkdir(parents=True, exist_ok=True)
    data = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
    (log / "000000000001.json").write_bytes(data)
    try:
        idx = open_index(str(root))
    except ShardError:
        return
    assert idx.num_samples >= 0


@FUZZ_FEW
@given(kind=st.sampled_from(["zst", "gz"]), d=damage)
def test_damaged_compressed_frames_parse_or_raise_shard_error(pristine, tmp_path, kind, d):
    import gzip

    import zstandard
    raw = open(pristine["foreign"], "rb").read()
    packed = zstandard.ZstdCompressor(write_checksum=True).compress(raw) if kind == "zst" else gzip.compress(raw)
    path = tmp_path / f"f.tar.{kind}"
    path.write_bytes(_damage(packed, *d))
    try:
        samples = _read_all(str(path))
    except ShardError:
        return
    assert all(isinstance(s["__key__"], str) for s in samples)


@FUZZ_FEW
@given(ext=st.sampled_from(["cls", "txt", "json", "npy", "png", "jpg", "bin"]), data=st.binary(max_size=300))
def test_field_decoders_decode_or_raise_cleanly(ext, data):
    """A field decoder given any bytes returns a value or raises one of the
    errors the loader's skip policy counts (never hangs or allocates wildly)."""
    from shardfeed.formats import decode_field
    try:
        decode_field(ext, data)
    except (ShardError, ValueError, UnicodeDecodeError, OSError, SyntaxError):
        pass
