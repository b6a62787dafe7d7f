"""The ahead-of-time compiled kernels (formats/aot*.py) against numba's JIT.

The compiled module is the one ``python -m shardfeed.tools.warm`` builds for
these sources (``make venv`` runs it before ``make test``); a checkout whose
sources changed since has none, and the session builds it once (about a
minute) or skips where no C compiler is there to build it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import labelled_sample
from shardfeed.formats import ShardWriter
from shardfeed.formats.compiler import aot, jit


def _run(code: str, env: dict | None = None, timeout: int = 300) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **(env or {})),
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def aot_folder() -> str:
    folder = jit.aot_dir()
    if aot.load(folder, jit.KEY) is None:
        out = subprocess.run([sys.executable, "-m", "shardfeed.tools.warm"], capture_output=True, text=True,
                             timeout=900)
        if aot.load(folder, jit.KEY) is None:
            pytest.skip(f"the compiled kernel module could not be built here: {out.stderr[-500:]}")
    return folder


READ = textwrap.dedent("""
    import json, sys
    import xxhash
    from shardfeed.formats.compiler import jit
    from shardfeed.loader import Loader, ShardDataset

    def probe(sample):
        sample["numba"] = "numba" in sys.modules
        return sample

    if __name__ == "__main__":
        roots = json.loads(sys.argv[1]) if len(sys.argv) > 1 else ROOTS
        out, worker_numba = {}, False
        for fmt, root in roots.items():
            for order in ("none", "global"):
                for workers, ctx in ((0, None), (2, "fork"), (2, "spawn")):
                    if ctx == "spawn" and (fmt, order) != ("tar", "global"):
                        continue  # one spawned read: workers that import shardfeed afresh
                    ds = ShardDataset(root, shuffle=order, seed=3, transform=probe)
                    keys, h = [], xxhash.xxh3_64()
                    with Loader(ds, 16, num_workers=workers, multiprocessing_context=ctx) as loader:
                        for b in loader:
                            keys += list(b["__key__"])
                            for x in b["bin"]:
                                h.update(x)
                            h.update(json.dumps([int(c) for c in b["cls"]]).encode())
                            worker_numba |= any(bool(v) for v in b["numba"])
                    out[f"{fmt}/{order}/{workers}/{ctx}"] = [keys, h.hexdigest()]
        print(json.dumps({"reads": out, "numba": "numba" in sys.modules, "jit": jit.jit_in_use(),
                          "worker_numba": bool(worker_numba)}))
