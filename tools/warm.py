"""`shardfeed warm` (or `python -m shardfeed.tools.warm`): compile shardfeed's kernels once.

Without this step every fresh process (and every worker) pays numba's set-up,
about 0.5 s, on its first batch, and the very first run after installing or
upgrading also compiles every kernel (seconds). `make venv` runs it right
after installing, so both are a set-up step rather than the first epoch of a
user's job. It reads a tiny dataset written here through every shuffle order,
format and read mode, and scans a foreign tar, under numba's JIT (which fills
numba's cache), then compiles every signature those reads used into one
extension module (formats/compiler/aot_build.py) that later processes load instead of
numba. Without a C compiler the second part fails and says so: reads then
use numba's JIT as before. It also compiles shardfeed's modules to bytecode
(``__pycache__``), which an editable checkout under ``PYTHONDONTWRITEBYTECODE=1``
never gets otherwise: every fresh process would compile all ~75 modules its
first batch imports from source again (about twice the import's time). Last,
it removes the kernel folders of other sources (older versions, other
checkouts) that no process has used for ``--keep-days`` days.

Progress: the reads advance a bar step by step; the build is one long call
(a minute or more on a loaded machine), so its bar advances with the clock
against an estimate: the last build's seconds per signature on this machine
(``last-build.json`` beside the kernel folders), else a minute. On a terminal
only; elsewhere each phase prints its line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from contextlib import contextmanager

import numpy as np


def _foreign_tar(path: str) -> None:
    import io

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(4):
            data = str(i).encode()
            info = tarfile.TarInfo(f"{i:04d}.cls")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


WARM_STEPS = 19  # the reads warm() makes: 16 loader passes (orders x formats x read modes), large values, foreign tar,
# the kernels off the read path


def warm(folder: str, step=lambda: None) -> int:
    """Read through every kernel once (``step()`` after each of the WARM_STEPS reads); returns the samples read."""
    from shardfeed.formats import ShardWriter, open_index
    from shardfeed.loader import Loader, ShardDataset

    n = 0
    for fmt in ("tar", "parquet", "arrow"):
        root = os.path.join(folder, fmt)
        with ShardWriter(root, format=fmt, max_shard_samples=8) as w:
            for i in range(32):
                w.write({"__key__": f"{i:04d}", "cls": i % 4, "bin": bytes([i]) * 16,
                         "npy": np.full(4, i, np.uint16)})
        modes = ("pread", "mmap") if fmt == "tar" else ("pread",)
        for mode in modes:
            for order in ("none", "shard", "block", "global"):
                with Loader(ShardDataset(root, shuffle=order, seed=0, read_mode=mode), 8) as loader:
                    n += sum(len(b["__key__"]) for b in loader)
                step()
    # values large enough to be gathered straight into bytes objects (formats/engine/into_bytes.py)
    root = os.path.join(folder, "large")
    with ShardWriter(root, format="tar", max_shard_samples=4) as w:
        for i in range(8):
            w.write({"__key__": f"{i:04d}", "cls": i % 4, "bin": bytes([i]) * (20 << 10)})
    with Loader(ShardDataset(root, shuffle="none"), 4) as loader:  # two epochs: shards to open, then open
        n += sum(len(b["__key__"]) for _ in range(2) for b in loader)
    step()
    tar = os.path.join(folder, "foreign.tar")
    _foreign_tar(tar)
    n += open_index(tar).num_samples
    step()
    _kernels_off_the_read_path()
    step()
    return n


DEFAULT_BUILD_S = 60.0  # the first build's estimate, before this machine measured one


def _record_path() -> str:
    from shardfeed.formats.compiler import jit

    return os.path.join(os.path.dirname(jit.cache_dir()), "last-build.json")


def build_estimate(signatures: int, record: str | None = None) -> float:
    """Seconds the build of ``signatures`` should take here: the last build's rate, else DEFAULT_BUILD_S."""
    import json

    try:
        with open(record or _record_path()) as f:
            last = json.load(f)
        return max(1.0, signatures * float(last["seconds"]) / max(1, int(last["signatures"])))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_BUILD_S


def save_build(signatures: int, seconds: float, record: str | None = None) -> None:
    import json

    try:
        with open(record or _record_path(), "w") as f:
            json.dump({"signatures": signatures, "seconds": round(seconds, 2)}, f)
    except OSError:
        pass  # a read-only cache: the next estimate is the default


@contextmanager
def ticking(desc: str, estimate_s: float, show: bool, stream=None):
    """A bar that advances with the clock against ``estimate_s`` while the block runs (one long call)."""
    from tqdm import tqdm

    bar = tqdm(total=round(estimate_s), desc=desc, unit="s", disable=not show, file=stream or sys.stderr,
               bar_format="{desc}: {bar} {n_fmt}/{total_fmt} s (estimate)")
    done = threading.Event()

    def tick():
        while not done.wait(1.0):
            if bar.n < bar.total - 1:  # never claims to be done before it is
                bar.update(1)

    t = threading.Thread(target=tick, name="shardfeed-warm-progress", daemon=True)
    t.start()
    try:
        yield bar
    finally:
        done.set()
        t.join()
        bar.n = bar.total
        bar.close()


def compile_bytecode() -> int:
    """Compile every shardfeed module's bytecode cache where it is missing or stale; returns the packages
    compiled (a read-only install, whose caches pip wrote, is left as it is)."""
    import compileall
    import importlib.util

    done = 0
    for name in ("formats", "cache", "shuffling", "loader", "tools"):
        spec = importlib.util.find_spec(f"shardfeed.{name}")
        for d in (spec.submodule_search_locations or []) if spec else []:
            if os.access(d, os.W_OK):
                done += bool(compileall.compile_dir(d, quiet=2))
    return done


