"""Shuffle-quality metrics and the locality-aware dealing they measure."""

import numpy as np

from shardfeed.shuffling import Topology, make_plan
from shardfeed.shuffling.plan_quality import batch_entropy, plan_quality, residency, spearman

COUNTS = np.full(20, 500, dtype=np.int64)
LABELS = np.arange(10_000) // 250  # 40 classes written in order: the worst case


def test_helpers():
    assert residency(np.array([3, 3, 1, 3, 2, 2])) == (3, 2)
    assert residency(np.array([], dtype=np.int64)) == (0, 0)
    assert spearman(np.arange(100)) > 0.999 and spearman(np.arange(100)[::-1]) < -0.999
    ent = batch_entropy(np.array([[0, 0, 0, 0], [0, 1, 2, 3]]), 4)
    assert ent[0] == 0 and np.isclose(ent[1], np.log(4))


def test_quality_orders_rank_as_expected():
    q = {o: plan_quality(make_plan(COUNTS, o, 0, 0, Topology(0, 2), block_shards=4, buffer_size=500), LABELS, 64)
         for o in ("none", "shard", "block", "global")}
    assert q["none"]["entropy_ratio"] < 0.1 and q["none"]["spearman"] > 0.99 and q["none"]["peak_resident"] <= 2
    assert 0.95 < q["global"]["entropy_ratio"] < 1.05 and abs(q["global"]["spearman"]) < 0.05
    assert q["none"]["entropy_ratio"] < q["shard"]["entropy_ratio"] < q["block"]["entropy_ratio"] < q["global"]["entropy_ratio"]
    assert q["block"]["peak_resident"] <= 4 < q["global"]["peak_resident"]
    assert q["global"]["shards_opened"] == 2 * len(COUNTS)  # every rank reads every shard


def test_locality_dealing_cuts_remote_reads_and_keeps_batches():
    """Yang & Cong: same global batches, most samples read on the owner node."""
    topo = Topology(0, 8, ranks_per_node=2)  # 4 nodes
    counts = np.full(40, 800, dtype=np.int64)
    labels = np.zeros(int(counts.sum()), dtype=np.int64)
    plain = make_plan(counts, "global", 0, 0, topo)
    local = make_plan(counts, "global", 0, 0, topo, locality=True, batch_size=64)
    qp, ql = plan_quality(plain, labels, 64), plan_quality(local, labels, 64)
    assert 0.70 < qp["remote_fraction"] < 0.80  # (nodes-1)/nodes
    assert ql["remote_fraction"] < 0.08
    for step in range(0, 50, 7):
        a = np.concatenate([p.positions(step * 64, (step + 1) * 64) for p in plain.all_ranks()])
        b = np.concatenate([p.positions(step * 64, (step + 1) * 64) for p in local.all_ranks()])
        assert np.array_equal(np.sort(a), np.sort(b))
    assert [p.num_samples for p in local.all_ranks()] == [p.num_samples for p in plain.all_ranks()]
