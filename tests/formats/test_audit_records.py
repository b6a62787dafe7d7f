"""`shardfeed audit` on damaged, hostile and mismatched records: exit 2 naming
the file and the reason (never a traceback, never exit 1, which means a
broken guarantee), bounded memory for huge claims and compression bombs,
and a stream sample missed after a resume caught (exit 1)."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from loader_helpers import keys_of
from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader import audit as A
from shardfeed.tools.cli import main as cli

pytestmark = pytest.mark.hostile(timeout=120)  # bounded time and memory (conftest.py)


@pytest.fixture
def record(make_dataset):
    root = make_dataset(40, shard_samples=10)
    with Loader(ShardDataset(root, seed=3), 8, audit=True) as L:
        keys_of(L)
        return L.audit_state()


def _save(tmp_path, state, name="r.json") -> str:
    return A.save(state, tmp_path / name)


def _src(state):
    return state["epochs"]["0"]["sources"][0]


DAMAGE = {
    "bits not base64": lambda s: _src(s).update(bits="@@not base64@@"),
    "bits not zlib": lambda s: _src(s).update(bits=base64.b64encode(b"plain bytes").decode()),
    "bits cut short": lambda s: _src(s).update(bits=_src(s)["bits"][:8]),
    "bits missing": lambda s: _src(s).pop("bits"),
    "bits a number": lambda s: _src(s).update(bits=7),
    "delivered a string": lambda s: _src(s).update(delivered="12"),
    "expect missing": lambda s: s["epochs"]["0"].pop("expect"),
    "expect unique short": lambda s: s["epochs"]["0"]["expect"].update(unique=[]),
    "epochs a list": lambda s: s.update(epochs=[1, 2]),
    "epoch key not a number": lambda s: s["epochs"].update({"x": s["epochs"]["0"]}),
    "sources empty": lambda s: s.update(sources=[]),
    "samples negative": lambda s: s["sources"][0].update(samples=-5),
    "samples a float": lambda s: s["sources"][0].update(samples=40.0),
    "examples of strings": lambda s: _src(s).update(examples=["a"]),
    "stream out of range": lambda s: s.update(stream=3),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_record_exits_2_naming_the_file(record, tmp_path, capsys, damage):
    state = copy.deepcopy(record)
    DAMAGE[damage](state)
    path = _save(tmp_path, state, "damaged.json")
    assert cli(["audit", path]) == 2
    out = capsys.readouterr().out
    assert "damaged.json" in out and "Traceback" not in out


def test_an_intact_record_still_passes(record, tmp_path):
    assert cli(["audit", _save(tmp_path, record)]) == 0


def test_records_that_disagree_on_the_expectation_are_refused(record, tmp_path, capsys):
    other = copy.deepcopy(record)
    other["epochs"]["0"]["expect"]["unique"] = [39]
    other["epochs"]["0"]["expect"]["delivered"] = [39]
    a, b = _save(tmp_path, record, "a.json"), _save(tmp_path, other, "b.json")
    assert cli(["audit", a, b]) == 2
    assert "b.json" in capsys.readouterr().out


def test_records_of_another_dataset_are_refused(record, tmp_path, capsys):
    other = copy.deepcopy(record)
    other["sources"][0]["name"] = "/elsewhere"
    assert cli(["audit", _save(tmp_path, record, "a.json"), _save(tmp_path, other, "b.json")]) == 2


# Runs `shardfeed audit` in a child under an address-space cap; prints its exit code and the
# child's peak RSS growth (MiB) during the audit.
CHILD = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
    from shardfeed.tools.cli import main
    import shardfeed.tools.audit_cmd
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc = main(["audit", *sys.argv[2:]])
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    print(f"RC={rc} GREW_MIB={grew}")
""")


def _audit_child(*paths, limit=1600 << 20, timeout=60):
    p = subprocess.run([sys.executable, "-c", CHILD, str(limit), *paths], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_a_record_claiming_10_15_samples_is_refused_without_allocating(record, tmp_path):
    state = copy.deepcopy(record)
    state["sources"][0]["samples"] = 10**15
    code, out = _audit_child(_save(tmp_path, state, "huge.json"))
    assert code == 0 and "RC=2" in out and "huge.json" in out and "10000000000000000" not in out, out
    assert "Traceback" not in out


def test_a_compression_bomb_is_refused_in_bounded_memory(record, tmp_path):
    """0.7-1 MB of zlib that inflates to 1 GiB, in a record of 40 samples."""
    c = zlib.compressobj(9)
    zeros = bytes(1 << 20)
    bomb = b"".join(c.compress(zeros) for _ in range(1024)) + c.flush()
    assert len(bomb) < 1_100_000
    state = copy.deepcopy(record)
    _src(state)["bits"] = base64.b64encode(bomb).decode()
    code, out = _audit_child(_save(tmp_path, state, "bomb.json"))
    assert code == 0 and "RC=2" in out and "bomb.json" in out, out
    grew = int(out.split("GREW_MIB=")[1].split()[0])
    assert grew < 100, out


def _stream(root, start, n, end):
    w = ShardWriter(root, append=True, max_shard_samples=6, prefix=f"p{start}")
    for i in range(start, start + n):
        w.write({"__key__": f"new-{i:05d}", "cls": i})
    w.end_stream() if end else w.close()


def test_a_stream_sample_missed_after_a_resume_fails_the_audit(tmp_path, capsys):
    """A followed stream, audited over a run and its resumed run: whole, exit 0;
    one sample the resumed run should have delivered taken out, exit 1."""
    root = str(tmp_path / "s")
    _stream(root, 0, 24, end=False)

    def make():
        return Loader(ShardDataset(root, follow=True, poll_s=0.02, idle_timeout_s=30), 4, audit=True)

    with make() as a:
        it = iter(a)
        for _ in range(3):
            next(it)
        state, rec_a = a.state_dict(), a.audit_state()
    _stream(root, 24, 16, end=True)
    with make() as b:
        b.load_state_dict(state)
        keys_of(b)
        rec_b = b.audit_state()
    pa, pb = A.save(rec_a, tmp_path / "a.json"), A.save(rec_b, tmp_path / "b.json")
    assert cli(["audit", pa, pb]) == 0
    capsys.readouterr()
    src = rec_b["epochs"]["0"]["sources"][0]
    bits = A.decode(src["bits"], rec_b["sources"][0]["samples"], "test")
    hit = int(np.flatnonzero(np.unpackbits(bits))[5])  # a sample the resumed run delivered
    assert hit >= 12
    bits[hit >> 3] &= ~np.uint8(128 >> (hit & 7))
    src["bits"], src["delivered"] = A.encode(bits), src["delivered"] - 1
    assert cli(["audit", pa, A.save(rec_b, tmp_path / "b2.json")]) == 1
    out = capsys.readouterr().out
    assert "1 samples missed" in out and f"[{hit}]" in out


def test_max_samples_argument_is_bounded(record, tmp_path, capsys):
    path = _save(tmp_path, record)
    assert cli(["audit", "--max-samples", "0", path]) == 2
    assert "--max-samples" in capsys.readouterr().out
    assert cli(["audit", "--max-samples", "39", path]) == 2  # the record claims 40
    assert cli(["audit", "--max-samples", "40", path]) == 0
    json.loads(open(path).read())
    assert os.path.exists(path)
