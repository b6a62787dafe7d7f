"""The range-serving helpers the loopback servers share: paths stay inside
the served folder, and a ranged GET answers exactly the bytes asked for."""

from __future__ import annotations

import os
import urllib.request

from shardfeed.cache.range_server import resolve
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
