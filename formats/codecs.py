"""Field encoders and decoders, chosen by the field's extension as in WebDataset.

A field's extension is what follows the key in a member name (``0001.seg.png``
-> ``seg.png``); its codec is chosen by the last component (``png``).
Pickle is never decoded unless the caller names it in ``unsafe``: a shard is
untrusted input, and unpickling runs arbitrary code (WebDataset unpickles by
file extension; we refuse).

``.gz`` fields (``KEY.txt.gz``, ``KEY.json.gz``, ``KEY.npy.gz``) are gunzipped
and then decoded by the extension left (``txt``), as WebDataset's ``gzfilter``
does; the value keeps the full extension as its name (``sample["txt.gz"]`` is
a ``str``), again as in WebDataset, so code written for one reads the other.
An inner extension with no codec (``bin.gz``) gives the decompressed bytes.
Decompression is bounded (MAX_FIELD_BYTES): a gzip bomb raises instead of
filling memory.

Decoded arrays (``npy``, images) are writable and own their memory: torch
warns on every batch about read-only numpy arrays, and a view into a reader's
buffer would change under the caller when the buffer is reused.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from shardfeed.formats.numeric_fields import NUMERIC_DTYPES, decode_numeric, encode_numeric

INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id", "label"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})
JSON_EXTS = frozenset({"json", "jsn"})
NPY_EXTS = frozenset({"npy"})
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"})
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})
GZIP_EXTS = frozenset({"gz"})
UNSAFE_EXTS = PICKLE_EXTS

# One field of one sample is decompressed in memory: refuse one that inflates
# past this (a few KiB of gzip can claim GiB). Generous for a single sample's
# text or array; raise it for datasets with genuinely larger fields.
MAX_FIELD_BYTES = int(os.environ.get("SHARDFEED_MAX_FIELD_BYTES", 256 << 20))
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip header and trailer, not raw zlib


class FieldTooLarge(ValueError):
    """A compressed field inflates past the limit. Readers add the shard and
    the sample key (they know them; a codec does not) and raise ShardError."""


def codec_of(ext: str) -> str:
    """The codec name for a field extension: int, text, json, npy, numeric
    (raw little-endian ``uint16`` etc., numeric_fields.py), image, pickle, gz
    (decompress, then decode by the extension left) or bytes."""
    last = ext.rsplit(".", 1)[-1].lower()
    if last in GZIP_EXTS:
        return "gz"
    if last in INT_EXTS:
        return "int"
    if last in TEXT_EXTS:
        return "text"
    if last in JSON_EXTS:
        return "json"
    if last in NPY_EXTS:
        return "npy"
    if last in NUMERIC_DTYPES:
        return "numeric"
    if last in IMAGE_EXTS:
        return "image"
    if last in PICKLE_EXTS:
        return "pickle"
    return "bytes"


def inner_ext(ext: str) -> str:
    """What a ``.gz`` field holds: ``txt.gz`` -> ``txt``, ``gz`` -> ``""``."""
    return ext.rsplit(".", 1)[0] if "." in ext else ""


def encode_field(ext: str, value: Any) -> bytes:
    """Bytes for one field value; raises TypeError/ValueError naming the field.

    Bytes are stored as given (for ``.gz`` fields too: they are taken to be
    compressed already); other values of a ``.gz`` field are encoded by the
    inner extension and gzipped (mtime 0, so equal samples give equal shards).
    """
    codec = codec_of(ext)
    if codec == "numeric":
        return encode_numeric(ext, value)  # bytes too: their length is checked
    if isinstance(value, (bytes, bytearray, memoryview)) and codec != "npy":
        return bytes(value)
    if codec == "gz":
        return gzip.compress(encode_field(inner_ext(ext), value), mtime=0)
    if codec == "int":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"field {ext!r} needs an int, got {type(value).__name__}")
        return str(int(value)).encode("ascii")
    if codec == "text":
        if not isinstance(value, str):
            raise TypeError(f"field {ext!r} needs a str, got {type(value).__name__}")
        return value.encode("utf-8")
    if codec == "json":
        return json.dumps(value, separators=(",", ":")).encode("utf-8")
    if codec == "npy":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError(f"field {ext!r}: object arrays would need pickle; use a numeric dtype")
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        return buf.getvalue()
    if codec == "image" and isinstance(value, np.ndarray):
        from PIL import Image

        fmt = {"jpg": "JPEG", "jpeg": "JPEG", "tif": "TIFF"}.get(ext.rsplit(".", 1)[-1].lower(),
                                                               ext.rsplit(".", 1)[-1].upper())
        buf = io.BytesIO()
        Image.fromarray(value).save(buf, format=fmt)
        return buf.getvalue()
    if codec == "image" and hasattr(value, "save"):  # a PIL image
        buf = io.BytesIO()
        value.save(buf, format=(value.format or ext.rsplit(".", 1)[-1].upper().replace("JPG", "JPEG")))
        return buf.getvalue()
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"field {ext!r}: cannot encode {type(value).__name__}; pass bytes")


def gunzip(data, limit: int | None = None) -> bytes:
    """The decompressed bytes of a gzip payload (members concatenated, as
    gzip -d does), refusing output past ``limit`` (default MAX_FIELD_BYTES).

    zlib's ``max_length`` stops inflating at the limit, so a bomb costs at
    most ``limit`` bytes of memory before it is refused.
    """
    limit = MAX_FIELD_BYTES if limit is None else limit
    out = bytearray()
    rest = memoryview(data)
    while True:
        d = zlib.decompressobj(_GZIP_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))  # max_length >= 1: 0 would mean unbounded
        except zlib.error as e:
            raise ValueError(f"gzip payload is corrupt: {e}") from None
        if len(out) > limit:
            raise FieldTooLarge(f"gzip payload decompresses to more than {limit} bytes; raise "
                                "SHARDFEED_MAX_FIELD_BYTES if this field is genuine")
        if not d.eof:  # output below max_length, so all input was used: the stream is cut short
            raise ValueError("gzip payload is truncated (no end of stream)")
        # NUL padding after a member is accepted, as gzip -d and Python's gzip do
        rest = memoryview(d.unused_data.lstrip(b"\0"))
        if not rest:
            return bytes(out)


def decode_npy(data) -> np.ndarray:
    """A ``.npy`` payload as a writable array that owns its memory: one copy.

    np.load on a BytesIO copies three times and allocates the size the header
    claims before reading a byte of the data; here the claim is checked
    against the bytes present first (a shard is untrusted), and object dtypes
    (pickle) are refused.
    """
    mv = memoryview(data).cast("B")
    if len(mv) < 10 or bytes(mv[:6]) != b"\x93NUMPY":
        raise ValueError("not a .npy payload (no NUMPY magic)")
    major = mv[6]
    if major not in (1, 2, 3):
        raise ValueError(f".npy format version {major} is not supported")
    width = 2 if major == 1 else 4
    head_end = 8 + width + int.from_bytes(mv[8:8 + width], "little")
    if head_end > len(mv):
        raise ValueError(f".npy header claims {head_end} bytes of a {len(mv)}-byte payload (truncated)")
    fp = io.BytesIO(bytes(mv[:head_end]))
    np.lib.format.read_magic(fp)
    read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(fp)
    if dtype.hasobject:
        raise ValueError(".npy payload holds Python objects (pickle); refused")
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes != len(mv) - head_end:
        raise ValueError(f".npy header claims {nbytes} bytes of data for shape {shape} {dtype}, "
                         f"the payload holds {len(mv) - head_end}")
    flat = np.frombuffer(mv, dtype, count, head_end)  # a view: checked, nothing allocated yet
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


def decode_image(data: bytes, size: int | None = None, writable: bool = True) -> np.ndarray:
    """An RGB uint8 HWC array. With ``size``, JPEG decoding uses pillow's draft
    mode so a low-resolution stage pays for a low-resolution decode.

    Pillow hands pixels over as read-only ``bytes``; ``writable`` copies them
    once more (~3% of a 256x256 JPEG decode). A caller that copies the array
    anyway (stacking a batch) passes ``writable=False`` and skips that copy.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if size is not None and img.format == "JPEG":
            img.draft("RGB", (size, size))
        img = img.convert("RGB")
        if size is not None and (img.width, img.height) != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.array(img) if writable else np.asarray(img)


