"""Large payloads: views cut in one call are the values themselves (no copy),
and the copied form reuses the memory freed by the previous batch instead of
faulting in fresh pages every batch (loader/heap.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardWriter, open_index
from shardfeed.formats.engine.batch import BatchReader
from shardfeed.loader.views import tensor_views

GLIBC = platform.libc_ver()[0] == "glibc"


def _views_match(buf, starts, sizes):
    got = tensor_views(buf, starts, sizes)
    assert len(got) == len(starts)
    for v, a, z in zip(got, starts.tolist(), sizes.tolist()):
        if z < 0:
            assert v is None
            continue
        assert bytes(v.numpy()) == buf[a:a + z].tobytes()
        if z:  # a view of the buffer itself, not a copy
            assert v.data_ptr() == buf.ctypes.data + a


def test_views_of_a_gathered_batch_are_its_values_in_place(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=7) as w:  # several shards per batch, some payloads empty
        for i in range(40):
            w.write(labelled_sample(i, payload_bytes=(i * 331) % 2000))
    reader = BatchReader(open_index(root))
    try:
        raw = reader.read(np.arange(40)[::-1])
    finally:
        reader.close()
    _, starts, sizes = raw.fields["bin"]
    assert (sizes == 0).any() and (np.diff(starts) > sizes[:-1]).all()  # gaps between values: tar headers, cls
    _views_match(raw.buf, starts, sizes)
    # values not in buffer order, one absent, a single one, none: the per-value path
    _views_match(raw.buf, starts[::-1].copy(), sizes[::-1].copy())
    absent = sizes.copy()
    absent[3] = -1
    _views_match(raw.buf, starts, absent)
    _views_match(raw.buf, starts[5:6], sizes[5:6])
    assert tensor_views(raw.buf, starts[:0], sizes[:0]) == []


_FAULTS = textwrap.dedent("""
    import json, resource, sys
    from shardfeed.loader import Loader, ShardDataset
    from shardfeed.loader import heap
    if sys.argv[3] == "off":
        heap.reserve = lambda nbytes: None
    ld = Loader(ShardDataset(sys.argv[1], shuffle="none"), batch_size=64, num_workers=int(sys.argv[2]))
    for batch in ld:  # the first epoch grows the heap to two batches
        pass
    del batch
    faults, batches = [], 0
    for batch in ld:  # each batch held until the next is made, as a training loop does
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert len(batch["bin"]) == 64 and all(len(b) == 65536 for b in batch["bin"])
        batches += 1
        if batches > 1:
            faults.append(before - last)
        last = before
    ld.close()
    print(json.dumps(faults))
""")


def _faults_per_batch(root, workers, reserve="on", read_ahead="1"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    env["SHARDFEED_READ_AHEAD"] = read_ahead  # its two buffers change the heap's reuse (the control below)
    out = subprocess.run([sys.executable, "-c", _FAULTS, root, str(workers), reserve], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def wide_dataset(tmp_path_factory):
    """384 samples of 64 KiB: batches of 64 are 4 MiB of bytes objects (1,024 pages)."""
    root = str(tmp_path_factory.mktemp("wide") / "ds")
    with ShardWriter(root, max_shard_samples=64) as w:
        for i in range(384):
            w.write({"__key__": f"{i:06d}", "cls": i % 10, "bin": np.full(65536, i % 251, np.uint8).tobytes()})
    return root


@pytest.mark.skipif(not GLIBC, reason="the heap thresholds are glibc's (mallopt)")
@pytest.mark.parametrize("workers, read_ahead", [(0, "1"), (0, "0"), (2, "1")])
def test_copied_batches_reuse_the_memory_the_previous_batch_freed(wide_dataset, workers, read_ahead):
    """Regression: glibc returned each dropped batch's 4 MiB of bytes objects to the kernel
    (trim threshold 128 KiB), so every batch faulted its memory in again (~1,000 faults here,
    3,583 per 256 x 100 KiB batch, ~7 ms of a ~17 ms batch on the dev VM)."""
    faults = _faults_per_batch(wide_dataset, workers, read_ahead=read_ahead)
    assert len(faults) == 5
    # a batch is 1,024 pages of payload. One batch of five may fault them in once: on a loaded machine the
    # read-ahead's pace moved one batch between the thread and the loop (another malloc arena; 1,024 once
    # in a full suite beside a busy core); the regression faulted every batch in again
    assert sorted(faults)[-2] < 200, faults


@pytest.mark.skipif(not GLIBC, reason="the heap thresholds are glibc's (mallopt)")
def test_without_reserve_each_batch_faults_its_memory_in_again(wide_dataset):
    """The check above can fail: with heap.reserve switched off, the same loop faults
    a batch's pages in again every other batch (the freed top of the heap is trimmed). Without the
    read-ahead's two buffers: with them the heap happened to be reused here even without the reserve."""
    assert sum(_faults_per_batch(wide_dataset, 0, reserve="off", read_ahead="0")) > 2 * 1024


def test_a_process_that_set_its_own_malloc_threshold_is_left_alone(tmp_path):
    code = ("from shardfeed.loader import heap; heap.reserve(100 << 20); "
            "print(heap._mallopt is False, heap._trim > 1 << 40)")
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="1048576")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
