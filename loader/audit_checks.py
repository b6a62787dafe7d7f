"""Audit records read back as untrusted input: every field checked before use.

``shardfeed audit`` merges files that travelled (checkpoints copied between
machines, edited, cut short). A damaged one must say which file and what is
wrong (ValueError, exit 2), never raise zlib.error or KeyError (exit 1 reads
as "a guarantee broke"), and never allocate what it merely claims: a
bitmap's size is checked against a bound before any memory is taken, and
its inflation is capped at that size (zlib.decompressobj with max_length),
so neither a huge claimed sample count nor a compression bomb grows memory.

The layout is the one loader/audit.py writes (AuditRecorder.state()).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import zlib

import numpy as np

from shardfeed.loader.audit import VERSION

# samples per source a record may claim: its bitmap is samples/8 bytes, held once per record and once
# for the merge. 2**33 samples = 1 GiB a bitmap; `shardfeed audit --max-samples` raises it.
MAX_SAMPLES = 1 << 33
MAX_RECORD_BYTES = 1 << 32  # a record file larger than this is not one (the JSON is read whole)
_EXAMPLES = 1000


def _int(v, what: str, lo: int = 0, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{what} is {v!r}, expected an integer {rng}")
    return v


def _ints(v, what: str, n: int, hi: int | None = None) -> list[int]:
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"{what} is {_short(v)}, expected a list of {n} integers")
    return [_int(x, f"{what}[{i}]", 0, hi) for i, x in enumerate(v)]


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _dict(v, what: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{what} is {_short(v)}, expected an object")
    missing = [k for k in keys if k not in v]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")
    return v


def check(state, max_samples: int = MAX_SAMPLES) -> dict:
    """``state`` (a parsed record) if every field has its type and range; ValueError (the field) if not."""
    _dict(state, "the record", ("version", "epochs", "sources"))
    if state["version"] != VERSION:
        raise ValueError(f"audit record version {state['version']!r} is not {VERSION} (written by another "
                         "shardfeed release, or not an audit record)")
    srcs = state["sources"]
    if not isinstance(srcs, list) or not srcs:
        raise ValueError(f"sources is {_short(srcs)}, expected a non-empty list")
    for i, s in enumerate(srcs):
        _dict(s, f"sources[{i}]", ("name", "samples"))
        if not isinstance(s["name"], str):
            raise ValueError(f"sources[{i}].name is {_short(s['name'])}, expected a string")
        _int(s["samples"], f"sources[{i}].samples", 0, max_samples)
    n = len(srcs)
    stream = state.get("stream")
    if stream is not None:
        _int(stream, "stream", 0, n - 1)
    for k in ("rank", "world_size"):
        if k in state:
            _int(state[k], k, 1 if k == "world_size" else 0)
    if not isinstance(state.get("kind", ""), str):
        raise ValueError(f"kind is {_short(state['kind'])}, expected a string")
    epochs = state["epochs"]
    if not isinstance(epochs, dict):
        raise ValueError(f"epochs is {_short(epochs)}, expected an object")
    for e, rec in epochs.items():
        if not (isinstance(e, str) and e.isdigit() and len(e) < 19):
            raise ValueError(f"epoch key {e!r} is not an epoch number")
        w = f"epochs[{e}]"
        _dict(rec, w, ("expect", "complete", "last_step", "sources"))
        if not isinstance(rec["complete"], bool):
            raise ValueError(f"{w}.complete is {_short(rec['complete'])}, expected true or false")
        _int(rec["last_step"], f"{w}.last_step", -1)
        ex = _dict(rec["expect"], f"{w}.expect", ("delivered", "unique", "padded"))
        _ints(ex["delivered"], f"{w}.expect.delivered", n)
        uniq = _ints(ex["unique"], f"{w}.expect.unique", n)
        for i, (u, s) in enumerate(zip(uniq, srcs)):
            if u > s["samples"]:
                raise ValueError(f"{w}.expect.unique[{i}] = {u} is more than source {i}'s {s['samples']} samples")
        _int(ex["padded"], f"{w}.expect.padded")
        if not isinstance(rec["sources"], list) or len(rec["sources"]) != n:
            raise ValueError(f"{w}.sources is {_short(rec['sources'])}, expected a list of {n} sources")
        for i, s in enumerate(rec["sources"]):
            ws = f"{w}.sources[{i}]"
            _dict(s, ws, ("delivered", "extra", "examples", "bits"))
            _int(s["delivered"], f"{ws}.delivered")
            _int(s["extra"], f"{ws}.extra")
            if not isinstance(s["examples"], list) or len(s["examples"]) > _EXAMPLES:
                raise ValueError(f"{ws}.examples is {_short(s['examples'])}, expected a list of sample ids")
            for x in s["examples"]:
                _int(x, f"{ws}.examples[]")
            if not isinstance(s["bits"], str):
                raise ValueError(f"{ws}.bits is {_short(s['bits'])}, expected base64 text")
    return state


def load(path, max_samples: int = MAX_SAMPLES) -> dict:
    """Read and check an audit record; ValueError naming the file and the field if it is not a sound one."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_RECORD_BYTES:
                raise ValueError(f"the file is over {MAX_RECORD_BYTES} bytes")
            state = json.loads(f.read())
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not a readable audit record ({e}); pass files written by "
                         "shardfeed.loader.audit.save(loader.audit_state(), path)") from e
    try:
        return check(state, max_samples)
    except ValueError as e:
        raise ValueError(f"{path}: not a sound audit record: {e}") from None


