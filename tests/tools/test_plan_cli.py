"""`shardfeed plan --cache-limit`: the estimate for each order, on a dataset the test writes."""

from __future__ import annotations

import argparse
import json

import numpy as np

from shardfeed.cache.planning.simulate import expected_fetch, plan_accesses, simulate
from shardfeed.formats import open_index
from shardfeed.shuffling.spec import Job, PlanSpec
from shardfeed.tools import plan_cmd


def run(capsys, *argv):
    p = argparse.ArgumentParser()
    plan_cmd.add_arguments(p)
    rc = plan_cmd.main(p.parse_args([str(a) for a in argv]))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_plan_json_matches_the_simulator_for_every_order(make_dataset, capsys):
    root = make_dataset(240, shard_samples=20)
    index = open_index(root)
    total = index.num_bytes
    limit = total // 2
    rc, out, _ = run(capsys, root, "--cache-limit", limit, "--world-size", 4, "--ranks-per-node", 2,
                     "--batch-size", 5, "--json")
    assert rc == 0
    report = json.loads(out)
    assert report["nodes"] == 2 and report["dataset_bytes"] == total
    names = [(r["order"], r["locality"], r["policy"]) for r in report["rows"]]
    whole = [(o, loc, p) for o, loc in [("none", False), ("shard", False), ("block", False),
                                         ("global", False), ("global", True)] for p in ("belady", "lru")]
    assert names == whole[:8] + [("global", False, "shardfeed")] + whole[8:]  # the cache's own policy, global
    job = Job(4, (5,) * 4, 2)
    for r in report["rows"]:
        if r["policy"] == "shardfeed":
            continue  # sample ranges: tests/test_cache_ranges.py compares it with a measured run
        opts = {"locality": True} if r["locality"] else {"block_shards": r["window"]} if r["window"] else {}
        acc = plan_accesses(PlanSpec(index.counts, r["order"], 0, **opts), job, 0, (0, 1))
        assert r["epochs"] == simulate(index.sizes, acc, limit, r["policy"]).tolist()
    by = {(r["order"], r["locality"], r["policy"]): r["epochs"] for r in report["rows"]}
    # global with half the dataset per node thrashes; Belady thrashes less than LRU
    assert by[("global", False, "belady")][0] > total // 2
    assert by[("global", False, "belady")][1] <= by[("global", False, "lru")][1]
    # the block window is what block_window allows for 2 ranks a node
    block = next(r for r in report["rows"] if r["order"] == "block")
    assert 1 <= block["window"] and 2 * block["window"] * int(index.sizes.max()) <= limit


def test_plan_table_with_a_budget_that_holds_everything(make_dataset, capsys):
    root = make_dataset(120, shard_samples=10)
    total = open_index(root).num_bytes
    rc, out, _ = run(capsys, root, "--cache-limit", total, "--batch-size", 4)
    assert rc == 0
    lines = out.splitlines()
    assert "12 shards, 120 samples" in lines[0] and "1 node of 1" in lines[0]
    rows = [ln for ln in lines if ln.split() and ln.split()[0] in ("none", "shard", "block", "global")]
    assert len(rows) == 9  # one node: no locality row; global also with the cache's own policy
    for ln in rows:
        if "shardfeed" in ln:
            continue  # the budget holds the shards but not their sidecars too: the cache reads some as ranges
        # cold epoch: every shard once (1.00x of the dataset); then nothing
        assert "(1.00x, 1.00x share)" in ln and "0 B (0.00x, 0.00x share)" in ln, ln
    assert lines[-1].startswith("simulated 9 rows over 2 epochs")


def test_plan_refuses_a_missing_dataset_and_bad_options(tmp_path, make_dataset, capsys):
    rc, _, err = run(capsys, tmp_path / "nope", "--cache-limit", "1MB")
    assert rc == 2 and "nope" in err
    root = make_dataset(40, shard_samples=10)
    rc, _, err = run(capsys, root, "--cache-limit", "1MB", "--world-size", 2, "--ranks-per-node", 3)
    assert rc == 2 and "--ranks-per-node 3" in err
    # a budget below one shard per rank: block is not simulated and says why
    rc, out, _ = run(capsys, root, "--cache-limit", 100, "--json")
    block = [r for r in json.loads(out)["rows"] if r["order"] == "block"]
    assert rc == 0 and all(r["epochs"] is None and "raise the limit" in r["note"] for r in block)


def test_expected_fetch_agrees_with_the_plan_command(make_dataset, capsys):
    root = make_dataset(100, shard_samples=10)
    index = open_index(root)
    limit = index.num_bytes // 3
    rc, out, _ = run(capsys, root, "--cache-limit", limit, "--batch-size", 8, "--epochs", 1, "--json")
    row = next(r for r in json.loads(out)["rows"] if r["order"] == "global" and r["policy"] == "lru")
    p = PlanSpec(index.counts, "global", 0).plan(0, Job(1, (8,)), 0)
    assert rc == 0 and row["epochs"] == [expected_fetch(index.counts, index.sizes, p, limit, "lru")]
    assert np.isclose(json.loads(out)["node_share_bytes"], index.num_bytes)
