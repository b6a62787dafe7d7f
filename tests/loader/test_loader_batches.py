"""Batches: content, types, order independent of num_workers, transforms,
schedules, per-rank batch sizes, and ShardDataset inside a torch DataLoader."""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
import pytest
import torch

from conftest import labelled_sample
from loader_helpers import keys_of, rank_loaders, step_together
from shardfeed.formats import ShardWriter
from shardfeed.loader import BatchSchedule, Loader, ShardDataset, Stage


@pytest.mark.parametrize("fmt", ["tar", "parquet", "arrow"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_batches_hold_the_right_values(make_dataset, fmt, workers):
    root = make_dataset(90, shard_samples=25, format=fmt)
    with Loader(ShardDataset(root, seed=3), 16, num_workers=workers) as loader:
        seen = []
        for b in loader:
            assert isinstance(b["cls"], torch.Tensor) and b["cls"].dtype == torch.int64
            ids = [int(k) for k in b["__key__"]]
            assert b["cls"].tolist() == [labelled_sample(i)["cls"] for i in ids]
            assert b["txt"] == [labelled_sample(i)["txt"] for i in ids]
            assert b["bin"] == [labelled_sample(i)["bin"] for i in ids]
            seen += ids
    assert sorted(seen) == list(range(90))
    assert len(loader) == 6


@pytest.mark.parametrize("shuffle", ["none", "shard", "block", "global"])
def test_order_is_the_same_for_any_num_workers(make_dataset, shuffle):
    root = make_dataset(150, shard_samples=20)
    runs = []
    for workers in (0, 1, 2):
        with Loader(ShardDataset(root, shuffle=shuffle, seed=7), 13, num_workers=workers, prefetch=1) as loader:
            runs.append([keys_of(loader), keys_of(loader)])  # two epochs
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][0] != runs[0][1] or shuffle == "none"  # epochs differ
    assert sorted(runs[0][0]) == [f"{i:08d}" for i in range(150)]
    with Loader(ShardDataset(root, shuffle=shuffle, seed=8), 13) as other:
        assert keys_of(other) != runs[0][0] or shuffle == "none"


def test_decode_false_keeps_bytes(make_dataset):
    root = make_dataset(20, shard_samples=10)
    with Loader(ShardDataset(root, decode=False, shuffle="none"), 8) as loader:
        b = next(iter(loader))
    assert b["cls"] == [str(i % 10).encode() for i in range(8)]
    assert b["txt"] == [f"sample {i}".encode() for i in range(8)]


def _rich_dataset(root, n=24):
    from PIL import Image

    with ShardWriter(root, max_shard_samples=10) as w:
        for i in range(n):
            img = Image.fromarray(np.full((32, 32, 3), i, np.uint8))
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            w.write({"__key__": f"k{i:04d}", "npy": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
                     "json": {"i": i}, "png": buf.getvalue(), "raw.bin": b"x" * i})
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_by_field_type(tmp_path, workers):
    root = _rich_dataset(str(tmp_path / "rich"))
    with Loader(ShardDataset(root, shuffle="none"), 8, num_workers=workers) as loader:
        b = next(iter(loader))
    assert b["npy"].shape == (8, 2, 3) and b["npy"].dtype == torch.float32
    assert b["npy"][5, 0, 0].item() == 5.0
    assert b["json"] == [{"i": i} for i in range(8)]
    assert b["png"].shape == (8, 32, 32, 3) and b["png"][3, 0, 0, 0].item() == 3
    assert b["raw.bin"] == [b"x" * i for i in range(8)]


def test_transform_gets_the_stage_image_size_and_collate_fn(tmp_path):
    root = _rich_dataset(str(tmp_path / "rich"))
    sizes = []

    def transform(sample, image_size=None):
        sizes.append(image_size)
        return {"__key__": sample["__key__"], "img": sample["png"], "s": image_size}

    schedule = BatchSchedule([Stage(8, image_size=16), Stage(6, image_size=32)], cycle=True)
    with Loader(ShardDataset(root, shuffle="none", transform=transform), schedule) as loader:
        first = list(loader)
        second = list(loader)
        third = list(loader)
    assert [b["img"].shape[1] for b in first] == [16, 16, 16]  # decoded at the stage's size
    assert [len(b["__key__"]) for b in second] == [6, 6, 6, 6] and second[0]["img"].shape[1] == 32
    assert len(third) == 3 and third[0]["s"].tolist() == [16] * 8  # cyclic: back to stage one
    with Loader(ShardDataset(root, shuffle="none"), 5,
                collate_fn=lambda samples: {"n": len(samples), "keys": [s["__key__"] for s in samples]}) as loader:
        b = next(iter(loader))
    assert b == {"n": 5, "keys": [f"k{i:04d}" for i in range(5)]}


def test_per_rank_batch_sizes_cover_the_epoch_in_equal_steps(make_dataset):
    """Dual-batch training: rank 0 takes 12 per step, rank 1 takes 4; both take the
    same number of steps and together cover every sample once (plus < one step of padding)."""
    root = make_dataset(203, shard_samples=40)
    loaders = rank_loaders(root, 2, [12, 4])
    keys, steps = step_together(loaders)
    assert steps[0] == steps[1] == len(loaders[0]) == len(loaders[1])
    assert len(keys[0]) == 3 * len(keys[1])
    everything = keys[0] + keys[1]
    assert set(everything) == {f"{i:08d}" for i in range(203)}
    assert len(everything) - 203 < 16
    for L in loaders:
        L.close()


def test_batch_size_list_must_match_world_size(make_dataset):
    root = make_dataset(20, shard_samples=10)
    with pytest.raises(ValueError, match="world_size=2"):
        Loader(ShardDataset(root, rank=0, world_size=2), [4, 4, 4])


def test_shard_dataset_in_a_torch_dataloader_gives_each_sample_once(make_dataset):
    root = make_dataset(130, shard_samples=30)
    ds = ShardDataset(root, seed=1)
    for workers in (0, 2):
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        keys = [s["__key__"] for s in dl]
        assert sorted(keys) == [f"{i:08d}" for i in range(130)]
    assert len(ds) == 130
    ds2 = ShardDataset(root, rank=1, world_size=3)
    assert len(ds2) == 44 and len(list(ds2)) == 44


def test_rank_and_world_size_from_the_environment(make_dataset, monkeypatch):
    root = make_dataset(30, shard_samples=10)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    ds = ShardDataset(root)
    assert (ds.rank, ds.world_size, len(ds)) == (2, 3, 10)
    assert ShardDataset(root, rank=0, world_size=1).world_size == 1


def test_bad_arguments_are_refused_clearly(make_dataset):
    root = make_dataset(10, shard_samples=10)
    with pytest.raises(ValueError, match="cache_limit_bytes"):
        ShardDataset(root, cache_dir=os.path.join(root, "c"), cache_limit_bytes=-1)
    with pytest.raises(ValueError, match="on_error"):
        ShardDataset(root, on_error="ignore")
    with pytest.raises(ValueError, match="unknown shuffle order"):
        ShardDataset(root, shuffle="random")
    with pytest.raises(ValueError, match="num_workers"):
        Loader(ShardDataset(root), 4, num_workers=-1)


def test_pin_memory_without_accelerator_warns_and_still_loads(make_dataset):
    root = make_dataset(10, shard_samples=10)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = Loader(ShardDataset(root), 4, pin_memory=True)
    if not torch.cuda.is_available():
        assert any("pin_memory" in str(x.message) for x in w)
    assert sum(len(b["__key__"]) for b in loader) == 10
    loader.close()


def test_stats_count_samples_bytes_and_stall(make_dataset):
    root = make_dataset(60, shard_samples=20)
    with Loader(ShardDataset(root), 16, num_workers=1) as loader:
        list(loader)
        st = loader.stats()
    assert st["samples"] == 60 and st["batches"] == 4
    assert st["bytes_read"] > 60 * 64 and st["read_s"] > 0 and st["wait_s"] > 0
    assert st["samples_per_s"] > 0 and st["errors_skipped"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_that_does_not_decode_is_dropped_with_its_key_under_skip(tmp_path, workers):
    """Keys travel as one blob from the gather (collate.Strs); dropping a
    row that fails to decode must drop its key too, not shift the others."""
    from shardfeed.formats import ShardWriter

    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=10) as w:
        for i in range(30):
            w.write({"__key__": f"k{i:03d}", "cls": b"oops" if i == 13 else str(i).encode()})
    with Loader(ShardDataset(root, shuffle="none", on_error="skip"), 8, num_workers=workers) as loader:
        batches = list(loader)
        st = loader.stats()
    keys = [k for b in batches for k in b["__key__"]]
    labels = [int(v) for b in batches for v in b["cls"]]
    assert keys == [f"k{i:03d}" for i in range(30) if i != 13]
    assert labels == [i for i in range(30) if i != 13] and st["errors_skipped"] == 1


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_mmap_read_mode_gives_exactly_the_batches_of_pread(make_dataset, workers, shuffle):
    root = make_dataset(90, shard_samples=25)
    got = {}
    for mode in ("pread", "mmap"):
        ds = ShardDataset(root, shuffle=shuffle, seed=5, read_mode=mode)
        got[mode] = []
        with Loader(ds, 16, num_workers=workers) as loader:
            for ep in range(2):
                loader.set_epoch(ep)
                got[mode] += [(b["__key__"], b["cls"].tolist(), b["txt"], b["bin"]) for b in loader]
    assert got["mmap"] == got["pread"]
    assert sorted(int(k) for keys, *_ in got["mmap"][:6] for k in keys) == list(range(90))


@pytest.mark.parametrize("workers", [0, 2])
def test_mmap_read_mode_refuses_and_skips_damaged_payloads(make_dataset, workers):
    from test_loader_faults import _damage_payload

    from shardfeed.formats import ShardError

    root = make_dataset(60, shard_samples=20)
    path, key = _damage_payload(root, sample=3)
    with Loader(ShardDataset(root, read_mode="mmap"), 8, num_workers=workers) as loader:
        with pytest.raises(ShardError) as e:
            list(loader)
    assert e.value.shard == path and key in e.value.reason and "checksum" in e.value.reason
    with Loader(ShardDataset(root, read_mode="mmap", on_error="skip"), 8, num_workers=workers) as loader:
        keys = keys_of(loader)
        assert loader.stats()["errors_skipped"] == 1
    assert key not in keys and sorted(keys) == sorted(f"{i:08d}" for i in range(60) if f"{i:08d}" != key)


def test_read_mode_travels_to_spawned_workers_makers(make_dataset):
    import pickle

    from shardfeed.loader.workers import MakerFactory

    root = make_dataset(20, shard_samples=10)
    factory = pickle.loads(pickle.dumps(MakerFactory(ShardDataset(root, shuffle="global", read_mode="mmap"), None)))
    maker = factory()
    try:
        assert maker.reader.read_mode == "mmap"
    finally:
        maker.close()


@pytest.mark.parametrize("bad", ["mmap ", "memory", None])
def test_an_unknown_read_mode_is_refused_by_the_dataset(make_dataset, bad):
    root = make_dataset(10, shard_samples=5)
    with pytest.raises(ValueError) as e:
        ShardDataset(root, read_mode=bad)
    assert repr(bad) in str(e.value) and "'pread', 'mmap'" in str(e.value)


def test_steps_in_epoch_follows_the_schedule_without_moving_the_loader(make_dataset):
    root = make_dataset(48, shard_samples=16)
    schedule = BatchSchedule([Stage(8, epochs=1), Stage(16, epochs=1), Stage(6)])
    with Loader(ShardDataset(root, shuffle="global", seed=1), schedule) as loader:
        next(iter(loader))
        state = loader.state_dict()
        assert [loader.steps_in_epoch(e) for e in range(4)] == [6, 3, 8, 8]
        assert loader.state_dict() == state  # asking moved nothing
        assert len(loader) == 6 and len(list(loader)) == 5  # epoch 0 from its start; one step was taken
        for e in range(1, 4):
            loader.set_epoch(e)
            assert len(loader) == loader.steps_in_epoch(e) == len(list(loader))
