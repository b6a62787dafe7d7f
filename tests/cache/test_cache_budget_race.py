"""The byte budget against the rename race, reproduced deterministically: a
fetch renaming its finished temporary into place between another fetch's
budget listing and its size checks would hide both names from the count,
and the second fetch would overshoot the limit. Renames take the node lock,
so the scan never sees that gap."""

from __future__ import annotations

import os
import threading
import time

import pytest
import xxhash

from cache_servers import Fault, RangeServer
from shardfeed.cache import FetchOptions, ShardCache

SIZE = 200_000
FAST = FetchOptions(range_bytes=1 << 20, threads=1, attempts=2, backoff_s=0.01, stall_s=10.0)


@pytest.mark.timeout(120)
def test_a_rename_during_a_budget_scan_does_not_hide_bytes(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    blobs = {}
    for name, seed in (("a.bin", 1), ("b.bin", 2)):
        data = bytes((i * seed + 7) % 251 for i in range(SIZE))
        (root / name).write_bytes(data)
        blobs[name] = xxhash.xxh3_128_hexdigest(data)
    limit = SIZE * 3 // 2  # one shard fits, two do not
    cdir = str(tmp_path / "c")
    with RangeServer(str(root)) as srv:
        srv.faults.append(Fault("b.bin", "stall", stall_s=1.0))  # b's temporary exists while its body is late
        url_a, url_b = f"{srv.url}/a.bin", f"{srv.url}/b.bin"
        cache_a, cache_b = ShardCache(cdir, limit, fetch=FAST), ShardCache(cdir, limit, fetch=FAST)
        path_b = cache_b.path_for(url_b, blobs["b.bin"])
        seen = {}

        def pause():  # between a's listing and its sizes: let b's rename land, if it can
            if seen:
                return
            deadline = time.monotonic() + 3.0
            while not os.path.exists(path_b) and time.monotonic() < deadline:
                time.sleep(0.01)
            seen["b_renamed_during_scan"] = os.path.exists(path_b)

        b = threading.Thread(target=cache_b.get, args=(url_b, blobs["b.bin"], SIZE))
        b.start()
        while not [n for n in os.listdir(cache_b.data_dir) if ".tmp-" in n]:
            time.sleep(0.005)  # b has made room and holds its temporary
        cache_a.budget._after_listing = pause
        peak = []
        with_a = threading.Thread(target=lambda: peak.append(cache_a.get(url_a, blobs["a.bin"], SIZE)))
        with_a.start()
        while with_a.is_alive() or b.is_alive():
            peak.append(_bytes_in(cache_a.data_dir))
            time.sleep(0.002)
        with_a.join()
        b.join()
    assert max(p for p in peak if isinstance(p, int)) <= limit
    assert cache_a.used_bytes() <= limit and os.path.exists(cache_a.path_for(url_a, blobs["a.bin"]))
    assert seen == {"b_renamed_during_scan": False}  # the rename waited for the scan


def _bytes_in(folder: str) -> int:
    total = 0
    for n in os.listdir(folder):
        try:
            total += os.lstat(os.path.join(folder, n)).st_size
        except FileNotFoundError:
            pass
    return total
