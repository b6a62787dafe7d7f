"""`shardfeed bench soak --http-faults`: a remote follower beside the job, and server faults.

The dataset folder is served by a loopback HTTP server (throttled_http.py:
no folder listings, like a CDN) and one more reader process follows it
there with ``follow=True`` through a node cache of its own. The schedule
adds server faults, in turn with the kills: HTTP 500 and 503 (3 answers in
a row, fewer than a fetch's retries), a connection reset mid-body, a stall
longer than the reader's stall timeout and a trickle (a byte every 0.5 s),
each on the next request of a commit entry, a shard or a sidecar in turn
(never two at once on one kind of file: a lagging reader meets them apart).
The reader must deliver every published sample exactly once (lost and
repeated = 0); its RSS and its cache's disk are sampled with the rest.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

KINDS = ("http500", "http503", "reset", "stall", "trickle")
_SUFFIXES = (".json", ".tar", ".idx")  # a commit entry, a shard, a sidecar: in turn
READER_STALL_S = 3.0  # the remote reader's stall timeout (the server's stall lasts longer)


class HttpFaults:
    """The server, the remote reader and their figures (see the module docstring)."""

    def __init__(self, tmp: str, run: str):
        from shardfeed.tools.bench.throttled_http import ThrottledServer

        self.server = ThrottledServer(tmp, bytes_per_s=1e12).__enter__()
        self.server.stall_s = READER_STALL_S + 5
        self.run, self.cache = run, os.path.join(tmp, "cache")
        self.keys = os.path.join(run, "remote-reader.keys")
        self.reader = None
        self.injected = 0

    def start(self, ctx) -> None:
        self.reader = ctx.Process(target=_reader_entry, name="soak-remote-reader", daemon=False,
                                  args=(f"{self.server.url}/data", self.cache, self.keys, self.run))
        self.reader.start()

    def inject(self, kind: str) -> str | None:
        """Arm fault ``kind`` on the next request of the next suffix in turn; returns the suffix.

        None while every suffix still has a fault the reader has not met: a reader behind the
        writer would otherwise meet two faults stacked on one request (3 answers of 503 and then
        3 of 500 outlast a fetch's 5 attempts), which is no longer the fault the schedule names."""
        for skip in range(len(_SUFFIXES)):
            suffix = _SUFFIXES[(self.injected + skip) % len(_SUFFIXES)]
            if not self.server.pending(suffix):
                break
        else:
            return None
        self.injected += skip + 1
        self.server.inject(kind.removeprefix("http"), suffix, 3 if kind.startswith("http") else 1)
        return suffix

    def failed(self) -> bool:
        return self.reader is not None and self.reader.exitcode not in (None, 0)

    def sample(self, row: dict, rss, du) -> None:
        row["reader_rss"] = rss([self.reader.pid] if self.reader is not None and self.reader.exitcode is None else [])
        row["cache_bytes"] = du(self.cache)

    def finish(self, timeout_s: float, idle_s: float = 60.0) -> None:
        """Wait for the follower to reach the end: ``timeout_s``, then for as long as it still
        delivers (a follower behind a 30-minute writer drains a backlog after the job has), and
        give up only after ``idle_s`` without a new key, saying how far it got."""
        self.reader.join(max(1.0, timeout_s))
        seen = self._delivered()
        while self.reader.exitcode is None:
            self.reader.join(idle_s)
            now = self._delivered()
            if now == seen:
                break
            seen = now
        if self.reader.exitcode != 0:
            raise RuntimeError(f"bench soak: the remote reader did not finish the stream (exit "
                               f"{self.reader.exitcode}; {seen:,} keys delivered, none new in {idle_s:g} s); "
                               f"see {self.run}")

    def _delivered(self) -> int:
        try:
            with open(self.keys, "rb") as f:
                return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        if self.reader is not None and self.reader.exitcode is None:
            try:
                os.killpg(self.reader.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reader.join(10)
        self.server.__exit__(None, None, None)

    def report(self, root: str, samples: list) -> dict:
        """Lost and repeated against every published key, faults served by kind, peak RSS and disk."""
        from shardfeed.formats.commit_log import open_stream_index
        from shardfeed.formats.readers import open_shard

        index = open_stream_index(root)[0]
        published = set()
        for i in range(len(index)):
            with open_shard(index, i) as reader:
                published.update(reader.table.keys)
        with open(self.keys) as f:
            got = Counter(line.rstrip("\n") for line in f if line.strip())
        served = {("http" + k if k in ("500", "503") else k): v for k, v in self.server.hits.items()}
        return {"published": len(published), "delivered": sum(got.values()), "unique": len(got),
                "lost": len(published - set(got)), "repeated": sum(got.values()) - len(got),
                "unknown": len(set(got) - published), "faults_served": served,
                "requests": self.server.requests,
                "peak_rss": max((x.get("reader_rss", 0) for x in samples), default=0),
                **_thirds([x["reader_rss"] for x in samples if x.get("reader_rss")]),
                "peak_cache_bytes": max((x.get("cache_bytes", 0) for x in samples), default=0)}


def _thirds(rss: list) -> dict:
    """Mean RSS of the first and last third of the run (flat memory: about equal)."""
    third = max(1, len(rss) // 3)
    return {"rss_first_third_mean": sum(rss[:third]) / third if rss else 0,
            "rss_last_third_mean": sum(rss[-third:]) / third if rss else 0}


def _reader_entry(url, cache, keys, run) -> None:
    from shardfeed.tools.bench.soak_procs import remote_reader_main

    try:
        remote_reader_main(url, cache, keys, 120.0, READER_STALL_S)
    except BaseException as e:  # noqa: BLE001 - the driver reports why the reader stopped
        with open(os.path.join(run, "error-remote-reader"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        os._exit(3)
