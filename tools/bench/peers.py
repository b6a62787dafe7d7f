"""The benchmarks' one peer-adapter registry: the contract a library's adapter keeps (``Adapter``) and
every adapter, by name (``ADAPTERS``, ``adapter(name)``), with the interpreter each runs under.

An adapter writes the benchmark samples with its library's own writer (``write``) and reads one epoch back
through the library's usual PyTorch path (``batches``: ``(keys, payloads, classes)`` per batch, in whatever
containers the library produces; ``ContentCheck`` normalises them). ``installed`` is the install check;
the imports happen in ``load()``, so a missing peer is reported as skipped and the import is not timed.
`bench read` and `bench compare` run the adapters; `bench remote` and `bench tokens` take Streaming's import
and interpreter from here.

MosaicML Streaming pins numpy < 2.2 and its package ``__init__`` imports its torchvision-based example
datasets, and PyPI's torchvision cannot load beside the CPU torch wheel ("operator torchvision::nms does
not exist": its extension links the CUDA torch libraries). So Streaming runs in a venv of its own
(``.venv-peers``, made by ``tools/bench/install_peers.sh``: the same CPU torch, numpy < 2.2, Streaming
without torchvision) and, when its package ``__init__`` fails, its readers and writers are imported from
``streaming.base`` directly: all of the reading code is Streaming's own, only the example datasets
(``streaming.vision``, ``.text``, ``.multimodal``) are left out. Without that venv, or when even that
import fails, Streaming is reported as skipped with the reason.
"""

from __future__ import annotations

import glob
import importlib.util
import math
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator

from shardfeed.tools.bench import fresh
from shardfeed.tools.bench.samples import SampleSpec

# Shard-based layouts (tar, Parquet files) are cut into this many files, whatever the dataset's size, so 2
# workers always have shards to split and quick runs look like full ones. Libraries that split samples (not
# files) between workers write at their documented default chunk size instead (see each adapter's CONFIG).
NUM_SHARDS = 8


def _per_shard(spec: SampleSpec) -> int:
    """Samples per shard: the spec's own ``per_shard`` where it sets one (the
    class-ordered data of `bench compare`), else NUM_SHARDS shards."""
    return getattr(spec, "per_shard", None) or math.ceil(spec.count / NUM_SHARDS)


class Adapter(ABC):
    """One library in the benchmarks: its name, label and configuration, its install check, how it writes
    the samples and reads one epoch of them."""

    name = ""
    label = ""
    peer = True  # False for shardfeed itself
    # How the library writes and reads in this benchmark, as its docs and a sensible user would set it
    # (printed in the report's "configurations" section).
    CONFIG = ""
    # The top-level modules the library needs: its install check looks for them (importing none).
    modules: tuple[str, ...] = ()
    # The venv it runs under instead of this interpreter (a key of fresh.VENVS), or None.
    venv: str | None = None

    def installed(self) -> bool:
        """Whether this interpreter finds the library's modules (the venv of an adapter with one is
        checked by running it there)."""
        return all(importlib.util.find_spec(m) is not None for m in self.modules)

    @property
    def data_name(self) -> str:
        """Whose written data this adapter reads (its own unless it is a variant)."""
        return self.name

    def load(self, read: bool) -> None:
        """Imports what writing (``read=False``) or reading needs, before any timing starts;
        raises ImportError (reported as skipped) when the library is absent."""
        if read:
            import torch.utils.data  # noqa: F401 (every read path is a torch DataLoader)

    @abstractmethod
    def write(self, spec: SampleSpec, folder: str) -> None:
        """The spec's samples into ``folder`` with the library's own writer."""

    def files(self, folder: str) -> list[str]:
        """The data files a pass reads (for the warm-up read and `cat`)."""
        return sorted(p for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
                      if os.path.isfile(p) and not p.endswith(".json"))

    @abstractmethod
    def batches(self, folder: str, workers: int, shuffle: bool, batch_size: int) -> Iterator:
        """One epoch of ``folder``'s samples: ``(keys, payloads, classes)`` per batch."""


