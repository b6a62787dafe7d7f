"""The libraries `shardfeed bench compare` adds to bench read's adapters, and
the interpreter each runs under.

MosaicML Streaming pins numpy < 2.2 and its package ``__init__`` imports its
torchvision-based example datasets, and PyPI's torchvision cannot load beside
the CPU torch wheel ("operator torchvision::nms does not exist": its
extension links the CUDA torch libraries). So Streaming runs in a venv of its
own (``.venv-peers``, made by ``tools/bench/install_peers.sh``: the same CPU torch,
numpy < 2.2, Streaming without torchvision) and, when its package
``__init__`` fails, its readers and writers are imported from
``streaming.base`` directly: all of the reading code is Streaming's own, only
the example datasets (``streaming.vision``, ``.text``, ``.multimodal``) are
left out. Without that venv, or when even that import fails, Streaming is
reported as skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardfeed.tools.bench.peers import ADAPTERS, Adapter, ShardfeedAdapter, _collate_dicts, _per_shard

# Which libraries run under the peers' venv instead of this interpreter.
OWN_VENV = {"streaming"}
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ShardfeedParquetAdapter(ShardfeedAdapter):
    """shardfeed over Parquet shards written by its own ShardWriter."""

    name, label = "shardfeed-parquet", "shardfeed, Parquet"
    CONFIG = ("ShardWriter(format=\"parquet\"): 8 files, its 1,024-row groups; ShardDataset + Loader as the "
              "tar row")

    def load(self, read):
        super().load(read)
        if read:
            # its read path's imports before the timing, as the pyarrow loop's load() imports pyarrow.parquet: a
            # Parquet read loads them on first use (~40 ms of a fresh process), which put them in its first batch
            import pyarrow.parquet  # noqa: F401

            import shardfeed.formats.engine.column_gather  # noqa: F401
            import shardfeed.formats.engine.columns  # noqa: F401

    def write(self, spec, folder):
        from shardfeed.formats import ShardWriter
        with ShardWriter(folder, format="parquet", max_shard_samples=_per_shard(spec)) as writer:
            for sample in spec:
                writer.write(sample)

    def files(self, folder):
        return sorted(os.path.join(folder, p) for p in os.listdir(folder) if p.endswith(".parquet"))


class ShardfeedTensorAdapter(ShardfeedAdapter):
    """shardfeed's tar path with ``Loader(bytes_as="tensor")``: payloads as uint8
    tensors viewing the batch buffer (no per-sample copy), read from the same
    shards as ``shardfeed``. The content check hashes each view in place."""

    name, label = "shardfeed-tensor", 'shardfeed, bytes_as="tensor" (no copy)'
    CONFIG = 'the shardfeed tar row\'s shards and dataset, Loader(bytes_as="tensor")'

    @property
    def data_name(self) -> str:
        return "shardfeed"

    def batches(self, folder, workers, shuffle, batch_size):
        from shardfeed.loader import Loader, ShardDataset
        dataset = ShardDataset(folder, shuffle="global" if shuffle else "none", seed=0)
        for batch in Loader(dataset, batch_size=batch_size, num_workers=workers, bytes_as="tensor"):
            yield batch["__key__"], [t.numpy() for t in batch["bin"]], batch["cls"]


_STREAMING = []


def import_streaming():
    """Streaming's MDSWriter and StreamingDataset (see the module docstring for the fallback)."""
    if _STREAMING:
        return _STREAMING
    try:
        from streaming import MDSWriter, StreamingDataset
        _STREAMING[:] = MDSWriter, StreamingDataset
        return _STREAMING
    except ImportError as e:
        if "torchvision" not in str(e) and getattr(e, "name", "") != "torchvision":
            raise
    import importlib.util
    for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
        del sys.modules[name]  # the half-imported package
    spec = importlib.util.find_spec("streaming")
    sys.modules["streaming"] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    from streaming.base import MDSWriter, StreamingDataset
    _STREAMING[:] = MDSWriter, StreamingDataset
    return _STREAMING


