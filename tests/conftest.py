"""Shared fixtures: small labelled datasets written by the project's own writer."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's real S3 server on a loopback port, one per test module: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    yield f"http://127.0.0.1:{port}"
    server.stop()