""")


@pytest.fixture(scope="module")
def both_paths(make_ds, aot_folder, tmp_path_factory):
    roots = {"tar": make_ds(96, 16), "parquet": make_ds(96, 16, format="parquet")}
    script = tmp_path_factory.mktemp("aot") / "read.py"
    script.write_text(READ.replace("ROOTS", repr(roots)))
    code = f"import runpy, sys; sys.argv = ['read.py']; runpy.run_path({str(script)!r}, run_name='__main__')"
    return _run(code, {"SHARDFEED_AOT": "1"}), _run(code, {"SHARDFEED_AOT": "0"})


@pytest.fixture(scope="module")
def make_ds(tmp_path_factory):
    base = tmp_path_factory.mktemp("aotds")
    counter = iter(range(1000))

    def make(n, shard_samples, format="tar"):
        root = str(base / f"ds{next(counter)}")
        with ShardWriter(root, format=format, max_shard_samples=shard_samples) as w:
            for i in range(n):
                w.write(labelled_sample(i))
        return root

    return make


def test_compiled_and_jitted_kernels_read_the_same_samples(both_paths):
    compiled, jitted = both_paths
    assert compiled["reads"].keys() == jitted["reads"].keys()
    for name, (keys, digest) in compiled["reads"].items():
        assert len(keys) == 96 and len(set(keys)) == 96, name
        assert [keys, digest] == jitted["reads"][name], f"{name}: the compiled kernels read other samples"
    # the orders really differ, so equal reads are not a coincidence of one order
    assert compiled["reads"]["tar/none/0/None"][0] != compiled["reads"]["tar/global/0/None"][0]


def test_a_fresh_process_reads_without_numba(both_paths):
    compiled, _ = both_paths
    assert not compiled["jit"], "a kernel fell back to the JIT on a plain read"
    assert not compiled["numba"] and not compiled["worker_numba"]


def test_shardfeed_aot_0_forces_the_jit(both_paths):
    _, jitted = both_paths
    assert jitted["jit"] and jitted["numba"]


@pytest.mark.parametrize("value", [
    np.zeros(3, np.uint8), np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int64, order="F"),
    np.zeros((4, 4), np.float32)[:, ::2], np.zeros(5, np.bool_)[::2], np.frombuffer(b"abcd", np.uint8),
    np.zeros(2, np.uint64), np.zeros((3, 1, 2), np.int16), 0, -5, 2**40, 2**63 - 1, 2**63, -2**63 + 1,
    True, 1.5, np.int64(3), np.uint64(2**64 - 1), np.int32(-1), np.bool_(False), np.float64(2.0), np.uint8(7),
])
def test_fingerprint_is_numbas_type_name(value):
    numba = pytest.importorskip("numba")
    assert aot.fingerprint(value) == str(numba.typeof(value))
    assert aot.fingerprints([value, value]) == (aot.fingerprint(value),) * 2  # the per-call fast path


@pytest.mark.parametrize("value", [np.zeros(3, ">i8"), np.zeros(2, object), np.zeros(2, "U3"), 2**64, -2**64, -2**63,
                                   "text", None, (1, 2), np.ma.masked_array([1, 2])])
def test_fingerprint_declines_types_it_cannot_name(value):
    assert aot.fingerprint(value) is None
    assert aot.fingerprints([value]) == (None,)


def _copy(folder, tmp_path):
    dst = tmp_path / "aot"
    shutil.copytree(folder, dst)
    return str(dst)


def test_the_built_module_loads(aot_folder, tmp_path):
    loaded = aot.load(_copy(aot_folder, tmp_path), jit.KEY)
    assert loaded is not None and loaded.variants("shardfeed.formats.engine.kernels:tar_gather")


def _edit_manifest(folder, **changes):
    path = os.path.join(folder, aot.MANIFEST)
    with open(path) as f:
        man = json.load(f)
    man.update(changes)
    with open(path, "w") as f:
        json.dump(man, f)
    return man


@pytest.mark.parametrize("damage", ["truncated", "other sources", "other numba", "garbage manifest",
                                    "no manifest", "missing symbol", "missing module"])
def test_a_stale_or_corrupt_module_is_ignored(aot_folder, tmp_path, damage):
    folder = _copy(aot_folder, tmp_path)
    with open(os.path.join(folder, aot.MANIFEST)) as f:
        man = json.load(f)
    so = os.path.join(folder, man["file"])
    if damage == "truncated":
        with open(so, "r+b") as f:
            f.truncate(os.path.getsize(so) // 3)
    elif damage == "other sources":
        _edit_manifest(folder, key="0" * 16)
    elif damage == "other numba":
        _edit_manifest(folder, versions=dict(man["versions"], numba="0.1"))
    elif damage == "garbage manifest":
        with open(os.path.join(folder, aot.MANIFEST), "w") as f:
            f.write('{"format": 1, "ke')
    elif damage == "no manifest":
        os.remove(os.path.join(folder, aot.MANIFEST))
    elif damage == "missing symbol":
        kernels = dict(man["kernels"])
        kernels["shardfeed.formats.engine.kernels:tar_sizes"] = [["no_such_symbol", ["int64"]]]
        _edit_manifest(folder, kernels=kernels)
    elif damage == "missing module":
        os.remove(so)
    assert aot.load(folder, jit.KEY) is None


CORRUPT_READ = textwrap.dedent("""
    import json, sys
    from shardfeed.formats.compiler import jit
    from shardfeed.loader import Loader, ShardDataset
    with Loader(ShardDataset(ROOT, shuffle="global", seed=1), 10) as loader:
        keys = [k for b in loader for k in b["__key__"]]
    print(json.dumps({"keys": keys, "jit": jit.jit_in_use(), "aot": jit.AOT is not None}))
