"""Batches as columns, and the default collate.

A batch travels as a dict of *columns*, never as a list of sample dicts:

- ``np.ndarray``: numbers and same-shaped arrays, stacked (-> ``torch.Tensor``);
- ``Blob``: variable-length bytes or text of the whole batch as one buffer
  plus (start, size) per sample (-> ``list[bytes]`` / ``list[str]``);
- ``Strs``: strings (the keys) as one NUL-joined UTF-8 blob (-> ``list[str]``),
  passed from the gather to the main process without a list in between;
- ``list``: anything else (JSON values, ragged arrays), kept per sample.

``materialize`` turns columns into what the user sees; it runs in the main
process, after the columns crossed from a worker through shared memory.

Byte fields as views (``Loader(..., bytes_as="tensor" | "jagged")``): see
views.py for the forms and the lifetime rule (valid until the next batch is
asked for).

Raw numeric fields (``tokens.uint16``, formats/numeric_fields.py) of one
length in a batch are gathered into one ``(batch, n)`` array by the jitted
copy, like equal-shaped ``.npy`` values; of unequal lengths they reach the
user as a list of 1-D tensors.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from shardfeed.formats.base.records import SlotRecord
from shardfeed.formats.codecs import codec_of, decode_npy
from shardfeed.formats.engine.kernels import copy_ranges
from shardfeed.formats.numeric_fields import numeric_column
from shardfeed.loader import heap
from shardfeed.loader.bytes_column import BytesList
from shardfeed.loader.views import BYTES_AS, check_bytes_as, jagged_view, tensor_views

__all__ = ["BYTES_AS", "Blob", "OwnedArray", "Strs", "check_bytes_as", "collate_column", "default_collate",
           "gathered_column", "materialize", "npy_column"]

_SLICE_WHOLE_BYTES = 16 << 10  # mean item size up to which to_list copies the items' span once first
_ITEM_MIN_BYTES = 256  # equal-sized values from this size on are taken one by one, not compacted first


class Blob(SlotRecord):
    """Per-sample byte strings inside one buffer; size -1 means None (field absent)."""

    # a SlotRecord, not a dataclass: a dataclass compiles its methods at import (issue #24); unhashable, as a dataclass
    __slots__ = ("buf", "starts", "sizes", "text")
    __hash__ = None

    def __init__(self, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, text: bool = False):
        self.buf = buf  # uint8
        self.starts = starts  # int64
        self.sizes = sizes  # int64
        self.text = text

    def __len__(self) -> int:
        return len(self.starts)

    def to_list(self) -> list:
        if not len(self.starts):
            if not self.text:
                heap.reserve(0)
            return []
        starts, sizes = self.starts, self.sizes
        smallest = int(sizes.min())
        whole = smallest >= 0
        if self.text:
            mv = memoryview(self.buf)
            if whole:
                return [str(mv[a:b], "utf-8") for a, b in zip(starts.tolist(), (starts + sizes).tolist())]
            return [None if s < 0 else str(mv[a:a + s], "utf-8") for a, s in zip(starts.tolist(), sizes.tolist())]
        if smallest > 0 and smallest == int(sizes.max()):  # one size (the usual case): no sums, no ends
            heap.reserve(smallest * len(starts))  # the previous batch's freed memory is reused (heap.py)
            same = _equal_size_list(self.buf, starts, smallest)
            if same is not None:
                return same
        if whole:
            ends = starts + sizes
            total = int(sizes.sum())
        else:
            ends = starts + np.maximum(sizes, 0)
            total = int(np.maximum(sizes, 0).sum())
        heap.reserve(total)
        lo, hi = int(starts.min()), int(ends.max())
        if total <= _SLICE_WHOLE_BYTES * len(starts) and hi - lo <= 2 * total + 4096:
            # small items: one bytes copy of the span they lie in, then bytes
            # slices of it: ~0.35-0.5 us/item here against ~0.6-0.85 us for
            # bytes(memoryview slice). Large items (or a span mostly holding
            # other fields) would pay more for that extra copy than they save.
            src = self.buf[lo:hi].tobytes()
            if lo:
                starts, ends = starts - lo, ends - lo
            if whole:
                return [src[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
            return [None if s < 0 else src[a:b] for a, b, s in zip(starts.tolist(), ends.tolist(), sizes.tolist())]
        src = memoryview(self.buf)
        if whole:
            return list(map(bytes, map(src.__getitem__, map(slice, starts.tolist(), ends.tolist()))))
        return [None if s < 0 else bytes(src[a:b]) for a, b, s in zip(starts.tolist(), ends.tolist(), sizes.tolist())]

    def to_tensors(self, pin_memory: bool = False) -> list:
        """Each value as a uint8 tensor viewing ``buf`` (None where absent): no copy,
        valid until the buffer is reused (views.py's lifetime rule)."""
        return tensor_views(self.buf, self.starts, self.sizes, pin_memory)

    def to_jagged(self, pin_memory: bool = False):
        """The values as one jagged nested tensor viewing ``buf`` (views.py)."""
        return jagged_view(self.buf, self.starts, self.sizes, pin_memory)

    @classmethod
    def from_list(cls, items: list) -> Blob:
        text = all(isinstance(x, str) or x is None for x in items)
        enc = [None if x is None else (x.encode("utf-8") if text else bytes(x)) for x in items]
        sizes = np.array([-1 if b is None else len(b) for b in enc], np.int64)
        starts = np.zeros(len(enc), np.int64)
        if len(enc) > 1:
            np.cumsum(np.maximum(sizes[:-1], 0), out=starts[1:])
        data = b"".join(b for b in enc if b is not None)
        return cls(np.frombuffer(data, np.uint8), starts, sizes, text)


def _equal_size_list(buf: np.ndarray, starts: np.ndarray, size: int) -> list | None:
    """The values, all ``size`` bytes (> 0) long, as bytes (fixed-size records, token windows, the
    benchmark's payloads), made in C, one copy each: numpy's ``tolist`` of an unstructured-void array
    makes each ``bytes`` in C instead of one Python slice per value (~3x the slicing loop on values
    viewed in place). Values at one constant stride are viewed in place and listed at once. Others
    (a sample's other fields vary in length: the usual tar layout, where a label of 1-3 digits
    follows each payload) are taken one by one by ``ndarray.item`` from a view holding a value at
    every byte offset (measured 0.73x the time of compacting them first with the jitted copy at
    2 KiB, 0.57x at 8 KiB, equal at 128 bytes); below ``_ITEM_MIN_BYTES`` the compaction copy and one
    ``tolist`` stay cheaper than a call per value. None when a value lies outside ``buf`` or (large
    values) the caller's slicing costs the same."""
    n = len(starts)
    if not buf.flags.c_contiguous:
        return None
    dtype = np.dtype((np.void, size))
    first = int(starts[0])
    stride = int(starts[1]) - first if n > 1 else size
    last = int(starts[-1])
    if first >= 0 and stride >= size and last == first + stride * (n - 1) and last + size <= len(buf) and (
            n < 3 or not np.any(np.diff(starts) != stride)):
        return np.ndarray((n,), dtype=dtype, buffer=buf, offset=first, strides=(stride,)).tolist()
    if size > _SLICE_WHOLE_BYTES or int(starts.min()) < 0 or int(starts.max()) + size > len(buf):
        return None
    if size >= _ITEM_MIN_BYTES:
        every = np.ndarray((len(buf) - size + 1,), dtype=dtype, buffer=buf, strides=(1,))
        return list(map(every.item, starts.tolist()))
    out = np.empty(n * size, np.uint8)
    copy_ranges(buf, np.ascontiguousarray(starts, np.int64), np.full(n, size, np.int64), out,
                np.arange(0, n * size, size, dtype=np.int64))
    return out.view(dtype).tolist()


class OwnedArray(np.ndarray):
    """A column array made for this batch alone (never a view of a reused
    buffer): ``materialize`` hands it to torch without copying it again. At 0
    workers that saves a copy of every gathered ``.npy``/numeric column; from
    a worker the column arrives as a plain view of the slot and is copied."""


def owned(arr: np.ndarray) -> OwnedArray:
    return arr.view(OwnedArray)


class Strs(SlotRecord):
    """``count`` strings, none holding a NUL, as UTF-8 joined by NUL."""

    __slots__ = ("data", "count")
    __hash__ = None

    def __init__(self, data: bytes, count: int):
        self.data = data
        self.count = count

    def __len__(self) -> int:
        return self.count

    def to_list(self) -> list[str]:
        return self.data.decode("utf-8").split("\0") if self.count else []


def npy_column(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """A batch's ``.npy`` values of one shape and dtype as one array, gathered by
    the jitted copy straight from the batch buffer (no per-sample decode: the
    LLM case of fixed-length token arrays); None when they differ in size or
    header, or use what the slow path must handle (Fortran order, byte order
    other than little-endian, objects), which then decodes them one by one."""
    n = len(starts)
    if not n or sizes.min() < 16 or sizes.min() != sizes.max():
        return None
    s0, size = int(starts[0]), int(sizes[0])
    if int(starts.min()) < 0 or int(starts.max()) + size > len(buf):
        return None
    try:
        first = decode_npy(buf[s0:s0 + size])  # validates the header and the size it claims
    except ValueError:
        return None
    if first.dtype.hasobject or first.dtype.byteorder == ">" or (first.ndim > 1 and
                                                                 not first.flags.c_contiguous):
        return None
    nbytes = first.nbytes
    head = size - nbytes
    heads = buf[starts[:, None] + np.arange(head)]
    if not (heads == heads[0]).all():
        return None  # shapes or dtypes differ: the slow path decides (a list, or an error per sample)
    out = np.empty(n * nbytes, np.uint8)
    if nbytes:
        copy_ranges(buf, starts + head, np.full(n, nbytes, np.int64), out, np.arange(n, dtype=np.int64) * nbytes)
    return owned(out.view(first.dtype).reshape((n,) + first.shape))


def gathered_column(codec: str, name: str, buf: np.ndarray, starts: np.ndarray,
                    sizes: np.ndarray) -> OwnedArray | None:
    """One array for a batch's ``npy`` or raw ``numeric`` field when the values
    allow it (equal shapes / lengths), gathered by the jitted copy; else None."""
    if codec == "npy":
        return npy_column(buf, starts, sizes)
    arr = numeric_column(name, buf, starts, sizes)
    return None if arr is None else owned(arr)


def _stackable(values: list) -> np.ndarray | None:
    """One array for a column when every value is a number, or an array of one shape and dtype."""
    first = values[0]
    if isinstance(first, (bool, np.bool_)):
        return np.array(values, np.bool_) if all(isinstance(v, (bool, np.bool_)) for v in values) else None
    if isinstance(first, numbers.Integral) and all(
            isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, np.int64)
    if isinstance(first, numbers.Real) and all(
            isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, np.float64 if isinstance(first, float) else None)
    if isinstance(first, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            return torch.stack(values).numpy() if first.dtype != torch.bfloat16 else None
        return None
    if isinstance(first, np.ndarray) and first.dtype.kind in "biufc":
        if all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
    return None


def collate_column(values: list) -> Any:
    """The default collate of one field over a batch."""
    if not values:
        return []
    arr = _stackable(values)
    if arr is not None:
        return arr
    if all(isinstance(v, (bytes, bytearray, memoryview, str)) or v is None for v in values):
        return Blob.from_list(values)
    return writable_list(values)


def writable_list(values: list) -> list:
    """The values, read-only arrays among them copied. Why: a decoder may hand
    over read-only arrays when it expects them stacked (one copy instead of
    two); left in a list they would reach the user, and torch warns on every
    read-only array it converts."""
    return [v.copy() if isinstance(v, np.ndarray) and not v.flags.writeable else v for v in values]


def default_collate(samples: list[dict]) -> dict:
    """Columns of a list of sample dicts: numbers and same-shaped arrays
    stacked, bytes and strings as lists, anything else a list. A field some
    samples lack becomes a list with None there."""
    names: dict[str, None] = {}
    for s in samples:
        for k in s:
            names.setdefault(k, None)
    out = {}
    for name in names:
        vals = [s.get(name) for s in samples]
        out[name] = collate_column(vals) if all(v is not None for v in vals) else (
            Blob.from_list(vals) if all(isinstance(v, (bytes, str)) or v is None for v in vals)
            else writable_list(vals))
    return out


class Ready:
    """A batch materialized already (loader/read_ahead.py): ``materialize`` hands it out as it is."""

    __slots__ = ("batch",)

    def __init__(self, batch):
        self.batch = batch


def materialize(columns: Any, pin_memory: bool = False, bytes_as: str = "bytes") -> Any:
    """What the user sees: tensors and lists. Arrays are copied out (their
    memory may be a reused shared-memory slot) unless made for this batch
    alone (OwnedArray); byte fields too, unless ``bytes_as`` asks for views
    (views.py). Raw numeric fields of unequal lengths become 1-D tensors."""
    if not isinstance(columns, dict):
        return columns.batch if type(columns) is Ready else columns
    if bytes_as != "bytes":
        view = Blob.to_tensors if bytes_as == "tensor" else Blob.to_jagged
        columns = {name: view(col, pin_memory) if isinstance(col, Blob) and not col.text else col
                   for name, col in columns.items()}
    out = {}
    for name, col in columns.items():
        if isinstance(col, np.ndarray):
            if col.dtype.kind not in "biufc":
                out[name] = col.tolist()
                continue
            t = torch.from_numpy(col.view(np.ndarray) if isinstance(col, OwnedArray) else np.array(col, copy=True))
            out[name] = t.pin_memory() if pin_memory else t
        elif isinstance(col, (Blob, Strs, BytesList)):
            out[name] = col.to_list()
        elif isinstance(col, list) and codec_of(name) == "numeric":
            out[name] = [_tensor(v, pin_memory) if isinstance(v, np.ndarray) else v for v in col]
        else:
            out[name] = col
    return out


def _tensor(arr: np.ndarray, pin_memory: bool) -> torch.Tensor:
    t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    return t.pin_memory() if pin_memory else t
