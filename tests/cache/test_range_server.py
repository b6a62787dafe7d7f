"""The range-serving helpers the loopback servers share: paths stay inside
the served folder, and a ranged GET answers exactly the bytes asked for."""

from __future__ import annotations

import os
import urllib.request

from shardfeed.tools.range_server import resolve
from shardfeed.tools.train.serve import serve


def test_paths_outside_the_folder_resolve_to_nothing(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x")
    root = str(tmp_path)
    assert resolve(root, "/a.tar") == os.path.realpath(tmp_path / "a.tar")
    for bad in ("/../etc/passwd", "/%2e%2e/etc/passwd", "/%61/../../x"):
        assert resolve(root, bad) is None


def test_ranged_and_whole_gets_return_exactly_the_bytes(tmp_path):
    data = os.urandom(10_000)
    (tmp_path / "s.tar").write_bytes(data)
    with serve(str(tmp_path)) as url:
        req = urllib.request.Request(url + "/s.tar", headers={"Range": "bytes=100-4099"})
        with urllib.request.urlopen(req) as r:
            assert r.status == 206 and r.headers["Content-Range"] == "bytes 100-4099/10000"
            assert r.read() == data[100:4100]
        with urllib.request.urlopen(url + "/s.tar") as r:
            assert r.status == 200 and r.read() == data


def test_small_ranges_answer_without_a_delayed_ack_wait_gh22(tmp_path):
    """The demo's server answered each ranged GET after 44 ms whatever its size: the headers and the
    body are two writes, and with Nagle's algorithm the body waited for the client's delayed ACK of the
    headers (a 40 ms timer). Ranged readers fetch ~5 KiB samples, so that wait was most of the demo's data
    stall (issue #22). The timer is a floor no machine load lowers, so a median under 20 ms shows it gone."""
    import statistics
    import time

    from shardfeed.cache.fetching.http_source import HttpSource

    data = os.urandom(64 << 10)
    (tmp_path / "s.tar").write_bytes(data)
    with serve(str(tmp_path)) as url:
        src = HttpSource(url + "/s.tar")  # one kept-alive connection, as a reader's
        took = []
        for i in range(15):
            t0 = time.perf_counter()
            assert src.read_range(i * 4096, i * 4096 + 4600) == data[i * 4096:i * 4096 + 4600]
            took.append(time.perf_counter() - t0)
    assert statistics.median(took) < 0.020, f"ranged GETs took {[round(t * 1e3) for t in took]} ms"
