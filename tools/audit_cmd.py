"""`shardfeed audit RECORDS...`: merge ranks' delivery records and judge coverage.

Each record is one rank's ``Loader(..., audit=True).audit_state()`` saved
with ``shardfeed.loader.audit.save`` (one per rank per checkpoint; a run and
its resumed run, at any world sizes, merge into the whole epoch). Per epoch
and source it reports samples delivered, distinct, missed (expected distinct
samples no rank delivered) and repeated (deliveries beyond what the plan
repeats), against the padding the epoch allows. An epoch no record marks as
finished is reported as partial and not judged for missed samples.

A followed stream (alone or in a Mixture) is one epoch, 0, judged for the
published prefix the records consumed (their watermark): every stream
sample below it delivered exactly once, the tail's padding allowed. Records
of a run and of its resumed run differ in the stream's size; they merge.

Exit status: 0 when every guarantee holds, 1 when one is broken (a sample
missed in a finished epoch, or repeats beyond the padding), 2 for unusable
input: a record that is not one, is damaged (each field is checked before
use, naming the file and the field), claims more samples than
--max-samples, or disagrees with the others on the job (dataset, kind, an
epoch's expected counts).
"""

from __future__ import annotations

import argparse

import numpy as np

from shardfeed.loader import audit as _audit
from shardfeed.loader import audit_checks as _records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.strip()
    parser.add_argument("records", nargs="+", help="audit record files (JSON from shardfeed.loader.audit.save)")
    parser.add_argument("--examples", type=int, default=5, help="sample ids shown per problem (default: %(default)s)")
    parser.add_argument("--max-samples", type=int, default=_records.MAX_SAMPLES,
                        help="most samples a record may claim per source (its bitmap takes samples/8 bytes of "
                             "memory, twice; default: %(default)s)")


def merge(states: list[dict], names: list[str]) -> list[dict]:
    """Rows per (epoch, source): delivered, unique, missed, repeated, expected, padded, complete, examples."""
    first = states[0]["sources"]
    stream = states[0].get("stream")
    for st, name in zip(states, names):
        same = [(s["name"], None if i == stream else s["samples"]) for i, s in enumerate(st["sources"])]
        if st.get("stream") != stream or same != [(s["name"], None if i == stream else s["samples"])
                                                  for i, s in enumerate(first)]:
            raise ValueError(f"{name}: its sources {st['sources']} differ from {names[0]}'s {first}; "
                             "audit records of one job together")
    # a stream's size is each record's consumed prefix: judge the longest
    sizes = [max(st["sources"][i]["samples"] for st in states) for i in range(len(first))]
    epochs = sorted({int(e) for st in states for e in st["epochs"]})
    rows = []
    for e in epochs:
        recs = [(st["epochs"][str(e)], nm, st["sources"]) for st, nm in zip(states, names) if str(e) in st["epochs"]]
        ref = max(recs, key=lambda r: r[0]["last_step"])[0]["expect"]
        complete = any(r["complete"] for r, _, _ in recs)
        judged = complete or stream is not None  # a stream's expectation is its consumed prefix
        for i, n in enumerate(sizes):
            union = np.zeros((n + 7) // 8, np.uint8)
            delivered = extra = 0
            examples: list[int] = []
            for r, nm, srcs in recs:
                s = r["sources"][i]
                own = srcs[i]["samples"]
                bits = _records.decode(s["bits"], own, f"{nm}: epoch {e} source {i}")
                if own < n:
                    bits = np.concatenate([bits, np.zeros((n + 7) // 8 - bits.size, np.uint8)])
                overlap = bits & union
                cross = _audit.popcount(overlap)
                if cross and len(examples) < 20:
                    examples += np.flatnonzero(np.unpackbits(overlap)[:n])[:20].tolist()
                extra += cross + s["extra"]
                examples += s["examples"]
                delivered += s["delivered"]
                union |= bits
            unique = _audit.popcount(union)
            missing = np.flatnonzero(np.unpackbits(union)[:n] == 0) if judged and unique < ref["unique"][i] \
                else np.empty(0, np.int64)
            rows.append({"epoch": e, "source": i, "delivered": delivered, "unique": unique,
                         "expected_unique": ref["unique"][i],
                         "missed": max(0, ref["unique"][i] - unique) if judged else 0,
                         "repeated": extra - (ref["delivered"][i] - ref["unique"][i]),
                         "padded": ref["padded"], "complete": complete, "stream": stream is not None,
                         "missed_ids": missing[:20].tolist(), "repeated_ids": sorted(set(examples))[:20]})
    return rows


def judge(rows: list[dict]) -> list[str]:
    """The broken guarantees, one line each (empty when all hold)."""
    bad = []
    for e in sorted({r["epoch"] for r in rows}):
        ep = [r for r in rows if r["epoch"] == e]
        over = sum(max(0, r["repeated"]) for r in ep)
        if over > ep[0]["padded"]:
            bad.append(f"epoch {e}: {over} repeated deliveries, more than the {ep[0]['padded']} the padding allows")
        for r in ep:
            if r["missed"]:
                bad.append(f"epoch {e} source {r['source']}: {r['missed']} samples missed")
    return bad


def main(args: argparse.Namespace) -> int:
    max_samples = getattr(args, "max_samples", _records.MAX_SAMPLES)  # a caller's Namespace may lack it
    if not 0 < max_samples <= 1 << 40:
        print(f"shardfeed audit: error: --max-samples {max_samples} is outside [1, {1 << 40}]")
        return 2
    if not 0 <= args.examples <= 20:
        print(f"shardfeed audit: error: --examples {args.examples} is outside [0, 20]")
        return 2
    try:
        states = [_records.load(p, max_samples) for p in args.records]
        _records.check_agree(states, list(args.records))
        rows = merge(states, list(args.records))
    except ValueError as e:
        print(f"shardfeed audit: {e}")
        return 2
    names = [s["name"] for s in states[0]["sources"]]
    k = max(0, args.examples)
    print(f"{'epoch':>5} {'source':<30} {'delivered':>10} {'unique':>10} {'missed':>7} {'repeated':>8} "
          f"{'padded':>6}  state")
    for r in rows:
        if r["stream"]:
            state = "stream ended" if r["complete"] else "stream prefix"
        else:
            state = "finished" if r["complete"] else "partial"
        print(f"{r['epoch']:>5} {names[r['source']][-30:]:<30} {r['delivered']:>10} {r['unique']:>10} "
              f"{r['missed']:>7} {r['repeated']:>8} {r['padded']:>6}  {state}")
        if r["missed"] and k:
            print(f"      missed ids (first {k}): {r['missed_ids'][:k]}")
        if r["repeated"] > 0 and k:
            print(f"      repeated ids (first {k}): {r['repeated_ids'][:k]}")
    bad = judge(rows)
    ranks = len(args.records)
    if bad:
        print(f"BROKEN: {'; '.join(bad)} ({ranks} record{'s' if ranks != 1 else ''})")
        return 1
    print(f"ok: {len({r['epoch'] for r in rows})} epoch(s), {len(names)} source(s), {ranks} "
          f"record{'s' if ranks != 1 else ''}: nothing missed, repeats within the padding")
    return 0
