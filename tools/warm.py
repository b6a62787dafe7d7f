"""`python -m shardfeed.tools.warm`: compile shardfeed's jitted kernels once.

numba compiles each kernel the first time a process calls it and keeps the
machine code in a cache folder keyed by the sources (formats/jit.py), so only
the first run after installing or upgrading pays for it. `make` runs this
right after installing, so that cost is a set-up step, not the first epoch of
a user's first job: it reads a tiny dataset written here through every
shuffle order and the foreign-tar scanner, which calls every kernel once.
"""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile
import time

import numpy as np


def _foreign_tar(path: str) -> None:
    import io

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(4):
            data = str(i).encode()
            info = tarfile.TarInfo(f"{i:04d}.cls")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def warm(folder: str) -> int:
    """Read through every kernel once; returns the samples read."""
    from shardfeed.formats import ShardWriter, open_index
    from shardfeed.loader import Loader, ShardDataset

    root = os.path.join(folder, "ds")
    with ShardWriter(root, max_shard_samples=8) as w:
        for i in range(32):
            w.write({"__key__": f"{i:04d}", "cls": i % 4, "bin": bytes([i]) * 16,
                     "npy": np.full(4, i, np.uint16)})
    n = 0
    for order in ("none", "shard", "block", "global"):
        with Loader(ShardDataset(root, shuffle=order, seed=0), 8) as loader:
            n += sum(len(b["__key__"]) for b in loader)
    tar = os.path.join(folder, "foreign.tar")
    _foreign_tar(tar)
    n += open_index(tar).num_samples
    return n


def main() -> int:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardfeed-warm-") as folder:
        n = warm(folder)
    import numba

    print(f"shardfeed: jitted kernels ready in {time.perf_counter() - t0:.1f} s "
          f"({n} samples read; cache {numba.config.CACHE_DIR})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
