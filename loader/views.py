"""Undecoded byte fields handed out as views into the batch buffer (no copy).

``Loader(..., bytes_as=...)`` picks the form of every undecoded byte field
(a field whose codec is ``bytes``, or every field with ``decode=False``):

- ``"bytes"`` (default): a list of ``bytes``, copied; yours to keep.
- ``"tensor"``: a list of 1-D uint8 tensors, each a view of the batch
  buffer. This is what ``torchvision.io.decode_jpeg`` takes (a list of 1-D
  uint8 CPU tensors, also for ``device="cuda"``, where a list is decoded as
  one batch), and what nvImageCodec-style decoders take as host buffers.
- ``"jagged"``: one ``torch.nested`` jagged tensor (layout ``torch.jagged``,
  shape ``(batch, j)``) over the same buffer: ``nt.offsets()`` and
  ``nt.lengths()`` locate each sample's bytes in ``nt.values()``. One
  object per field instead of one per sample (built in ~0.3 ms per batch of
  256 here, against ~1.5 ms for 256 slices), moved to a device as one
  tensor. The buffer holds the batch's other fields and tar headers
  between the values, so the tensor has holes (``lengths`` given, not
  contiguous): ``nt.values()`` is that whole span; ``nt.contiguous()``
  compacts it (a copy). ``list(nt.unbind())`` gives the per-sample views but
  costs ~45 us per sample in torch 2.13: ask for ``"tensor"`` for a list.
  Where some sample of the batch lacks the field, that field comes as the
  ``"tensor"`` list instead, with None there (a jagged tensor cannot say
  "absent", and an empty value would be a lie).

Text fields (columnar strings) stay ``str``; decoded fields are unaffected.

Lifetime rule (the contract)
----------------------------
A view is valid, and never changes, until the consumer asks for the next
batch (``next()`` on the loader's iterator, a new ``iter(loader)``, or
``load_state_dict``); then its memory may be refilled with another batch.
``.clone()`` a value (or the jagged tensor) to keep it longer. Both paths
that own batch buffers honour this:

- 0 workers: the views point into the BatchMaker's reused read buffer,
  which is refilled only by the next ``make()``, called when the next
  batch is asked for (a larger batch gets a new buffer; the old one lives
  as long as a view of it).
- workers: the views point into the worker's shared-memory slot. Batch
  ``s`` sits in slot ``(s // W) % P`` of worker ``s % W``; the next batch
  written into that slot is ``s + P*W``, and the loader submits it only
  after the consumer asked for batch ``s + 1`` (it is submitted when the
  generator resumes, never before yielding ``s``). A worker never writes a
  slot it was not told to. A slot that grows is a new segment; the old
  mapping lives as long as a view of it.

Anyone who changes buffer reuse (loader/batcher.py, loader/shm.py,
loader/loader.py) keeps this: a buffer that backs the batch the consumer
holds is not written before the consumer asks for the next one. Tests:
tests/formats/test_payload_views.py (views compared with copies taken at delivery,
after the workers have had time to run ahead, with ``prefetch=1`` so a
violation would overwrite the held slot).

With ``pin_memory=True`` the batch's byte span is copied once into pinned
memory and the views point there: that copy is fresh per batch, so those
views happen to stay valid, but code should follow the rule either way.
"""

from __future__ import annotations

import numpy as np
import torch

BYTES_AS = ("bytes", "tensor", "jagged")


def check_bytes_as(bytes_as: str) -> str:
    if bytes_as not in BYTES_AS:
        raise ValueError(f"bytes_as={bytes_as!r}: use 'bytes' (a list of bytes objects, copied), 'tensor' "
                         "(a list of uint8 tensors viewing the batch buffer, valid until the next batch) or "
                         "'jagged' (one torch.nested jagged tensor over that buffer, same lifetime)")
    return bytes_as


def _span(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, pin_memory: bool) -> tuple[torch.Tensor, int]:
    """A uint8 tensor over the bytes the values lie in, and where that span starts in ``buf``."""
    present = sizes >= 0  # an absent value's start is no position
    if present.all():
        lo, hi = int(starts.min()), int((starts + sizes).max())
    elif present.any():
        lo, hi = int(starts[present].min()), int((starts + sizes)[present].max())
    else:
        lo = hi = 0
    span = buf[lo:hi]
    # a read-only buffer (a collate_fn's bytes joined) is copied once: torch warns on read-only views
    base = torch.from_numpy(span if span.flags.writeable else span.copy())
    if pin_memory:
        base = base.pin_memory()
    return base, lo


def tensor_views(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, pin_memory: bool = False) -> list:
    """Each value as a uint8 tensor viewing ``buf`` (None where size is -1)."""
    n = len(starts)
    if not n:
        return []
    starts = np.asarray(starts, np.int64)
    sizes = np.asarray(sizes, np.int64)
    base, lo = _span(buf, starts, sizes, pin_memory)
    rel = starts - lo
    if int(sizes.min()) >= 0:
        ends = rel + sizes
        if n == 1 or bool((rel[1:] >= ends[:-1]).all()):
            # values in buffer order (what a gather makes): one split_with_sizes call
            # cuts gap, value, gap, value, ... (~0.75 us a value against ~1.15 us for
            # a Python slice each: ~100 us of a batch of 256)
            pieces = np.empty(2 * n, np.int64)
            pieces[0] = rel[0]
            pieces[2::2] = rel[1:] - ends[:-1]
            pieces[1::2] = sizes
            tail = len(base) - int(ends[-1])
            parts = base.split_with_sizes(pieces.tolist() + [tail] if tail else pieces.tolist())
            return list(parts[1:2 * n:2])
        return [base[a:b] for a, b in zip(rel.tolist(), ends.tolist())]
    return [None if z < 0 else base[a:a + z] for a, z in zip(rel.tolist(), sizes.tolist())]


def jagged_view(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, pin_memory: bool = False):
    """The values as one jagged nested tensor over ``buf`` (the list of
    ``tensor_views`` where some value is absent; see the module docstring)."""
    n = len(starts)
    if n and int(sizes.min()) < 0:
        return tensor_views(buf, starts, sizes, pin_memory)
    if not n:
        return torch.nested.nested_tensor_from_jagged(torch.empty(0, dtype=torch.uint8),
                                                      torch.zeros(1, dtype=torch.int64))
    base, lo = _span(buf, starts, sizes, pin_memory)
    offsets = np.empty(n + 1, np.int64)
    offsets[:n] = starts - lo
    offsets[n] = offsets[n - 1] + sizes[n - 1]
    if np.array_equal(offsets[1:], offsets[:-1] + sizes) and offsets[n] == len(base):
        # back to back over the whole span: a contiguous jagged tensor (values() is exactly the bytes)
        return torch.nested.nested_tensor_from_jagged(base, torch.from_numpy(offsets))
    return torch.nested.nested_tensor_from_jagged(base, torch.from_numpy(offsets),
                                                  torch.from_numpy(np.ascontiguousarray(sizes, np.int64)))
