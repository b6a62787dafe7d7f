"""Golden outputs: the full order of every shuffle, the dealing to ranks and
to workers, elastic re-plans, and the keys a Loader delivers, for small fixed
datasets, compared exactly with tests/data/golden_plans.json.

These pin today's behaviour so that a refactor of how plans are built (or any
accidental change to an order) breaks a test that names the case and the
first differing position. Orders are part of the contract: a checkpoint
resumed by a newer shardfeed, or ranks running different versions, must see
the same samples in the same places (Grain's
``shuffle_test.py::test_cross_version_determinism``, STYLE.md "Tests").

Each case also checks invariants (ids in range, coverage over ranks, ranks'
shares proportional to weights, workers merging back to the rank's order,
old and new ranks covering the epoch after a re-plan), so a golden file
regenerated from broken code is still caught for coverage.

The golden file is written only on request, after a deliberate change of an
order (say why in the commit message)::

    SHARDFEED_REGEN_GOLDEN=1 .venv/bin/python tests/shuffling/test_shuffling_golden.py

(or the same variable on a pytest run of this file: the file is rewritten
before the comparisons). Normal runs never write it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from shardfeed.shuffling import Topology, make_plan
from shardfeed.shuffling import replan as replan_fn

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_plans.json"
REGEN_ENV = "SHARDFEED_REGEN_GOLDEN"
VERSION = 1

# Plans: uneven shards and an empty one; 45 samples.
COUNTS = [7, 0, 13, 5, 9, 11]
N = sum(COUNTS)
OPTS = dict(block_shards=2, buffer_size=8)
ORDERS = ("none", "shard", "block", "global")
WORLDS = (("w1", 1, None), ("w3", 3, None), ("w3x2-1-3", 3, (2, 1, 3)))

# Loader: 40 samples written by ShardWriter, 7 per shard -> [7, 7, 7, 7, 7, 5].
LOADER_SAMPLES = 40
LOADER_SHARD_SAMPLES = 7
LOADER_COUNTS = [7, 7, 7, 7, 7, 5]
LOADER_EPOCHS = 2  # one Loader iterated twice: epochs 0 and 1


# ---------------------------------------------------------------------------
# cases: name -> inputs (plain JSON data), built in code; the golden file holds
# the same inputs next to the expected outputs.
# ---------------------------------------------------------------------------
def _plan_cases() -> dict[str, dict]:
    cases = {}
    for order in ORDERS:
        for wname, world, weights in WORLDS:
            for drop_last in (False, True):
                for seed in (0, 7):
                    for epoch in (0, 1):
                        name = f"plan/{order}/{wname}/{'drop' if drop_last else 'pad'}/seed{seed}/epoch{epoch}"
                        cases[name] = dict(order=order, world_size=world, weights=weights, ranks_per_node=None,
                                           drop_last=drop_last, seed=seed, epoch=epoch, locality=False,
                                           batch_size=None)
    # Locality-aware global: 4 ranks, 2 per node; batch_size is rank 0's.
    for wname, weights, bs in (("w4", None, 2), ("w4x1-1-2-2", (1, 1, 2, 2), 2)):
        for drop_last in (False, True):
            for seed in (0, 7):
                for epoch in (0, 1):
                    if weights and (seed, epoch) != (7, 1):
                        continue
                    name = f"locality/global/{wname}/rpn2/bs{bs}/{'drop' if drop_last else 'pad'}/seed{seed}/epoch{epoch}"
                    cases[name] = dict(order="global", world_size=4, weights=weights, ranks_per_node=2,
                                       drop_last=drop_last, seed=seed, epoch=epoch, locality=True, batch_size=bs)
    return cases


def _elastic_cases() -> dict[str, dict]:
    """2 ranks -> 3 ranks after some steps (consumed = steps * batch size per rank)."""
    cases = {}
    for order in ORDERS:
        for drop_last in (False, True):
            tag = "drop" if drop_last else "pad"
            cases[f"elastic/{order}/w2-to-w3/{tag}/seed7/epoch1"] = dict(
                order=order, seed=7, epoch=1, drop_last=drop_last, old=[2, None, None], consumed=[8, 8],
                new=[3, None, None], history=[], locality=False, batch_size=None)
        cases[f"elastic/{order}/w2x1-2-to-w3/pad/seed0/epoch0"] = dict(
            order=order, seed=0, epoch=0, drop_last=False, old=[2, [1, 2], None], consumed=[3, 6],
            new=[3, None, None], history=[], locality=False, batch_size=None)
        # Two resizes in one epoch: 2 -> 3 -> 1.
        cases[f"elastic/{order}/w2-to-w3-to-w1/pad/seed7/epoch0"] = dict(
            order=order, seed=7, epoch=0, drop_last=False, old=[3, None, None], consumed=[4, 4, 4],
            new=[1, None, None], history=[[[2, None, None], [6, 6]]], locality=False, batch_size=None)
    # Locality-aware global, one rank per node: 2 nodes -> 3 nodes.
    for drop_last in (False, True):
        tag = "drop" if drop_last else "pad"
        cases[f"elastic/global-locality/w2rpn1-to-w3rpn1/bs2/{tag}/seed7/epoch1"] = dict(
            order="global", seed=7, epoch=1, drop_last=drop_last, old=[2, None, 1], consumed=[6, 6],
            new=[3, None, 1], history=[], locality=True, batch_size=2)
    return cases


def _worker_cases() -> dict[str, dict]:
    """EpochPlan.worker_slice of rank 1 of 3 for 3 workers."""
    cases = {}
    for order in ORDERS:
        cases[f"workers/{order}/w3-rank1/nw3/bs4/seed7/epoch1"] = dict(
            order=order, seed=7, epoch=1, world_size=3, weights=None, rank=1, drop_last=False, num_workers=3,
            batch_size=4, start_batch=0, batch_drop_last=False)
        cases[f"workers/{order}/w3x2-1-3-rank2/nw3/bs3/start1/drop/seed0/epoch0"] = dict(
            order=order, seed=0, epoch=0, world_size=3, weights=(2, 1, 3), rank=2, drop_last=False,
            num_workers=3, batch_size=3, start_batch=1, batch_drop_last=True)
    return cases


def _loader_cases() -> dict[str, dict]:
    cases = {}
    for order in ORDERS:
        for world in (1, 3):
            for seed in (0, 7):
                cases[f"loader/{order}/w{world}/bs4/pad/seed{seed}"] = dict(
                    order=order, world_size=world, batch_size=4, drop_last=False, seed=seed, locality=False,
                    local_world_size=None)
        cases[f"loader/{order}/w3/bs4/drop/seed7"] = dict(
            order=order, world_size=3, batch_size=4, drop_last=True, seed=7, locality=False, local_world_size=None)
    for order in ("block", "global"):
        cases[f"loader/{order}/w3/bs2-1-3/pad/seed7"] = dict(
            order=order, world_size=3, batch_size=[2, 1, 3], drop_last=False, seed=7, locality=False,
            local_world_size=None)
    cases["loader/global-locality/w4/lws2/bs2/pad/seed7"] = dict(
        order="global", world_size=4, batch_size=2, drop_last=False, seed=7, locality=True, local_world_size=2)
    return cases


def _tup(x):
    return tuple(x) if x is not None else None


def _jsonable(x):
    """Inputs as they read back from JSON (tuples become lists)."""
    return json.loads(json.dumps(x))


# ---------------------------------------------------------------------------
# computing the outputs
# ---------------------------------------------------------------------------
def _ids(plan) -> list[int]:
    return plan.positions(0, plan.num_samples).tolist()


def _compute_plan(c: dict) -> dict:
    topo = Topology(0, c["world_size"], _tup(c["weights"]), c["ranks_per_node"])
    plan = make_plan(COUNTS, c["order"], c["seed"], c["epoch"], topo, drop_last=c["drop_last"],
                     locality=c["locality"], batch_size=c["batch_size"], **OPTS)
    return {
        "total_samples": plan.total_samples,
        "padded": plan.padded,
        "dropped": plan.dropped,
        "num_samples": [p.num_samples for p in plan.all_ranks()],
        "ids": [_ids(p) for p in plan.all_ranks()],
    }


def _topo(spec, rank=0) -> Topology:
    world, weights, rpn = spec
    return Topology(rank, world, _tup(weights), rpn)


def _options(c: dict) -> dict:
    return dict(drop_last=c["drop_last"], locality=c["locality"], batch_size=c["batch_size"], **OPTS)


def _compute_elastic(c: dict) -> dict:
    steps = [h for h in c["history"]] + [[c["old"], c["consumed"]]]
    # Through EpochPlan.replan, one resize at a time.
    plan = make_plan(COUNTS, c["order"], c["seed"], c["epoch"], _topo(steps[0][0]), **_options(c))
    prefixes = []  # what each old rank had taken before each resize
    for i, (_, used) in enumerate(steps):
        prefixes.append([p.positions(0, k).tolist() for p, k in zip(plan.all_ranks(), used)])
        nxt = c["new"] if i + 1 == len(steps) else steps[i + 1][0]
        plan = plan.replan(used, _topo(nxt))
    ranks = plan.all_ranks()
    out = {
        "total_samples": plan.total_samples,
        "padded": plan.padded,
        "dropped": plan.dropped,
        "num_samples": [p.num_samples for p in ranks],
        "consumed_ids": prefixes,
        "ids": [_ids(p) for p in ranks],
    }
    # Through shardfeed.shuffling.replan from plain inputs: must be the same plan.
    for r in range(c["new"][0]):
        other = replan_fn(COUNTS, c["order"], c["seed"], c["epoch"], _topo(c["old"]), c["consumed"],
                          _topo(c["new"], r), history=[(_topo(t), used) for t, used in c["history"]],
                          **_options(c))
        assert other.num_samples == out["num_samples"][r]
        assert _ids(other) == out["ids"][r], f"shuffling.replan and EpochPlan.replan differ for new rank {r}"
    return out


def _compute_workers(c: dict) -> dict:
    topo = Topology(c["rank"], c["world_size"], _tup(c["weights"]))
    plan = make_plan(COUNTS, c["order"], c["seed"], c["epoch"], topo, drop_last=c["drop_last"], **OPTS)
    workers = []
    for w in range(c["num_workers"]):
        workers.append([[b, ids.tolist()] for b, ids in plan.worker_slice(
            w, c["num_workers"], c["batch_size"], c["start_batch"], c["batch_drop_last"])])
    return {"num_samples": plan.num_samples, "rank_ids": _ids(plan), "workers": workers}


def _write_loader_dataset(root: str) -> None:
    from conftest import labelled_sample
    from shardfeed.formats import ShardWriter

    with ShardWriter(root, max_shard_samples=LOADER_SHARD_SAMPLES) as w:
        for i in range(LOADER_SAMPLES):
            w.write(labelled_sample(i))


def _loader_env(c: dict) -> dict:
    return {"LOCAL_WORLD_SIZE": None if c["local_world_size"] is None else str(c["local_world_size"])}


def _run_loader(root: str, c: dict, num_workers: int) -> list:
    """keys[epoch][rank][step] -> list of keys, ranks stepping in turn."""
    from shardfeed.loader import Loader, ShardDataset

    world = c["world_size"]
    out = [[[] for _ in range(world)] for _ in range(LOADER_EPOCHS)]
    for r in range(world):
        ds = ShardDataset(root, shuffle=c["order"], seed=c["seed"], rank=r, world_size=world,
                          drop_last=c["drop_last"], locality=c["locality"])
        with Loader(ds, c["batch_size"], num_workers=num_workers) as loader:
            for e in range(LOADER_EPOCHS):
                out[e][r] = [list(b["__key__"]) for b in loader]
    return out


def _compute_loader(root: str, c: dict) -> dict:
    return {"keys": _run_loader(root, c, num_workers=0)}


# ---------------------------------------------------------------------------
# the golden file
# ---------------------------------------------------------------------------
def _all_cases() -> dict[str, dict[str, dict]]:
    return {"plans": _plan_cases(), "elastic": _elastic_cases(), "workers": _worker_cases(),
            "loader": _loader_cases()}


def _set_env(env: dict) -> dict:
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return old


def _regenerate() -> None:
    """Rewrite tests/data/golden_plans.json from the current code."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # conftest.labelled_sample
    groups = _all_cases()
    data = {"version": VERSION, "counts": COUNTS, "options": OPTS, "loader_counts": LOADER_COUNTS}
    compute = {"plans": _compute_plan, "elastic": _compute_elastic, "workers": _compute_workers}
    for group, cases in groups.items():
        if group in compute:
            data[group] = {name: {"inputs": _jsonable(c), "expect": compute[group](c)} for name, c in cases.items()}
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "ds")
        _write_loader_dataset(root)
        data["loader"] = {}
        for name, c in groups["loader"].items():
            old = _set_env(_loader_env(c))
            try:
                data["loader"][name] = {"inputs": _jsonable(c), "expect": _compute_loader(root, c)}
            finally:
                _set_env(old)
    # One case per line: small diffs when an order changes on purpose.
    lines = ["{"]
    head = [k for k in data if not isinstance(data[k], dict) or k == "options"]
    for k in head:
        lines.append(f" {json.dumps(k)}: {json.dumps(data[k])},")
    for gi, group in enumerate(groups):
        lines.append(f" {json.dumps(group)}: {{")
        items = list(data[group].items())
        for i, (name, v) in enumerate(items):
            sep = "," if i + 1 < len(items) else ""
            lines.append(f"  {json.dumps(name)}: {json.dumps(v, separators=(',', ':'))}{sep}")
        lines.append(" }" + ("," if gi + 1 < len(groups) else ""))
    lines.append("}")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text("\n".join(lines) + "\n")
    json.loads(GOLDEN.read_text())  # still valid JSON