class StreamingAdapter(Adapter):
    """MosaicML Streaming: MDSWriter shards read by StreamingDataset + torch DataLoader,
    shuffle at its defaults (py1e, default block size)."""

    name, label = "streaming", "MosaicML Streaming"
    CONFIG = ("MDSWriter(columns={key: str, bin: bytes, cls: int}) at its default size_limit (64 MiB shards: "
              "2 at 2 KiB, 4 at 100 KiB; it splits samples, not shards, between workers), no compression; "
              "StreamingDataset(local, shuffle, batch_size) at its defaults (py1e shuffle) + torch "
              "DataLoader(batch_size, num_workers)")

    def load(self, read):
        super().load(read)
        import_streaming()

    def write(self, spec, folder):
        mds_writer, _ = import_streaming()
        # The class-ordered data of the shuffle-quality part keeps its shards of `per_shard` samples.
        per_shard = getattr(spec, "per_shard", None)
        limit = {"size_limit": per_shard * (spec.size + 64)} if per_shard else {}
        with mds_writer(out=folder, columns={"key": "str", "bin": "bytes", "cls": "int"}, **limit) as out:
            for i in range(spec.count):
                out.write({"key": spec.key(i), "bin": spec.payload(i), "cls": spec.cls(i)})

    def batches(self, folder, workers, shuffle, batch_size):
        from torch.utils.data import DataLoader
        _, streaming_dataset = import_streaming()
        dataset = streaming_dataset(local=folder, shuffle=shuffle, shuffle_seed=0, batch_size=batch_size)
        yield from DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_collate_dicts)


EXTRA = {a.name: a for a in (ShardfeedParquetAdapter(), ShardfeedTensorAdapter(), StreamingAdapter())}


def adapter(name: str) -> Adapter:
    return {**ADAPTERS, **EXTRA}[name]


def peers_python(given: str | None) -> str | None:
    """The interpreter of the peers' venv: --peers-python, else $SHARDFEED_PEERS_PYTHON,
    else .venv-peers beside this checkout when it exists; None when there is none."""
    path = given or os.environ.get("SHARDFEED_PEERS_PYTHON") or os.path.join(_CHECKOUT, ".venv-peers", "bin", "python")
    if given and not (os.path.isfile(given) and os.access(given, os.X_OK)):
        raise ValueError(f"--peers-python {given}: not an executable; make the peers' venv with "
                         "tools/bench/install_peers.sh or leave the option out")
    return path if os.access(path, os.X_OK) else None


def python_for(library: str, peers_py: str | None) -> str:
    return peers_py if library in OWN_VENV and peers_py else sys.executable


VERSIONED = ("shardfeed", "torch", "numpy", "pyarrow", "webdataset", "litdata", "mosaicml-streaming")
_VERSIONS_CODE = ("import json, sys\nfrom importlib.metadata import version\nout = {'python': sys.version.split()[0]}\n"
                  "for d in sys.argv[1:]:\n    try:\n        out[d] = version(d)\n    except Exception:\n"
                  "        out[d] = 'not installed'\nprint(json.dumps(out))")


def versions(python: str = sys.executable) -> dict:
    """Versions of the libraries as ``python`` sees them (this interpreter's without a process)."""
    if python == sys.executable:
        from importlib.metadata import PackageNotFoundError, version
        out = {"python": sys.version.split()[0]}
        for d in VERSIONED:
            try:
                out[d] = version(d)
            except PackageNotFoundError:
                out[d] = "not installed"
        return out
    try:
        done = subprocess.run([python, "-c", _VERSIONS_CODE, *VERSIONED], capture_output=True, text=True,
                              timeout=60, check=True)
        return json.loads(done.stdout)
    except (subprocess.SubprocessError, ValueError, OSError) as e:
        return {"error": f"{python}: {e}"}
