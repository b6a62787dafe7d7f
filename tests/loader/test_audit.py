"""Coverage audit: ranks' records merge; a dropped or repeated sample is
reported and makes `shardfeed audit` exit non-zero; a clean run exits 0."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import labelled_sample
from loader_helpers import keys_of, step_together
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, Mixture, ShardDataset
from shardfeed.loader import audit as A
from shardfeed.tools.cli import main as cli


def _records(tmp_path, loaders, name="r"):
    paths = []
    for r, L in enumerate(loaders):
        paths.append(A.save(L.audit_state(), tmp_path / f"{name}{r}.json"))
    return paths


@pytest.fixture
def sources(tmp_path):
    roots = []
    for j, (n, per) in enumerate([(40, 10), (70, 25)]):
        root = str(tmp_path / f"src{j}")
        with ShardWriter(root, max_shard_samples=per) as w:
            for i in range(n):
                s = labelled_sample(i)
                s["__key__"] = f"s{j}-{i:04d}"
                w.write(s)
        roots.append(root)
    return roots


def test_clean_three_rank_run_exits_0(make_dataset, tmp_path, capsys):
    root = make_dataset(101, shard_samples=20)
    loaders = [Loader(ShardDataset(root, rank=r, world_size=3), 8, audit=True) for r in range(3)]
    step_together(loaders)
    paths = _records(tmp_path, loaders)
    assert cli(["audit", *paths]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "ok:" in out
    row = [line for line in out.splitlines() if line.strip().startswith("0 ")][0].split()
    assert row[2:7] == ["102", "101", "0", "1", "1"]  # delivered, unique, missed, repeated (=padding), padded


def test_dropped_sample_is_reported_and_exits_1(make_dataset, tmp_path, capsys):
    root = make_dataset(64, shard_samples=16)
    with Loader(ShardDataset(root, seed=1), 8, audit=True) as L:
        keys_of(L)
        state = L.audit_state()
    rec = state["epochs"]["0"]["sources"][0]
    bits = A.decode(rec["bits"], 64, "test")
    bits[37 >> 3] &= ~np.uint8(128 >> (37 & 7))  # sample 37 never arrived
    rec["bits"], rec["delivered"] = A.encode(bits), rec["delivered"] - 1
    path = A.save(state, tmp_path / "dropped.json")
    assert cli(["audit", str(path)]) == 1
    out = capsys.readouterr().out
    assert "BROKEN" in out and "1 samples missed" in out and "[37]" in out


def test_repeated_sample_is_reported_and_exits_1(make_dataset, tmp_path, capsys):
    """Two ranks both deliver sample 5 (a dealing bug): the merge finds the overlap."""
    root = make_dataset(64, shard_samples=16)
    loaders = [Loader(ShardDataset(root, rank=r, world_size=2), 8, audit=True) for r in range(2)]
    step_together(loaders)
    states = [L.audit_state() for L in loaders]
    for st in states:
        rec = st["epochs"]["0"]["sources"][0]
        bits = A.decode(rec["bits"], 64, "test")
        bits[0] |= np.uint8(128 >> 5)
        rec["bits"] = A.encode(bits)
    states[0]["epochs"]["0"]["sources"][0]["delivered"] += 1  # whichever rank did not own it
    paths = [A.save(st, tmp_path / f"rep{r}.json") for r, st in enumerate(states)]
    assert cli(["audit", *paths]) == 1
    out = capsys.readouterr().out
    assert "repeated deliveries" in out and "5" in out.split("repeated ids")[1].splitlines()[0]


def test_repeat_inside_one_rank_is_counted(make_dataset):
    root = make_dataset(32, shard_samples=8)
    with Loader(ShardDataset(root), 8, audit=True) as L:
        it = iter(L)
        item = next(iter(L.feed))  # the feed's first step, recorded a second time
        next(it)
        L._audit.record(item)
    rec = L.audit_state()["epochs"]["0"]["sources"][0]
    assert rec["extra"] == 8 and rec["delivered"] == 16 and len(rec["examples"]) == 8


def test_mixture_with_repeats_and_resume_across_world_sizes(sources, tmp_path, capsys):
    """A mixture that repeats a source (count > size) and is resumed 2 -> 3 ranks mid-epoch:
    the records of both runs merge into clean epochs."""
    def mixture(r, w):
        return Mixture(sources, counts=[50, 30], seed=3, rank=r, world_size=w)

    two = [Loader(mixture(r, 2), 4, audit=True) for r in range(2)]
    step_together(two, steps=5)
    state = two[0].state_dict()
    paths = _records(tmp_path, two, "a")
    three = [Loader(mixture(r, 3), 4, audit=True) for r in range(3)]
    for L in three:
        L.load_state_dict(state)
    step_together(three)
    step_together(three)  # and a whole second epoch
    paths += _records(tmp_path, three, "b")
    assert cli(["audit", *paths]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1"] and all(r[-1] == "finished" for r in rows)
    assert int(rows[0][2]) >= 50 and int(rows[1][2]) >= 30  # src0 (40 samples) repeats 10 by plan
    saved = json.load(open(paths[0]))
    assert saved["epochs"]["0"]["expect"]["unique"][0] == 40


def test_partial_epoch_is_not_judged_for_missed(make_dataset, tmp_path, capsys):
    root = make_dataset(64, shard_samples=16)
    with Loader(ShardDataset(root), 8, audit=True) as L:
        it = iter(L)
        for _ in range(3):
            next(it)
        path = A.save(L.audit_state(), tmp_path / "part.json")
    assert cli(["audit", str(path)]) == 0
    assert "partial" in capsys.readouterr().out


def test_unusable_record_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "nope.json"
    bad.write_text("{}")
    assert cli(["audit", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().out


def test_audit_needs_audit_true(make_dataset):
    with Loader(ShardDataset(make_dataset(16, shard_samples=8)), 4) as L, pytest.raises(RuntimeError, match="audit=True"):
        L.audit_state()


def _stream(root, start, n, end):
    w = ShardWriter(root, append=True, max_shard_samples=6, prefix=f"p{start}")
    for i in range(start, start + n):
        w.write({"__key__": f"new-{i:05d}", "cls": i})
    w.end_stream() if end else w.close()


def _clear(state, source, i, n):
    rec = state["epochs"]["0"]["sources"][source]
    bits = A.decode(rec["bits"], n, "test")
    was = bool(bits[i >> 3] & np.uint8(128 >> (i & 7)))
    bits[i >> 3] &= ~np.uint8(128 >> (i & 7))
    rec["bits"], rec["delivered"] = A.encode(bits), rec["delivered"] - was
    return was


def test_followed_stream_audit_judges_the_published_prefix(tmp_path, capsys):
    """41 stream samples over 2 ranks x 4: 5 full global batches and a tail of 1 (padding 1)."""
    root = str(tmp_path / "s")
    _stream(root, 0, 41, end=True)
    loaders = [Loader(ShardDataset(root, follow=True, rank=r, world_size=2, poll_s=0.02), 4, audit=True)
               for r in range(2)]
    step_together(loaders)
    states = [L.audit_state() for L in loaders]
    assert states[0]["sources"][0]["samples"] == 41
    paths = [A.save(st, tmp_path / f"f{r}.json") for r, st in enumerate(states)]
    assert cli(["audit", *paths]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.strip().startswith("0 ")][0].split()
    assert row[2:7] == ["42", "41", "0", "1", "1"] and "stream ended" in out
    owner = 0 if _clear(states[0], 0, 17, 41) else 1  # drop sample 17 from whichever rank delivered it
    if owner:
        _clear(states[1], 0, 17, 41)
    paths = [A.save(st, tmp_path / f"g{r}.json") for r, st in enumerate(states)]
    assert cli(["audit", *paths]) == 1
    out = capsys.readouterr().out
    assert "1 samples missed" in out and "[17]" in out


def test_stream_mixture_audit_across_a_resume_and_a_repeat(tmp_path, capsys):
    """A Mixture of a growing stream and a fixed source, audited for a prefix, resumed while the
    stream grows, audited to its end; a stream sample delivered by both runs is a repeat."""
    fixed = str(tmp_path / "fixed")
    with ShardWriter(fixed, max_shard_samples=7) as w:
        for i in range(20):
            w.write({"__key__": f"fx-{i:04d}", "cls": i})
    root = str(tmp_path / "s")
    _stream(root, 0, 24, end=False)

    def make():
        follow = ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=60)
        return Loader(Mixture([follow, fixed], weights=[1, 1], seed=2), 6, audit=True)

    with make() as a:
        it = iter(a)
        for _ in range(4):
            next(it)
        state, rec_a = a.state_dict(), a.audit_state()
    path_a = A.save(rec_a, tmp_path / "a.json")
    assert rec_a["sources"][0]["samples"] == 12 and rec_a["epochs"]["0"]["expect"]["delivered"] == [12, 12]
    assert cli(["audit", path_a]) == 0 and "stream prefix" in capsys.readouterr().out
    _stream(root, 24, 20, end=True)
    with make() as b:
        b.load_state_dict(state)
        keys_of(b)
        rec_b = b.audit_state()
    path_b = A.save(rec_b, tmp_path / "b.json")
    assert cli(["audit", path_a, path_b]) == 0
    out = capsys.readouterr().out
    assert "stream ended" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert rows[0][2:6] == ["44", "44", "0", "0"]  # the stream: every published sample once
    assert rows[1][2:6] == ["42", "20", "0", "0"]  # the fixed source: 14 batches x 3, repeats by plan
    src = rec_b["epochs"]["0"]["sources"][0]
    bits = A.decode(src["bits"], 44, "test")
    bits[12 >> 3] |= np.uint8(128 >> (12 & 7))  # pretend run a also delivered sample 12
    a_src = rec_a["epochs"]["0"]["sources"][0]
    abits = np.concatenate([A.decode(a_src["bits"], 12, "test"), np.zeros(4, np.uint8)])[:2]
    abits[12 >> 3] |= np.uint8(128 >> (12 & 7))
    rec_a["sources"][0]["samples"] = 13
    a_src["bits"], a_src["delivered"] = A.encode(abits), a_src["delivered"] + 1
    assert cli(["audit", A.save(rec_a, tmp_path / "a2.json"), path_b]) == 1
    assert "repeated deliveries" in capsys.readouterr().out
