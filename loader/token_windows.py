"""Pre-tokenized text for LLM pre-training: a token stream stored as fixed windows, one window a sample.

``write_token_windows(root, documents, window=2048)`` concatenates the token
arrays it is given (documents, already tokenized, with whatever separator
token the user puts between them) and writes every ``window`` consecutive
tokens as one sample ``{"__key__": "%012d" % w, "tokens.uint16": window}``
(``uint32`` for vocabularies past 65,535) in ordinary tar shards. Window ``w``
is ``tokens[w * window:(w + 1) * window]``: a pure function of the stream, so
any order over the windows (``shuffle="global"``) samples the stream
uniformly, and a resumed job continues exactly.

Reading is the ordinary path: ``ShardDataset(root, shuffle="global")`` +
``Loader(batch_size=B)`` gives ``batch["tokens.uint16"]`` as one ``(B, window)``
tensor gathered straight from the batch buffer (raw numeric field, no
per-sample object). For next-token labels, write ``window = seq_len + 1``
and use ``x[:, :-1]`` / ``x[:, 1:]``, as Megatron's samples of seq_len + 1
tokens do (its windows overlap by that one token; these do not, so a stream
gives ``len // (seq_len + 1)`` samples).

The tokens left after the last whole window (fewer than ``window``) are
not written; the return value says how many there were.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from shardfeed.formats import ShardWriter

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def field_name(dtype: str = "uint16") -> str:
    """The field that holds a window (``tokens.uint16`` or ``tokens.uint32``)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: token windows are uint16 or uint32")
    return f"tokens.{dtype}"


def write_token_windows(root: str, documents: Iterable, window: int = 2048, dtype: str = "uint16",
                        **writer_options) -> dict:
    """Writes the concatenated ``documents`` (1-D integer arrays or sequences) as windows of ``window``
    tokens; ``writer_options`` go to ShardWriter (``max_shard_samples``, ``max_shard_bytes``, ...).
    Returns ``{"windows", "tokens", "dropped_tokens"}``. A token that does not fit ``dtype`` is a
    ValueError naming the document, never a silent wrap-around."""
    name = field_name(dtype)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r} must be an int >= 1")
    dt = DTYPES[dtype]
    top = np.iinfo(dt).max
    pending = np.empty(0, dt)
    windows = tokens = 0
    with ShardWriter(root, format="tar", **writer_options) as writer:
        for d, doc in enumerate(documents):
            a = np.asarray(doc)
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise ValueError(f"document {d}: tokens must be a 1-D integer array, got {a.dtype} {a.shape}")
            if a.size and (int(a.min()) < 0 or int(a.max()) > top):
                raise ValueError(f"document {d}: token ids must lie in 0..{top:,} for {dtype} "
                                 f"(found {int(a.min())}..{int(a.max())})")
            tokens += a.size
            pending = np.concatenate([pending, a.astype(dt)]) if pending.size else a.astype(dt)
            whole = pending.size // window
            for k in range(whole):
                writer.write({"__key__": f"{windows:012d}", name: pending[k * window:(k + 1) * window]})
                windows += 1
            pending = pending[whole * window:].copy()
    return {"windows": windows, "tokens": tokens, "dropped_tokens": int(pending.size)}


def window_ids(keys) -> np.ndarray:
    """The window numbers of a batch's ``__key__`` list (window ``w`` = tokens ``[w*window, (w+1)*window)``)."""
    return np.array([int(k) for k in keys], np.int64)
