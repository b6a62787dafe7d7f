"""Jitted code cannot go stale: the numba cache folder is keyed by every
kernel package's source.

Regression for the mutation test that found ``sequences.py`` still running an
old inlined ``permute_one`` from numba's cache after permutation.py changed
(numba checks only the compiled function's own file)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from shardfeed.formats.compiler import jit


def test_key_changes_when_any_kernel_module_changes(tmp_path):
    dirs = []
    for name in ("formats", "shuffling"):
        src = os.path.dirname(__import__(f"shardfeed.{name}", fromlist=["x"]).__file__)
        dst = tmp_path / name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        dirs.append(str(dst))
    before = jit.source_key(dirs)
    assert jit.source_key(dirs) == before  # stable
    path = os.path.join(dirs[1], "permutation.py")
    with open(path, "a") as f:
        f.write("\n# a change in a module that others inline\n")
    assert jit.source_key(dirs) != before


def test_every_package_with_a_kernel_is_in_the_key():
    """A package whose modules jit a kernel (import the compile layer's njit) is hashed into the key:
    left out, an edit or a move of its kernels met an old compiled module (cache/planning/simulate.py
    after the cache moved into rooms: the old paths sent the whole process to numba's JIT)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    with_kernels = {f"shardfeed.{path.relative_to(root).parts[0]}"
                    for pkg in ("formats", "shuffling", "cache", "loader", "tools")
                    for path in (root / pkg).rglob("*.py")
                    if "from shardfeed.formats.compiler.jit import njit" in path.read_text()}
    assert with_kernels >= {"shardfeed.formats", "shardfeed.shuffling", "shardfeed.cache"}
    assert with_kernels <= set(jit._KERNEL_PACKAGES), sorted(with_kernels - set(jit._KERNEL_PACKAGES))


def test_the_cache_folder_is_the_keyed_one():
    # in a process on numba's JIT: with the compiled kernel module, this one may never configure numba
    code = ("import shardfeed.shuffling, numba; from shardfeed.formats.compiler import jit; "
            "print(numba.config.CACHE_DIR); print(jit.cache_dir())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, SHARDFEED_AOT="0"), capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == out[1] == jit.cache_dir()
    assert os.path.basename(jit.cache_dir()) == jit.source_key(jit._package_dirs())


def test_a_user_choice_of_cache_folder_wins(tmp_path):
    code = "import numba, shardfeed.shuffling; print(numba.config.CACHE_DIR)"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path)


def test_the_remembered_key_is_the_computed_one_and_follows_every_change(tmp_path):
    src = os.path.dirname(__import__("shardfeed.shuffling", fromlist=["x"]).__file__)
    dirs = [str(tmp_path / "shuffling")]
    shutil.copytree(src, dirs[0], ignore=shutil.ignore_patterns("__pycache__"))
    memo = str(tmp_path / "cache" / "source-keys.json")
    first = jit.memo_source_key(dirs, memo)
    assert first == jit.source_key(dirs) and os.path.exists(memo)
    assert jit.memo_source_key(dirs, memo) == first  # served from the memo
    # a change of one byte that keeps the size and puts the mtime back: still a new key (ctime moved)
    path = os.path.join(dirs[0], "permutation.py")
    st = os.stat(path)
    data = bytearray(open(path, "rb").read())
    data[-2] = ord("#") if data[-2] != ord("#") else ord(" ")
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert jit.memo_source_key(dirs, memo) == jit.source_key(dirs) != first
    # a damaged memo is ignored and rewritten
    with open(memo, "w") as f:
        f.write("{not json")
    assert jit.memo_source_key(dirs, memo) == jit.source_key(dirs)
    assert jit.KEY == jit.source_key(jit._package_dirs())  # this process's key is the computed one