def decode_field(ext: str, data: Any, unsafe: Iterable[str] = (), image_size: int | None = None,
                 writable: bool = True) -> Any:
    """Decoded value of one field; unknown extensions stay bytes.

    Columnar shards hand over already-typed values (int, str); those pass
    through. A value never aliases ``data`` (which may be a reused buffer).
    ``.gz`` fields are decompressed (bounded: FieldTooLarge past
    MAX_FIELD_BYTES) and decoded by their inner extension. ``writable=False``
    lets an image stay read-only (see decode_image).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return data
    unsafe = set(unsafe)
    codec = codec_of(ext)
    if codec == "gz":
        # pyd.gz is pickle once inflated: naming either "pyd.gz" or "pyd" allows it
        inner = inner_ext(ext)
        return decode_field(inner, gunzip(data), unsafe | ({inner} if ext in unsafe else set()),
                            image_size, writable)
    if codec == "int":
        return int(bytes(data))
    if codec == "text":
        return str(data, "utf-8")
    if codec == "json":
        return json.loads(bytes(data))
    if codec == "npy":
        return decode_npy(data)
    if codec == "numeric":
        return decode_numeric(ext, data)
    if codec == "image":
        return decode_image(data, image_size, writable)
    if codec == "pickle":
        if ext in unsafe or ext.rsplit(".", 1)[-1] in unsafe:
            import pickle

            return pickle.loads(bytes(data))
        return bytes(data)  # left undecoded: the user did not ask for pickle by name
    return bytes(data)