def _kernels_off_the_read_path() -> None:
    """The kernels a plain read does not reach, called through their public APIs."""
    from shardfeed.cache.planning.simulate import simulate
    from shardfeed.shuffling import locality
    from shardfeed.shuffling.permutation import Permutation

    p = Permutation(100, 7)
    p.index(p.take(np.arange(10)))
    _ = p[3]
    for policy in ("belady", "lru"):
        simulate([10, 20, 30], np.array([0, 1, 2, 0, 1], np.int64), 40, policy)
    z = np.zeros(4, np.int64)
    one = np.ones(1, np.int64)
    locality.assign(z, np.array([4], np.int64), one, np.array([4], np.int64), np.zeros(1, np.int64), 1)


KEEP_DAYS = 14.0
_KEY_NAME = re.compile(r"[0-9a-f]{16}")  # formats.compiler.jit.source_key: only such folders are ever removed


def _last_use(folder: str) -> float:
    from shardfeed.formats.compiler.jit import LAST_USED

    try:
        return os.stat(os.path.join(folder, LAST_USED)).st_mtime
    except OSError:  # made before folders were marked: its own time (it changes as numba writes into it)
        return os.stat(folder).st_mtime


def _size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def prune(root: str, keep: str, keep_days: float, now: float | None = None) -> tuple[int, int]:
    """Remove the kernel folders under ``root`` other than ``keep`` unused for ``keep_days``;
    (folders removed, bytes freed). Anything not named like a source key is left alone."""
    now = time.time() if now is None else now
    removed = freed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0, 0
    for name in names:
        path = os.path.join(root, name)
        if name == keep or not _KEY_NAME.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            if now - _last_use(path) < keep_days * 86400:
                continue
            size = _size(path)
            shutil.rmtree(path)
        except OSError:
            continue  # in use by a build elsewhere, or not ours to remove: leave it
        removed += 1
        freed += size
    return removed, freed


def _prune(args) -> None:
    from shardfeed.formats.compiler import jit

    if args.keep_days < 0 or os.environ.get("NUMBA_CACHE_DIR"):
        return  # a numba folder the user chose is theirs to manage
    removed, freed = prune(os.path.dirname(jit.cache_dir()), jit.KEY, args.keep_days)
    if removed:
        print(f"shardfeed: removed {removed} kernel folder(s) of other sources unused for {args.keep_days:g} "
              f"days ({freed / 1e6:.1f} MB)", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-days", type=float, default=KEEP_DAYS,
                   help="remove the kernel folders of other sources unused for this many days (default "
                        "%(default)g; negative keeps everything)")
    p.add_argument("--no-aot", action="store_true",
                   help="only fill numba's cache; do not build the compiled kernel module")
    p.add_argument("--force", action="store_true",
                   help="build the compiled kernel module even if one for these sources loads already")


def main(args: argparse.Namespace | None = None) -> int:
    from shardfeed.formats.compiler import aot, jit

    args = args or argparse.Namespace(no_aot=False, force=False, keep_days=KEEP_DAYS)
    _prune(args)
    compile_bytecode()
    if not args.no_aot and not args.force and aot.load(jit.aot_dir(), jit.KEY) is not None:
        print(f"shardfeed: the compiled kernels for these sources are ready in {jit.aot_dir()} "
              "(--force builds them again)", flush=True)
        return 0
    from tqdm import tqdm

    from shardfeed.tools.text import show_progress

    show = show_progress()
    jit.use_jit()  # the build reads the signatures numba's dispatchers compile during the reads below
    t0 = time.perf_counter()
    print("shardfeed: reading through every kernel under numba's JIT (fills its cache)", flush=True)
    with tempfile.TemporaryDirectory(prefix="shardfeed-warm-") as folder, \
            tqdm(total=WARM_STEPS, desc="kernels", unit="read", disable=not show, file=sys.stderr) as bar:
        n = warm(folder, step=lambda: bar.update(1))
    import numba

    print(f"shardfeed: jitted kernels ready in {time.perf_counter() - t0:.1f} s "
          f"({n} samples read; cache {numba.config.CACHE_DIR})", flush=True)
    if args.no_aot:
        return 0
    from shardfeed.formats.compiler import aot_build

    signatures = sum(len(s) for s in aot_build.exports().values())
    estimate = build_estimate(signatures)
    print(f"shardfeed: compiling {signatures} kernel signatures into one module (about {estimate:.0f} s here)",
          flush=True)
    try:
        with ticking("compile", estimate, show):
            path, count, secs = aot_build.build()
        save_build(count, secs)
    except Exception as e:  # noqa: BLE001 - e.g. no C compiler: the JIT still serves, so say so and go on
        print(f"shardfeed: could not build the compiled kernels ({type(e).__name__}: {str(e)[:300]}); "
              "reads use numba's JIT instead (about 0.5 s more per fresh process). Install a C compiler "
              "(gcc) and run `shardfeed warm` again to make start-up fast.", file=sys.stderr, flush=True)
        return 0
    print(f"shardfeed: compiled {count} kernel signatures in {secs:.1f} s into {path} "
          f"({os.path.getsize(path) / 1e6:.1f} MB); fresh processes now start without numba", flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m shardfeed.tools.warm", description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(main(p.parse_args()))
