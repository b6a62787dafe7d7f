"""Raw little-endian numeric fields: a 1-D array stored as its bytes, no header.

The LLM pre-training case: a 2 KiB sample is 1,024 uint16 tokens. A ``.npy``
payload carries a 128-byte header per sample for that; here the field's
extension names the element type and the payload is the elements, so a
batch of equal-length samples is one gather of ``n`` byte ranges into an
``(n, length)`` array (``numeric_column``), no per-sample decode.

Extensions (the last component of the field name, e.g. ``tokens.uint16``):
``uint8 int8 uint16 int16 uint32 int32 uint64 int64 float16 float32
float64``, numpy's and torch's names for the types. Why not ``u16``/``i8``:
in numpy ``"u8"``/``"i8"``/``"f8"`` are 8-*byte* types, so the short
spellings would read one way to a numpy user and another to everyone else.
bfloat16 is left out: numpy has no such type (write the bits as
``uint16`` and ``.view(torch.bfloat16)`` after loading).

Always little-endian, always 1-D (a shape would need a header: use
``.npy``). A payload whose length is not a multiple of the element size is
refused (ValueError; readers add the shard and key and raise ShardError).
"""

from __future__ import annotations

from typing import Any

import numpy as np

NUMERIC_DTYPES: dict[str, np.dtype] = {name: np.dtype(name).newbyteorder("<") for name in (
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64")}


def numeric_dtype(ext: str) -> np.dtype | None:
    """The little-endian dtype a field extension names (``tokens.uint16`` -> ``<u2``), or None."""
    return NUMERIC_DTYPES.get(ext.rsplit(".", 1)[-1].lower())


def _check_length(ext: str, dtype: np.dtype, nbytes: int) -> None:
    if nbytes % dtype.itemsize:
        raise ValueError(f"field {ext!r} holds {nbytes} bytes, not a whole number of {dtype.name} values "
                         f"({dtype.itemsize} bytes each): the payload is cut short or not {dtype.name}")


def encode_numeric(ext: str, value: Any) -> bytes:
    """The little-endian bytes of a 1-D array for field ``ext``.

    Bytes are taken as already encoded (their length is checked). Arrays of
    another dtype are converted only when every value survives the round
    trip (int64 token ids that fit in uint16 do; 70000 does not): a silent
    wrap-around would corrupt the dataset for good.
    """
    dtype = numeric_dtype(ext)
    if dtype is None:
        raise ValueError(f"field {ext!r} does not name a numeric type ({', '.join(NUMERIC_DTYPES)})")
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        _check_length(ext, dtype, len(data))
        return data
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"field {ext!r} stores 1-D arrays, got shape {arr.shape}; flatten it, or use an "
                         "'.npy' field to keep the shape")
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"field {ext!r} needs numbers, got dtype {arr.dtype}")
    if arr.dtype != dtype:
        with np.errstate(invalid="ignore", over="ignore"):
            conv = arr.astype(dtype)
        if not np.array_equal(conv, arr, equal_nan=arr.dtype.kind == "f"):
            raise ValueError(f"field {ext!r}: values of dtype {arr.dtype} do not fit {dtype.name} "
                             f"(e.g. {arr[conv != arr][:3].tolist()}); pick a wider type in the extension")
        arr = conv
    return arr.tobytes()


def decode_numeric(ext: str, data) -> np.ndarray:
    """A writable 1-D array (native byte order) of a raw numeric payload: one copy."""
    dtype = numeric_dtype(ext)
    mv = memoryview(data).cast("B")
    _check_length(ext, dtype, len(mv))
    return np.frombuffer(mv, dtype).astype(dtype.newbyteorder("="))


def numeric_column(ext: str, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """A batch's values of field ``ext`` as one ``(n, length)`` array when every
    sample has the field with the same byte length (a whole number of
    elements), gathered by the jitted copy straight from the batch buffer; None
    otherwise (the caller decodes one by one: a list, or the error per sample)."""
    from shardfeed.formats.engine.kernels import copy_ranges

    dtype = numeric_dtype(ext)
    n = len(starts)
    if dtype is None or not n or sizes.min() < 0 or sizes.min() != sizes.max():
        return None
    size = int(sizes[0])
    if size % dtype.itemsize or int(starts.min()) < 0 or int(starts.max()) + size > len(buf):
        return None
    out = np.empty(n * size, np.uint8)
    if size:
        copy_ranges(buf, starts, sizes, out, np.arange(n, dtype=np.int64) * size)
    arr = out.view(dtype).reshape(n, size // dtype.itemsize)
    return arr if dtype.isnative else arr.astype(dtype.newbyteorder("="))