class ShardfeedAdapter(Adapter):
    """shardfeed's own path: ShardDataset over the tar shards + Loader."""

    name, label, peer = "shardfeed", "shardfeed", False
    modules = ("shardfeed",)
    CONFIG = ("ShardWriter(format=\"tar\"), 8 shards; ShardDataset(shuffle=\"global\" or \"none\") + "
              "Loader(batch_size, num_workers): all defaults otherwise")

    def load(self, read):
        super().load(read)
        if read:
            # the read path as the peers' eager imports load theirs: `import shardfeed.loader` loads it on first
            # use, which would otherwise move these imports into the timed pass (see "import s")
            import shardfeed.formats.engine.batch  # noqa: F401
            import shardfeed.formats.readers  # noqa: F401
            from shardfeed.loader import Loader, ShardDataset  # noqa: F401
        else:
            from shardfeed.formats import ShardWriter  # noqa: F401

    def write(self, spec, folder):
        from shardfeed.formats import ShardWriter
        with ShardWriter(folder, format="tar", max_shard_samples=_per_shard(spec)) as writer:
            for sample in spec:
                writer.write(sample)

    def files(self, folder):
        return sorted(glob.glob(os.path.join(folder, "*.tar")))

    read_mode = "pread"

    def batches(self, folder, workers, shuffle, batch_size):
        from shardfeed.loader import Loader, ShardDataset
        dataset = ShardDataset(folder, shuffle="global" if shuffle else "none", seed=0, read_mode=self.read_mode)
        loader = Loader(dataset, batch_size=batch_size, num_workers=workers)
        for batch in loader:
            yield batch["__key__"], batch["bin"], batch["cls"]


class ShardfeedMmapAdapter(ShardfeedAdapter):
    """shardfeed with the opt-in read_mode="mmap" (faster small random reads, file pages in RSS)."""

    name, label = "shardfeed-mmap", "shardfeed, read_mode=mmap"
    CONFIG = 'the shardfeed tar row with ShardDataset(read_mode="mmap")'
    read_mode = "mmap"

    @property
    def data_name(self) -> str:
        return "shardfeed"


class WebDatasetAdapter(Adapter):
    """webdataset's documented pipeline: shard shuffle + sample buffer, WebLoader."""

    name, label = "webdataset", "webdataset"
    modules = ("webdataset",)
    CONFIG = ("wds.ShardWriter(maxcount=...): 8 shards (its docs: at least one shard per worker); "
              "WebDataset(urls, shardshuffle=len(urls)).shuffle(1000).decode().to_tuple().batched(batch) in "
              "WebLoader(batch_size=None, num_workers): its documented pipeline")

    def load(self, read):
        super().load(read)
        import webdataset  # noqa: F401

    def write(self, spec, folder):
        import webdataset as wds
        pattern = os.path.join(folder, "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=_per_shard(spec), verbose=0) as sink:
            for sample in spec:
                sink.write(sample)

    def files(self, folder):
        return sorted(glob.glob(os.path.join(folder, "*.tar")))

    def batches(self, folder, workers, shuffle, batch_size):
        import webdataset as wds
        urls = self.files(folder)
        dataset = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, seed=0,
                                 empty_check=False)
        if shuffle:
            dataset = dataset.shuffle(1000)
        dataset = dataset.decode().to_tuple("__key__", "bin", "cls").batched(batch_size, partial=True)
        yield from wds.WebLoader(dataset, batch_size=None, num_workers=workers)


def _collate_dicts(samples):
    return ([s["key"] for s in samples], [s["bin"] for s in samples], [s["cls"] for s in samples])


class LitDataAdapter(Adapter):
    """litdata: BinaryWriter chunks read by StreamingDataset + StreamingDataLoader."""

    name, label = "litdata", "litdata"
    modules = ("litdata",)
    CONFIG = ("BinaryWriter(chunk_bytes=\"64MB\"), the chunk size of its README's optimize() examples; "
              "StreamingDataset(shuffle) + StreamingDataLoader(batch_size, num_workers): defaults")
    CHUNK_BYTES = "64MB"

    def load(self, read):
        super().load(read)
        import litdata  # noqa: F401

    def write(self, spec, folder):
        from litdata.streaming.writer import BinaryWriter
        # The class-ordered data of the shuffle-quality part keeps its shards of `per_shard` samples.
        per_shard = getattr(spec, "per_shard", None)
        writer = BinaryWriter(folder, chunk_size=per_shard) if per_shard else \
            BinaryWriter(folder, chunk_bytes=self.CHUNK_BYTES)
        for i in range(spec.count):
            writer.add_item(i, {"key": spec.key(i), "bin": spec.payload(i), "cls": spec.cls(i)})
        writer.done()
        writer.merge(1)

    def batches(self, folder, workers, shuffle, batch_size):
        from litdata import StreamingDataLoader, StreamingDataset
        dataset = StreamingDataset(folder, shuffle=shuffle, seed=0)
        yield from StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                       collate_fn=_collate_dicts)


def _collate_tuples(samples):
    keys, payloads, classes = zip(*samples)
    return list(keys), list(payloads), list(classes)


