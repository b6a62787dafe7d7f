"""Coverage-guided fuzzing (atheris) of every parser of untrusted bytes.

    .venv/bin/pip install atheris
    .venv/bin/python tests/fuzz/atheris_targets.py TARGET [-atheris_runs=100000]

TARGET: tar, sidecar, index, log, zstd, gzip, arrow, parquet, fields. Any
exception other than ShardError (or a decoder's documented ValueError) is a
crash that atheris reports with the input that caused it.
"""

from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from shardfeed.formats import ShardError, decode_field, open_index
    from shardfeed.formats.own_tables import read_sidecar
    from shardfeed.formats.readers import ColumnarShardReader, TarShardReader

_DIR = tempfile.mkdtemp(prefix="shardfeed-fuzz-")


def _file(name: str, data: bytes) -> str:
    p = os.path.join(_DIR, name)
    with open(p, "wb") as f:
        f.write(data)
    return p


def _tar(data, suffix="tar", fmt="tar"):
    with TarShardReader(_file("x." + suffix, data), fmt) as r:
        for i in range(len(r)):
            r.read(i)


def _log(data):
    os.makedirs(os.path.join(_DIR, "live", "_log"), exist_ok=True)
    _file("live/_log/000000000001.json", data)
    open_index(os.path.join(_DIR, "live"))


def _index(data):
    os.makedirs(os.path.join(_DIR, "ds"), exist_ok=True)
    _file("ds/index.arrow", data)
    open_index(os.path.join(_DIR, "ds"))


def _columnar(fmt):
    def run(data):
        with ColumnarShardReader(_file("x." + fmt, data), fmt) as r:
            list(r)
    return run


TARGETS = {
    "tar": _tar,
    "zstd": lambda d: _tar(d, "tar.zst", "tar.zst"),
    "gzip": lambda d: _tar(d, "tar.gz", "tar.gz"),
    "sidecar": lambda d: read_sidecar(_file("x.tar.idx", d), "x.tar"),
    "index": _index,
    "log": _log,
    "arrow": _columnar("arrow"),
    "parquet": _columnar("parquet"),
    "fields": lambda d: decode_field(("cls", "txt", "json", "npy", "png")[d[0] % 5] if d else "bin", d[1:]),
}


def main() -> None:
    target = TARGETS[sys.argv.pop(1)]

    def one(data: bytes) -> None:
        try:
            target(data)
        except ShardError:
            pass
        except (ValueError, UnicodeDecodeError, OSError, SyntaxError) as e:
            if target is not TARGETS["fields"]:
                raise e

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