""")


def test_a_read_with_a_truncated_module_uses_the_jit(make_ds, aot_folder, tmp_path):
    root = make_ds(30, 10)
    cache = tmp_path / "xdg"
    folder = os.path.join(str(cache), os.path.relpath(jit.aot_dir(), _xdg_base()))
    shutil.copytree(aot_folder, folder)
    with open(os.path.join(folder, aot.MANIFEST)) as f:
        so = os.path.join(folder, json.load(f)["file"])
    with open(so, "r+b") as f:
        f.truncate(4096)
    env = {"XDG_CACHE_HOME": str(cache), "NUMBA_CACHE_DIR": jit.cache_dir()}  # numba's cache as warmed
    damaged = _run(CORRUPT_READ.replace("ROOT", repr(root)), env)
    good = _run(CORRUPT_READ.replace("ROOT", repr(root)))
    assert damaged["jit"] and not damaged["aot"]
    assert good["aot"] and not good["jit"]
    assert damaged["keys"] == good["keys"] and sorted(good["keys"]) == [f"{i:08d}" for i in range(30)]


def _xdg_base() -> str:
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


FALLBACK = textwrap.dedent("""
    import json
    import numpy as np
    from shardfeed.formats.compiler import jit
    from shardfeed.formats.engine import kernels
    buf = np.frombuffer(b" 12 -7 x", np.uint8).copy()
    starts, sizes = np.array([0, 3, 7], np.int64), np.array([3, 3, 1], np.int64)
    out1, ok1 = kernels.parse_ints(buf, starts, sizes)  # as a read calls it
    before = jit.jit_in_use()
    import pickle
    same = pickle.loads(pickle.dumps(kernels._parse_ints)) is kernels._parse_ints  # a proxy pickles by name
    out2, ok2 = np.zeros(3, np.int64), np.zeros(3, np.bool_)
    kernels._parse_ints(buf, starts.astype(np.int32), sizes.astype(np.int32), out2, ok2)  # int32: not compiled
    print(json.dumps({"same": same, "before": before, "after": jit.jit_in_use(), "a": [out1.tolist(), ok1.tolist()],
                      "b": [out2.tolist(), ok2.tolist()], "kernel": type(kernels._parse_ints).__name__}))
""")


def test_a_type_the_module_lacks_goes_to_the_jit(aot_folder):
    out = _run(FALLBACK, {"SHARDFEED_AOT": "1"})
    assert not out["before"] and out["after"] and out["same"]
    assert out["a"] == out["b"] == [[12, -7, 0], [True, True, False]]
    assert out["kernel"] == "CPUDispatcher"  # the module's global now names numba's dispatcher


LARGE = textwrap.dedent("""
    import json, sys
    from shardfeed.formats.compiler import jit
    from shardfeed.formats.engine.into_bytes import IntoBytes
    from shardfeed.loader import Loader, ShardDataset

    plans, plan = [], IntoBytes.plan
    IntoBytes.plan = lambda self, *a: plans.append(plan(self, *a)) or plans[-1]
    n = 0
    with Loader(ShardDataset(ROOT, shuffle="none"), 4) as loader:
        for _ in range(2):  # shards to open (the general path), then all open (the steady path)
            for b in loader:
                n += sum(map(len, b["bin"]))
    print(json.dumps({"bytes": n, "into": sum(p is not None for p in plans), "jit": jit.jit_in_use(),
                      "numba": "numba" in sys.modules}))
""")


def test_values_gathered_into_bytes_read_without_numba(aot_folder, tmp_path):
    """The kernels of a large-value read (formats/engine/into_bytes.py) are in the compiled module:
    `shardfeed warm` reads such values, so a fresh process does not fall back to the JIT on them."""
    root = str(tmp_path / "large")
    with ShardWriter(root, max_shard_samples=5) as w:
        for i in range(12):
            w.write({"__key__": f"{i:04d}", "cls": i, "bin": bytes([i]) * (40 << 10)})
    out = _run(LARGE.replace("ROOT", repr(root)), {"SHARDFEED_AOT": "1"})
    assert out["bytes"] == 2 * 12 * (40 << 10) and out["into"] == 6  # every batch gathered into bytes
    assert not out["jit"] and not out["numba"]
