"""Shared fixtures: small labelled datasets written by the project's own writer."""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest

from shardfeed.formats import ShardWriter

# Tests are grouped by package (tests/formats/, tests/loader/, ...) and a few reuse another's helper by
# module name (test_formats_batch takes test_loader_faults' damage helper): every group is importable
# whichever file pytest collects first.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _group in sorted(os.listdir(_HERE)):
    if os.path.isfile(os.path.join(_HERE, _group, "__init__.py")) or _group in ("data", "fuzz", "__pycache__"):
        continue
    if os.path.isdir(os.path.join(_HERE, _group)) and os.path.join(_HERE, _group) not in sys.path:
        sys.path.append(os.path.join(_HERE, _group))


# Hostile input (damaged records, logs, shards, absurd arguments) must end in an error, never a
# hang or a runaway allocation: a test marked ``hostile`` fails past its time limit (pytest-timeout)
# and meets MemoryError past its memory cap (address space above what the process already maps,
# set around the test body only, so fixtures that build data are not capped).
HOSTILE_TIMEOUT_S = 120
HOSTILE_MEMORY = 1 << 30


@contextlib.contextmanager
def memory_cap(extra: int = HOSTILE_MEMORY):
    """RLIMIT_AS (soft) at what the process maps now + ``extra`` bytes, restored after the block."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        cap = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + extra
    for limit in (soft, hard):
        if limit != resource.RLIM_INFINITY:
            cap = min(cap, limit)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield cap
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def pytest_configure(config):
    config.addinivalue_line("markers", "hostile(timeout=s, memory=bytes): a hostile-input case, bounded in time "
                                       f"(default {HOSTILE_TIMEOUT_S} s) and memory (default {HOSTILE_MEMORY >> 20} "
                                       "MiB more than mapped at its start)")


def pytest_collection_modifyitems(config, items):
    from tiers import in_tier2

    for item in items:
        if in_tier2(item.nodeid):
            item.add_marker(pytest.mark.tier2)
        mark = item.get_closest_marker("hostile")
        if mark is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(mark.kwargs.get("timeout", HOSTILE_TIMEOUT_S)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    mark = item.get_closest_marker("hostile")
    if mark is None:
        yield
        return
    with memory_cap(mark.kwargs.get("memory", HOSTILE_MEMORY)):
        yield


def labelled_sample(i: int, payload_bytes: int = 64) -> dict:
    """Deterministic sample ``i``: key, class label, text, and a payload that
    encodes ``i`` so a misplaced or damaged sample is visible."""
    rng = np.random.default_rng(i)
    return {
        "__key__": f"{i:08d}",
        "cls": i % 10,
        "txt": f"sample {i}",
        "bin": rng.integers(0, 256, payload_bytes, dtype=np.uint8).tobytes(),
    }


@pytest.fixture
def make_dataset(tmp_path):
    """``make_dataset(n, shard_samples=..., format=..., **writer_kwargs) -> root``.

    Writes ``labelled_sample(0..n-1)`` into a fresh folder under tmp_path.
    """
    counter = iter(range(1_000_000))

    def make(n: int = 100, shard_samples: int = 25, format: str = "tar", **kwargs) -> str:
        root = str(tmp_path / f"ds{next(counter)}")
        with ShardWriter(root, format=format, max_shard_samples=shard_samples, **kwargs) as w:
            for i in range(n):
                w.write(labelled_sample(i))
        return root

    return make


def flip_byte(path: str, offset: int, mask: int = 0xFF) -> None:
    """Damage one byte of a file in place: XOR the byte at ``offset`` with ``mask``
    (0xFF flips every bit, ``1 << k`` flips bit k)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def _atomic_conditional_puts() -> None:
    """S3 runs a put with ``If-None-Match: *`` as one step; moto checks that the key is absent, then
    stores it, so two racing puts can both succeed (seen: two writers both committing log entry 8).
    One lock around moto's object puts restores S3's guarantee, which the commit log stands on."""
    import functools
    import threading

    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "_atomic", False):
        return
    lock = threading.Lock()
    for name in ("put_object", "_key_response_post"):  # a single put; the completion of a multipart upload
        real = getattr(S3Response, name)

        @functools.wraps(real)
        def locked(*args, _real=real, **kwargs):
            with lock:
                return _real(*args, **kwargs)

        locked._atomic = True
        setattr(S3Response, name, locked)


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's real S3 server on a loopback port, one per test module: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    _atomic_conditional_puts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    yield f"http://127.0.0.1:{port}"
    server.stop()
