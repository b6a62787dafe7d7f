"""Field encoders and decoders, chosen by the field's extension as in WebDataset.

A field's extension is what follows the key in a member name (``0001.seg.png``
-> ``seg.png``); its codec is chosen by the last component (``png``).
Pickle is never decoded unless the caller names it in ``unsafe``: a shard is
untrusted input, and unpickling runs arbitrary code (WebDataset unpickles by
file extension; we refuse).
"""

from __future__ import annotations

import io
import json
from typing import Any, Iterable

import numpy as np

INT_EXTS = frozenset({"cls", "cls2", "index", "inx", "id", "label"})
TEXT_EXTS = frozenset({"txt", "text", "transcript"})
JSON_EXTS = frozenset({"json", "jsn"})
NPY_EXTS = frozenset({"npy"})
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"})
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl"})
UNSAFE_EXTS = PICKLE_EXTS


def codec_of(ext: str) -> str:
    """The codec name for a field extension: int, text, json, npy, image, pickle or bytes."""
    last = ext.rsplit(".", 1)[-1].lower()
    if last in INT_EXTS:
        return "int"
    if last in TEXT_EXTS:
        return "text"
    if last in JSON_EXTS:
        return "json"
    if last in NPY_EXTS:
        return "npy"
    if last in IMAGE_EXTS:
        return "image"
    if last in PICKLE_EXTS:
        return "pickle"
    return "bytes"


def encode_field(ext: str, value: Any) -> bytes:
    """Bytes for one field value; raises TypeError/ValueError naming the field."""
    codec = codec_of(ext)
    if isinstance(value, (bytes, bytearray, memoryview)) and codec != "npy":
        return bytes(value)
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


def decode_image(data: bytes, size: int | None = None) -> np.ndarray:
    """An RGB uint8 HWC array. With ``size``, JPEG decoding uses pillow's draft
    mode so a low-resolution stage pays for a low-resolution decode."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if size is not None and img.format == "JPEG":
            img.draft("RGB", (size, size))
        img = img.convert("RGB")
        if size is not None and (img.width, img.height) != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img)


def decode_field(ext: str, data: Any, unsafe: Iterable[str] = (), image_size: int | None = None) -> Any:
    """Decoded value of one field; unknown extensions stay bytes.

    Columnar shards hand over already-typed values (int, str); those pass through.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return data
    codec = codec_of(ext)
    if codec == "int":
        return int(bytes(data))
    if codec == "text":
        return bytes(data).decode("utf-8")
    if codec == "json":
        return json.loads(bytes(data))
    if codec == "npy":
        return np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    if codec == "image":
        return decode_image(bytes(data), image_size)
    if codec == "pickle":
        if ext in set(unsafe) or ext.rsplit(".", 1)[-1] in set(unsafe):
            import pickle

            return pickle.loads(bytes(data))
        return bytes(data)  # left undecoded: the user did not ask for pickle by name
    return bytes(data)
