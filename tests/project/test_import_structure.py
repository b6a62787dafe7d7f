"""What a fresh process imports: `import shardfeed.loader` loads no submodule and no heavy dependency;
`from shardfeed.loader import Loader, ShardDataset` imports neither pyarrow, numba, fsspec nor
cloudpickle, with or without the compiled kernels; and reading the first batch of a local tar dataset
imports only what that read needs (no pyarrow at all, no fsspec, zstandard, matplotlib, pandas, mixture
or streaming code; no numba when the compiled kernels serve).

Structural, not timed: each check runs in a new interpreter and inspects sys.modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardfeed.formats import ShardWriter

# never needed to import the package or to read local tar shards
NEVER = ("numba", "pyarrow.parquet", "fsspec", "matplotlib", "pandas", "zstandard", "PIL", "tqdm",
         "shardfeed.loader.mixture", "shardfeed.loader.feeds.mixture_epochs", "shardfeed.formats.writer",
         "shardfeed.cache.storage.store", "shardfeed.tools")


def _fresh(code: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_REPORT = ("import json, sys\n"
           "from shardfeed.formats.compiler import jit\n"
           "print(json.dumps({'mods': sorted(set(sys.modules) - before), 'aot': jit.AOT is not None}))\n")


@pytest.mark.parametrize("aot", ["1", "0"])
def test_import_shardfeed_loader_imports_no_submodule_and_nothing_heavy(aot):
    before, got = _fresh("import json, sys, torch\nbefore = sorted(sys.modules)\nimport shardfeed.loader\n"
                         "print(json.dumps([before, sorted(sys.modules)]))", SHARDFEED_AOT=aot)
    added = sorted(set(got) - set(before))  # what shardfeed adds to torch's own imports (torch brings tqdm)
    heavy = [m for m in added if m in NEVER or m.split(".")[0] in ("pyarrow", "numba", "xxhash")]
    assert heavy == []
    ours = [m for m in added if m.startswith("shardfeed.")]
    assert ours == ["shardfeed.formats", "shardfeed.formats.base", "shardfeed.formats.base.lazy", "shardfeed.loader"]


# what no import of the loader's names needs, compiled kernels or not (numba: imported at the first
# kernel call when they are missing, not when a module with kernels is imported)
NOT_AT_IMPORT = ("pyarrow", "numba", "llvmlite", "fsspec", "cloudpickle", "pandas", "zstandard", "secrets")


@pytest.mark.parametrize("aot", ["1", "0"])
def test_importing_loader_and_dataset_imports_no_heavy_dependency(aot):
    got = _fresh("import json, sys, torch\nbefore = set(sys.modules)\n"
                 "from shardfeed.loader import Loader, ShardDataset\n"
                 "print(json.dumps(sorted(set(sys.modules) - before)))", SHARDFEED_AOT=aot)
    assert "shardfeed.loader.dataset" in got
    assert [m for m in got if m.split(".")[0] in NOT_AT_IMPORT] == []


def test_public_names_still_import_and_name_their_modules():
    got = _fresh("import json\nfrom shardfeed.loader import BatchSchedule, Loader, Mixture, ShardDataset, Stage,"
                 " WorkerError\nfrom shardfeed.formats import ShardError, ShardWriter, open_index\n"
                 "from shardfeed.cache import ShardCache\nfrom shardfeed.shuffling import EpochPlan\n"
                 "import shardfeed.loader as L\n"
                 "print(json.dumps([c.__module__ for c in (Loader, Mixture, ShardDataset, ShardCache, EpochPlan,"
                 " ShardWriter)] + [L.Loader is Loader, 'Loader' in dir(L)]))")
    assert got == ["shardfeed.loader.loader", "shardfeed.loader.mixture", "shardfeed.loader.dataset",
                   "shardfeed.cache.storage.store", "shardfeed.shuffling.plan", "shardfeed.formats.writer", True, True]
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        import shardfeed.loader
        shardfeed.loader.NoSuchName  # noqa: B018


def test_first_batch_of_a_local_tar_read_imports_only_what_the_read_needs(tmp_path):
    with ShardWriter(str(tmp_path), format="tar", max_shard_samples=100) as w:
        for i in range(300):
            w.write({"__key__": f"{i:05d}", "bin": bytes([i % 251]) * 64, "cls": i})
    for order in ("global", "none"):
        got = _fresh("import sys, torch\nbefore = set(sys.modules)\nfrom shardfeed.loader import Loader, ShardDataset\n"
                     f"b = next(iter(Loader(ShardDataset({str(tmp_path)!r}, shuffle={order!r}), batch_size=64)))\n"
                     "assert len(b['__key__']) == 64, b\n" + _REPORT)
        mods = set(got["mods"])
        assert "shardfeed.formats.engine.batch" in mods  # the read did happen, through the batch reader
        assert sorted(mods & set(NEVER) - (set() if got["aot"] else {"numba"})) == [], order
        assert [m for m in mods if m.split(".")[0] in ("pyarrow", "cloudpickle")] == [], order  # index, sidecars
        if got["aot"]:  # the compiled kernels serve: numba stays out (without them the JIT needs it)
            assert not [m for m in mods if m.startswith(("numba", "llvmlite"))]


# what only other reads need: the commit log and streaming (a followed or growing dataset), columnar and
# compressed shards, scanning a foreign tar, and ShardInfo (writers, the log): a local tar read with an
# index imports none of them (issue #24)
NOT_FOR_A_TAR_READ = ("shardfeed.formats.commit_log", "shardfeed.loader.feeds.stream_log",
                      "shardfeed.formats.engine.columns", "shardfeed.formats.engine.row_group_share",
                      "shardfeed.formats.engine.row_group_cache", "shardfeed.formats.engine.row_group_threads",
                      "shardfeed.formats.staging", "shardfeed.formats.arrow_checksums",
                      "shardfeed.formats.engine.decompress_thread", "shardfeed.formats.index_scan",
                      "shardfeed.formats.shard_info")

# counts what a fresh process builds at start-up: dataclasses (each compiles its generated methods) and
# the compiled kernel module (found through a hash of ~70 files' stats, then loaded)
_COUNTING = ("import dataclasses, json, sys, torch\n"
             "built, process = [], dataclasses._process_class\n"
             "def counted(cls, *a, **k):\n"
             "    if cls.__module__.startswith('shardfeed.'):  # ours (numba's JIT, without the kernels, has its own)\n"
             "        built.append(cls.__module__ + '.' + cls.__qualname__)\n"
             "    return process(cls, *a, **k)\n"
             "dataclasses._process_class = counted\n"
             "before = set(sys.modules)\n"
             "from shardfeed.loader import Loader, ShardDataset\n")
_COUNTED = ("added = sorted(set(sys.modules) - before)\n"
            "print(json.dumps({'dataclasses': built, 'mods': added}))\n")


@pytest.mark.parametrize("aot", ["1", "0"])
def test_importing_loader_and_dataset_builds_no_dataclass_and_loads_no_kernel_module(aot):
    got = _fresh(_COUNTING + "imported = sorted(set(sys.modules) - before)\n"
                 "from shardfeed.formats.compiler import jit\n"
                 "made = vars(jit).get('_lazy', vars(jit))  # computed so far (before: at import)\n"
                 "print(json.dumps({'dataclasses': built, 'mods': imported, 'made': [k for k in ('KEY', 'AOT') "
                 "if k in made]}))",
                 SHARDFEED_AOT=aot)
    assert got["dataclasses"] == []
    assert [m for m in got["mods"] if m.startswith("sf_aot_")] == []  # loaded at the first kernel call
    assert got["made"] == []  # nor is the sources' key computed
    assert sorted(set(got["mods"]) & set(NOT_FOR_A_TAR_READ)) == []
    assert sorted(set(got["mods"]) & set(READ_PATH)) == []  # imported at the first read
    assert sorted(set(got["mods"]) & set(TABLE_READERS)) == []  # imported when the index is read


# the read path: imported at the first batch, not with the names of Loader and ShardDataset
READ_PATH = ("shardfeed.formats.engine.batch", "shardfeed.formats.engine.kernels", "shardfeed.loader.batcher",
             "shardfeed.loader.collate", "shardfeed.formats.readers")


# the pyarrow-free readers of index.arrow and the sidecars: the dataset's opening imports them (issue #24)
TABLE_READERS = ("shardfeed.formats.own_tables", "shardfeed.formats.arrow_ipc", "shardfeed.formats.flatbuffer")


def test_the_first_batch_of_a_local_tar_read_builds_no_dataclass(tmp_path):
    with ShardWriter(str(tmp_path), format="tar", max_shard_samples=100) as w:
        for i in range(300):
            w.write({"__key__": f"{i:05d}", "bin": bytes([i % 251]) * 64, "cls": i})
    for order in ("global", "none"):
        got = _fresh(_COUNTING + f"b = next(iter(Loader(ShardDataset({str(tmp_path)!r}, shuffle={order!r}), "
                     "batch_size=64)))\nassert len(b['__key__']) == 64, b\n" + _COUNTED)
        assert sorted(set(READ_PATH) - set(got["mods"])) == []  # the read did happen, through the batch reader
        assert got["dataclasses"] == [], order
        assert sorted(set(got["mods"]) & set(NOT_FOR_A_TAR_READ)) == [], order
