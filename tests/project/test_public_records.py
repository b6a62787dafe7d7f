"""The public value classes that stopped being dataclasses (issue #24: none is built at import) behave as
the frozen dataclasses they were: fields by position and keyword with their defaults, repr, ==, hash,
immutability, copies, pickles and pattern matching."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest

from shardfeed.formats import ReadError, ShardInfo
from shardfeed.loader import Stage
from shardfeed.shuffling import Order, Topology
from shardfeed.shuffling.spec import PlanSpec


@dataclasses.dataclass(frozen=True)
class _Stage:  # what Stage was, without its checks
    batch_size: int | tuple
    image_size: int | None = None
    epochs: int = 1


@pytest.mark.parametrize("args,kw", [((256,), {}), ((64, 128), {"epochs": 3}), (((8, 16),), {"image_size": 5})])
def test_stage_is_the_dataclass_it_was(args, kw):
    s, d = Stage(*args, **kw), _Stage(*args, **kw)
    assert repr(s) == repr(d).replace("_Stage", "Stage")
    assert (s.batch_size, s.image_size, s.epochs) == (d.batch_size, d.image_size, d.epochs)
    assert s == Stage(*args, **kw) and hash(s) == hash(Stage(*args, **kw)) and s != Stage(999)
    assert s.__eq__(d) is NotImplemented  # another class is never equal, as with dataclasses
    match s:
        case Stage(b, i, e):
            assert (b, i, e) == (d.batch_size, d.image_size, d.epochs)


@pytest.mark.parametrize("value", [Stage(32, 64, epochs=2), Topology(1, 4, (2, 2, 2, 2), 2),
                                   ReadError("s/a.tar", "truncated", 3), ShardInfo("a.tar", "tar", 3, 10, "h")])
def test_frozen_records_refuse_assignment_and_survive_copies_and_pickles(value):
    name = type(value).__match_args__[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(value, name)
    for other in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert other == value and type(other) is type(value) and repr(other) == repr(value)
        assert hash(other) == hash(value)


def test_topology_checks_and_normalises_as_before():
    assert Topology() == Topology(0, 1) and repr(Topology()) == ("Topology(rank=0, world_size=1, weights=None, "
                                                                 "ranks_per_node=None)")
    assert Topology(0, 2, [3, 3]).weights == (3, 3)  # a list becomes a tuple
    with pytest.raises(ValueError, match="rank=2 out of range"):
        Topology(2, 2)
    with pytest.raises(TypeError, match="Topology.rank must be an int"):
        Topology(True, 2)


def test_read_error_reads_as_its_tuple():
    e = ReadError("a.tar", "bad", 2)
    assert tuple(e) == ("a.tar", "bad", 2) and e[1] == "bad" and repr(e) == (
        "ReadError(shard='a.tar', reason='bad', samples=2)")


def test_plan_spec_leaves_counts_out_of_repr_eq_and_hash():
    a, b = PlanSpec(np.array([3, 4]), "global", 5), PlanSpec(np.array([9]), Order.GLOBAL, 5)
    assert a == b and hash(a) == hash(b) and a != PlanSpec(np.array([3, 4]), "global", 6)
    assert "counts" not in repr(a) and repr(a).startswith("PlanSpec(order=<Order.GLOBAL: 'global'>, seed=5,")
    assert pickle.loads(pickle.dumps(a)).counts.tolist() == [3, 4]


def test_shard_info_is_still_a_dataclass():
    info = ShardInfo(**{"name": "a.tar", "format": "tar", "samples": 3, "bytes": 10, "hash": "h"})
    assert dataclasses.asdict(info) == dict(info.__dict__) == {"name": "a.tar", "format": "tar", "samples": 3,
                                                               "bytes": 10, "hash": "h"}
    from shardfeed.formats.index import ShardInfo as same

    assert same is ShardInfo
