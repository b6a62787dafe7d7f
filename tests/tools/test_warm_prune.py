"""`shardfeed warm` removes kernel folders of other sources that no process
has used for --keep-days, and nothing else; loading kernels marks a folder used."""

from __future__ import annotations

import os
import time

from shardfeed.formats.compiler.jit import LAST_USED, touch_used
from shardfeed.tools.warm import prune

DAY = 86400


def _folder(root, name: str, age_days: float, used_days: float | None = None, size: int = 1000) -> str:
    path = os.path.join(root, name)
    os.makedirs(os.path.join(path, "aot-x"))
    with open(os.path.join(path, "aot-x", "k.so"), "wb") as f:
        f.write(b"\0" * size)
    now = time.time()
    if used_days is not None:
        open(os.path.join(path, LAST_USED), "w").close()
        os.utime(os.path.join(path, LAST_USED), (now - used_days * DAY,) * 2)
    os.utime(path, (now - age_days * DAY,) * 2)
    return path


def test_prune_removes_only_old_unused_key_folders(tmp_path):
    root = str(tmp_path)
    old = _folder(root, "0123456789abcdef", age_days=30, size=4096)  # never marked, old
    stale = _folder(root, "00000000000000aa", age_days=1, used_days=20, size=100)  # marked long ago
    recent = _folder(root, "fedcba9876543210", age_days=30, used_days=2)  # old, but used lately
    current = _folder(root, "1111111111111111", age_days=90)  # the running sources' own folder
    other = _folder(root, "not-a-key", age_days=90)  # not named like ours: never touched
    with open(os.path.join(root, "2222222222222222"), "w") as f:  # a file, not a folder
        f.write("x")
    removed, freed = prune(root, keep="1111111111111111", keep_days=14)
    assert removed == 2 and freed == 4096 + 100
    assert not os.path.exists(old) and not os.path.exists(stale)
    for kept in (recent, current, other, os.path.join(root, "2222222222222222")):
        assert os.path.exists(kept)
    assert prune(root, keep="1111111111111111", keep_days=14) == (0, 0)
    assert prune(str(tmp_path / "missing"), keep="x", keep_days=14) == (0, 0)


def test_touch_used_marks_a_folder_kept(tmp_path):
    root = str(tmp_path)
    path = _folder(root, "abcdefabcdefabcd", age_days=60)
    touch_used(path)  # a process loaded these kernels just now
    assert prune(root, keep="", keep_days=14) == (0, 0)
    os.utime(os.path.join(path, LAST_USED), (time.time() - 15 * DAY,) * 2)
    touch_used(path)  # an existing mark is moved to now
    assert time.time() - os.stat(os.path.join(path, LAST_USED)).st_mtime < DAY
    assert prune(root, keep="", keep_days=14) == (0, 0)
    assert prune(root, keep="", keep_days=14, now=time.time() + 15 * DAY)[0] == 1