def decode(text: str, n: int, where: str) -> np.ndarray:
    """The packed bitmap of ``n`` samples in ``text``; ValueError if it is not exactly that.

    Memory: the base64 text is checked against the most zlib could need for
    that many bytes before it is decoded, and inflation stops one byte past
    the expected size."""
    need = (n + 7) // 8
    # zlib never grows incompressible input by more than ~0.1% + a few bytes; base64 adds 1/3
    if len(text) > 4 * ((need + need // 1000 + 64) // 3 + 1):
        raise ValueError(f"{where}: bitmap text of {len(text)} characters is larger than any encoding of "
                         f"{n} samples (corrupt record)")
    try:
        raw = base64.b64decode(text, validate=True)
        d = zlib.decompressobj()
        out = d.decompress(raw, need + 1)
    except (binascii.Error, zlib.error, ValueError) as e:
        raise ValueError(f"{where}: bitmap is not valid base64 zlib data ({e}) (corrupt record)") from None
    if len(out) != need or not d.eof:
        got = f"more than {need}" if len(out) > need else f"{len(out)}{'' if d.eof else ' (cut short)'}"
        raise ValueError(f"{where}: bitmap holds {got} bytes, expected {need} for {n} samples "
                         "(a record of another dataset, or a corrupt one)")
    return np.frombuffer(out, np.uint8).copy()


def check_agree(states: list[dict], names: list[str]) -> None:
    """Records of one job: the same kind and stream, and, among records of one
    world size, the same expectation for every epoch both hold. A stream's
    expectation is the prefix each record consumed (a run and its resumed run
    differ in it), so stream records are held to the same kind and sources only."""
    first, name0 = states[0], names[0]
    for st, name in zip(states[1:], names[1:]):
        for k in ("kind", "stream"):
            if st.get(k) != first.get(k):
                raise ValueError(f"{name}: its {k} {st.get(k)!r} differs from {name0}'s {first.get(k)!r}; "
                                 "audit records of one job together")
    if first.get("stream") is not None:
        return
    ref: dict = {}
    for st, name in zip(states, names):
        for e, rec in st["epochs"].items():
            key = {k: rec["expect"][k] for k in ("delivered", "unique", "padded")}
            seen = ref.setdefault((st.get("world_size"), e), (key, name))
            if seen[0] != key:
                raise ValueError(f"{name}: epoch {e} expects {key}, {seen[1]} (same world size) expects "
                                 f"{seen[0]}: records of different runs or datasets; audit one job's records")