class FilesAdapter(Adapter):
    """A plain torch DataLoader over one file per sample."""

    name, label = "files", "DataLoader, file per sample"
    modules = ("torch",)
    CONFIG = ("one file per sample in ROOT/CLASS/KEY.bin (the ImageFolder layout); a map-style Dataset that "
              "opens and reads each file, DataLoader(batch_size, shuffle, num_workers)")

    def load(self, read):
        super().load(read)
        if read:
            import shardfeed.tools.bench.peer_datasets  # noqa: F401

    def write(self, spec, folder):
        made = set()
        for i in range(spec.count):
            cls_dir = os.path.join(folder, f"{spec.cls(i):03d}")
            if cls_dir not in made:
                os.makedirs(cls_dir, exist_ok=True)
                made.add(cls_dir)
            with open(os.path.join(cls_dir, spec.key(i) + ".bin"), "wb") as f:
                f.write(spec.payload(i))

    def batches(self, folder, workers, shuffle, batch_size):
        import torch
        from torch.utils.data import DataLoader
        gen = torch.Generator().manual_seed(0)
        from shardfeed.tools.bench.peer_datasets import FileDataset
        yield from DataLoader(FileDataset(folder), batch_size=batch_size, shuffle=shuffle,
                              num_workers=workers, collate_fn=_collate_tuples, generator=gen)


class ParquetAdapter(Adapter):
    """A plain pyarrow loop over Parquet row groups, in a DataLoader: files written by ``pq.write_table``
    at pyarrow's defaults (row groups of min(rows, 1Mi): one group per file here; snappy), each group read
    whole and cut into batches."""

    name, label = "parquet", "pyarrow Parquet loop, default row groups"
    modules = ("pyarrow",)
    CONFIG = ("pq.write_table per file at pyarrow's defaults: 8 files, row_group_size=None = min(rows, 1Mi), "
              "so one group per file (4,096 rows = 8 MiB at 2 KiB; 256 rows = 25 MiB at 100 KiB), snappy; "
              "a DataLoader over (file, group) pairs: read_row_group, rows shuffled within the group "
              "when shuffling, batches sliced off")
    ROW_GROUP = None  # pyarrow's default

    def load(self, read):
        super().load(read)
        import pyarrow.parquet  # noqa: F401
        if read:
            import shardfeed.tools.bench.peer_datasets  # noqa: F401

    def write(self, spec, folder):
        import pyarrow as pa
        import pyarrow.parquet as pq
        os.makedirs(folder, exist_ok=True)
        schema = pa.schema([("key", pa.string()), ("bin", pa.binary()), ("cls", pa.int64())])
        per_file = _per_shard(spec)
        for f, first in enumerate(range(0, spec.count, per_file)):
            ids = range(first, min(first + per_file, spec.count))
            table = pa.table({"key": [spec.key(i) for i in ids], "bin": [spec.payload(i) for i in ids],
                              "cls": [spec.cls(i) for i in ids]}, schema=schema)
            pq.write_table(table, os.path.join(folder, f"part-{f:05d}.parquet"), row_group_size=self.ROW_GROUP)

    def files(self, folder):
        return sorted(glob.glob(os.path.join(folder, "*.parquet")))

    def batches(self, folder, workers, shuffle, batch_size):
        from torch.utils.data import DataLoader

        from shardfeed.tools.bench.peer_datasets import ParquetRowGroups
        yield from DataLoader(ParquetRowGroups(self.files(folder), shuffle, batch_size),
                              batch_size=None, num_workers=workers)


class ParquetMidAdapter(ParquetAdapter):
    """The same loop over files with 1,024-row groups: the group size of shardfeed's own Parquet writer (and
    about Hugging Face datasets' 1,000-row ``to_parquet`` groups), a middle between one group per batch and
    pyarrow's default."""

    name, label = "parquet-1k", "pyarrow Parquet loop, 1,024-row groups"
    CONFIG = ("as the default-row-group loop, but pq.write_table(row_group_size=1024): 4 groups per file at "
              "2 KiB (2 MiB each); at 100 KiB a file holds 256 rows, so the same one group as the default")
    ROW_GROUP = 1024


class ShardfeedParquetAdapter(ShardfeedAdapter):
    """shardfeed over Parquet shards written by its own ShardWriter."""

    name, label = "shardfeed-parquet", "shardfeed, Parquet"
    modules = ("shardfeed", "pyarrow")
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
    modules = ("streaming",)
    venv = "peers"
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


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (
    ShardfeedAdapter(), ShardfeedMmapAdapter(), ShardfeedTensorAdapter(), ShardfeedParquetAdapter(), WebDatasetAdapter(),
    LitDataAdapter(), StreamingAdapter(), FilesAdapter(), ParquetAdapter(), ParquetMidAdapter())}


def adapter(name: str) -> Adapter:
    """The registered adapter ``name`` (KeyError naming the known ones otherwise)."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"no peer adapter {name!r}; registered: {', '.join(ADAPTERS)}") from None


def peers_python(given: str | None) -> str | None:
    """The interpreter of the peers' venv (.venv-peers: MosaicML Streaming), or None."""
    return fresh.venv_python("peers", given)


def python_for(library: str, peers_py: str | None) -> str:
    """The interpreter ``library`` runs under: its venv's where it has one and that venv exists."""
    return peers_py if adapter(library).venv == "peers" and peers_py else sys.executable