@functools.cache
def _golden() -> dict:
    if os.environ.get(REGEN_ENV) == "1":
        _regenerate()
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing; regenerate it with {REGEN_ENV}=1 (see this module's docstring)")
    return json.loads(GOLDEN.read_text())


def _first_diff(expected, got, path: str = "") -> str | None:
    """Where two JSON-like values first differ, as 'path: expected X, got Y'."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for k in list(expected) + [k for k in got if k not in expected]:
            if k not in got:
                return f"{path}.{k}: missing in the output"
            if k not in expected:
                return f"{path}.{k}: not in the golden file"
            d = _first_diff(expected[k], got[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(expected, list) and isinstance(got, list):
        for i, (a, b) in enumerate(zip(expected, got)):
            d = _first_diff(a, b, f"{path}[{i}]")
            if d:
                return d
        if len(expected) != len(got):
            i = min(len(expected), len(got))
            return (f"{path}: length {len(got)} != golden length {len(expected)} "
                    f"(first differing position [{i}])")
        return None
    if type(expected) is not type(got) or expected != got:
        return f"{path}: expected {expected!r}, got {got!r}"
    return None


def _check_golden(group: str, name: str, inputs: dict, got: dict) -> None:
    golden = _golden()
    assert name in golden.get(group, {}), (f"case {name!r} is not in {GOLDEN.name}; regenerate it with "
                                           f"{REGEN_ENV}=1 if the case is new")
    entry = golden[group][name]
    assert entry["inputs"] == _jsonable(inputs), f"case {name}: inputs differ from the golden file's"
    diff = _first_diff(entry["expect"], _jsonable(got))
    assert diff is None, f"case {name}: output differs from {GOLDEN.name} at {diff}"


# ---------------------------------------------------------------------------
# invariants (hold whatever the golden file says)
# ---------------------------------------------------------------------------
def _unit(weights, world):
    if weights is None:
        return [1] * world
    g = np.gcd.reduce(np.asarray(weights))
    return [int(w // g) for w in weights]


def _check_deal(ids: list[list[int]], num_samples, padded, dropped, drop_last, weights, n=N, total=None):
    total = n if total is None else total
    world = len(ids)
    flat = [i for r in ids for i in r]
    for r, x in enumerate(ids):
        assert len(x) == num_samples[r]
        assert all(0 <= i < n for i in x), f"rank {r}: an id outside 0..{n - 1}"
    unit = _unit(weights, world)
    rounds = {len(x) // u for x, u in zip(ids, unit)}
    assert len(rounds) == 1 and all(len(x) % u == 0 for x, u in zip(ids, unit)), "shares not proportional to weights"
    assert len(flat) == total + padded - dropped
    if drop_last:
        assert padded == 0 and len(set(flat)) == len(flat), "drop_last: a sample twice"
    else:
        assert dropped == 0 and len(set(flat)) == total, "drop_last=False: not every sample covered"
    return flat


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------
def test_golden_file_lists_exactly_the_cases():
    golden = _golden()
    assert golden["version"] == VERSION
    assert golden["counts"] == COUNTS and golden["options"] == OPTS and golden["loader_counts"] == LOADER_COUNTS
    for group, cases in _all_cases().items():
        assert sorted(golden[group]) == sorted(cases), f"{group}: the golden file's cases differ from the code's"
    assert GOLDEN.stat().st_size < 300_000


@pytest.mark.parametrize("name", list(_plan_cases()))
def test_plan_golden(name):
    c = _plan_cases()[name]
    got = _compute_plan(c)
    flat = _check_deal(got["ids"], got["num_samples"], got["padded"], got["dropped"], c["drop_last"], c["weights"])
    if c["order"] in ("global", "block", "none") and not c["drop_last"]:
        assert sorted(set(flat)) == list(range(N))
    if c["order"] == "none" and c["world_size"] == 1 and not c["drop_last"]:
        assert got["ids"][0] == list(range(N))
    # Random access: any window equals the slice of the whole order.
    topo = Topology(0, c["world_size"], _tup(c["weights"]), c["ranks_per_node"])
    plan = make_plan(COUNTS, c["order"], c["seed"], c["epoch"], topo, drop_last=c["drop_last"],
                     locality=c["locality"], batch_size=c["batch_size"], **OPTS)
    for r, p in enumerate(plan.all_ranks()):
        n = p.num_samples
        for a, b in ((0, min(n, 5)), (n // 3, n), (min(n, 7), min(n, 11)), (n - 1 if n else 0, n)):
            assert p.positions(a, b).tolist() == got["ids"][r][a:b], f"rank {r} positions({a}, {b})"
    if c["locality"]:
        # Locality moves samples between the ranks of a global batch, never between batches.
        plain = make_plan(COUNTS, "global", c["seed"], c["epoch"], Topology(0, c["world_size"], _tup(c["weights"])),
                          drop_last=c["drop_last"], **OPTS).all_ranks()
        unit = _unit(c["weights"], c["world_size"])
        share = [c["batch_size"] // unit[0] * u for u in unit]
        steps = -(-got["num_samples"][0] // share[0])
        for s in range(steps):
            mine = sorted(i for r in range(c["world_size"]) for i in got["ids"][r][s * share[r]:(s + 1) * share[r]])
            ref = sorted(i for r, p in enumerate(plain) for i in _ids(p)[s * share[r]:(s + 1) * share[r]])
            assert mine == ref, f"global batch {s} holds other samples than without locality"
    _check_golden("plans", name, c, got)


@pytest.mark.parametrize("name", list(_elastic_cases()))
def test_elastic_golden(name):
    c = _elastic_cases()[name]
    got = _compute_elastic(c)
    for used, prefix in zip([h[1] for h in c["history"]] + [c["consumed"]], got["consumed_ids"]):
        assert [len(p) for p in prefix] == list(used)
    taken = {i for step in got["consumed_ids"] for p in step for i in p}
    new = [i for r in got["ids"] for i in r]
    assert all(0 <= i < N for i in new)
    assert taken | set(new) == set(range(N)) if not c["drop_last"] else taken | set(new) <= set(range(N))
    if not c["drop_last"]:
        assert got["dropped"] == 0
        # Every sample the old ranks had not taken is in the new plan.
        assert set(range(N)) - taken <= set(new)
    else:
        assert got["padded"] == 0 and len(set(new)) == len(new)
    unit = _unit(c["new"][1], c["new"][0])
    assert len({len(x) // u for x, u in zip(got["ids"], unit)}) == 1
    _check_golden("elastic", name, c, got)


@pytest.mark.parametrize("name", list(_worker_cases()))
def test_workers_golden(name):
    c = _worker_cases()[name]
    got = _compute_workers(c)
    bs, n = c["batch_size"], got["num_samples"]
    nb = n // bs if c["batch_drop_last"] else -(-n // bs)
    merged = sorted((b, ids) for w in got["workers"] for b, ids in w)
    assert [b for b, _ in merged] == list(range(c["start_batch"], nb))
    for w, batches in enumerate(got["workers"]):
        assert all(b % c["num_workers"] == w for b, _ in batches)
    for b, ids in merged:
        assert ids == got["rank_ids"][b * bs:min(n, (b + 1) * bs)]
    _check_golden("workers", name, c, got)


@pytest.fixture(scope="module")
def loader_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("golden") / "ds")
    _write_loader_dataset(root)
    return root


@pytest.mark.parametrize("name", list(_loader_cases()))
def test_loader_golden(name, loader_root, monkeypatch):
    from shardfeed.formats import open_index

    c = _loader_cases()[name]
    assert open_index(loader_root).counts.tolist() == LOADER_COUNTS
    for k, v in _loader_env(c).items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    got = _compute_loader(loader_root, c)
    world = c["world_size"]
    bss = c["batch_size"] if isinstance(c["batch_size"], list) else [c["batch_size"]] * world
    weights = tuple(bss) if isinstance(c["batch_size"], list) else None
    for e, per_rank in enumerate(got["keys"]):
        # The loader delivers exactly the plan's order, batch by batch.
        topo = Topology(0, world, weights, c["local_world_size"])
        plan = make_plan(LOADER_COUNTS, c["order"], c["seed"], e, topo, drop_last=c["drop_last"],
                         locality=c["locality"], batch_size=bss[0] if c["locality"] else None)
        ids = [_ids(p) for p in plan.all_ranks()]
        _check_deal(ids, [len(x) for x in ids], plan.padded, plan.dropped, c["drop_last"], weights,
                    n=LOADER_SAMPLES)
        steps = {len(s) for s in per_rank}
        assert len(steps) == 1, f"epoch {e}: ranks took different numbers of steps"
        for r, batches in enumerate(per_rank):
            assert [int(k) for b in batches for k in b] == ids[r], f"epoch {e} rank {r}: loader != plan"
            assert all(len(b) == bss[r] for b in batches[:-1])
    # Workers change nothing: the same batches in the same order.
    with2 = _run_loader(loader_root, c, num_workers=2)
    assert with2 == got["keys"], f"case {name}: num_workers=2 delivers another sequence than num_workers=0"
    _check_golden("loader", name, c, got)


if __name__ == "__main__":
    if os.environ.get(REGEN_ENV) != "1":
        sys.exit(f"set {REGEN_ENV}=1 to rewrite {GOLDEN} from the current code")
    _regenerate()
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
