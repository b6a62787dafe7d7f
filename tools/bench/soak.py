"""`shardfeed bench soak`: streaming ingest + follow on 2 ranks under scheduled faults.

A writer process appends samples at a steady rate to a live dataset; a job
of 2 follower ranks (forked processes joined by gloo, one all_reduce per
step, ``num_workers`` loader workers each) follows it, saving every rank's
loader state and audit record together every ``--every`` steps. On a
schedule the driver SIGKILLs, in turn: a loader worker of one rank (that rank
gets WorkerError), the writer (its partial shard must never be published; a
new writer continues the log), a whole rank. Any rank failure is handled as
a real job would: every rank is stopped and the job restarts from the last
complete checkpoint, so the steps after that checkpoint are delivered again
(counted as replays, not as repeats: the records saved with the checkpoints
cover exactly what each checkpoint consumed). At the end the writer ends the
stream, the job drains it, and ``shardfeed audit`` judges the merged records
of the checkpoint chain: every published sample delivered exactly once.

``--disk-faults``: the dataset lives on a small tmpfs of its own (when it
can be mounted, as root) and the schedule adds, in turn with the kills, a
full disk: the file system filled to its last 16 KiB for a while, so the
writer meets ENOSPC (it dies; a new writer continues once there is room,
and no partial shard may be published). Memory (RSS of every rank and
worker) and disk (the dataset) are sampled every 5 s in any run.

``--http-faults`` (soak_http.py): a third reader follows the dataset over
loopback HTTP through a node cache, and the schedule adds server faults
(500, 503, reset, stall, trickle); it must deliver every sample once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import socket
import subprocess
import tempfile
import time

from shardfeed.tools.bench.soak_procs import WORLD, data_fs_bytes, latest_checkpoint, rank_main, writer_main
from shardfeed.tools.bench.soak_report import keep_records, report
from shardfeed.tools.text import plural

KINDS = ("worker", "writer", "rank")


def add_arguments(p) -> None:
    p.description = __doc__.strip()
    p.add_argument("--minutes", type=float, default=30.0, help="how long the writer ingests (default: %(default)s)")
    p.add_argument("--fault-every-s", type=float, default=None,
                   help="seconds between faults (default: 30, or a quarter of a shorter run)")
    p.add_argument("--rate", type=float, default=100.0, help="samples published per second (default: %(default)s)")
    p.add_argument("--per-shard", type=int, default=40, help="samples per shard (default: %(default)s)")
    p.add_argument("--batch", type=int, default=4, help="per-rank batch size (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank (default: %(default)s)")
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps (default: %(default)s)")
    p.add_argument("--drain-timeout-s", type=float, default=300.0,
                   help="after ingest stops, how long the job may take to drain (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a 0.5-minute run")
    p.add_argument("--disk-faults", action="store_true",
                   help="keep the dataset on a small tmpfs and add a full disk (ENOSPC) to the schedule")
    p.add_argument("--http-faults", action="store_true",
                   help="also follow the dataset over loopback HTTP through a node cache, and add server "
                        "faults (500, 503, reset, stall, trickle) to the schedule")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` that are loader workers (not multiprocessing's resource tracker)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"resource_tracker" not in cmd:
            out.append(int(d))
    return out


def _killpg(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.join(10)


class _Run:
    """The driver's view: the writer, the current job, the faults and restarts."""

    def __init__(self, args, tmp: str):
        self.ctx = mp.get_context("fork")
        self.args = args
        self.root, self.run, self.ckpt = (os.path.join(tmp, d) for d in ("data", "run", "ckpt"))
        for d in (self.run, self.ckpt):
            os.makedirs(d)
        from shardfeed.formats.commit_log import LOG_DIR

        self.kinds, self.mounted, self.filler, self.samples, self.enospc_writers = KINDS, False, None, [], 0
        self.fs_bytes = None
        if getattr(args, "disk_faults", False):
            os.makedirs(self.root)
            minutes = 0.5 if getattr(args, "quick", False) else args.minutes
            self.fs_bytes = data_fs_bytes(minutes, args.rate)
            self.mounted = _mount_tmpfs(self.root, self.fs_bytes)
            if not self.mounted:  # never fill a disk other processes share
                raise RuntimeError("bench soak --disk-faults: could not mount a tmpfs for the dataset (needs "
                                   "root); run without --disk-faults")
            self.kinds = KINDS + ("disk",)
        os.makedirs(os.path.join(self.root, LOG_DIR))
        self.http = None
        if getattr(args, "http_faults", False):
            from shardfeed.tools.bench.soak_http import KINDS as HTTP_KINDS
            from shardfeed.tools.bench.soak_http import HttpFaults

            self.http = HttpFaults(tmp, self.run)
            self.kinds = self.kinds + HTTP_KINDS
        self.stop_file = os.path.join(self.run, "STOP")
        self.gen, self.job, self.writer, self.ranks = -1, -1, None, []
        self.faults: list[dict] = []
        self.restarts = 0

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
        if self.mounted:
            subprocess.run(["umount", "-l", self.root], check=False)

    def sample(self) -> None:
        """RSS of the ranks and their workers, disk of the dataset."""
        pids = [p.pid for p in self.ranks if p.exitcode is None]
        procs = len(pids) + sum(len(_children(p)) for p in pids)
        row = {"t": time.time(), "rss": _rss(pids), "procs": procs, "data_bytes": _du(self.root)}
        if self.http is not None:
            self.http.sample(row, _rss, _du)
        self.samples.append(row)

    def start_writer(self) -> None:
        self.gen += 1
        a = self.args
        self.writer = self.ctx.Process(target=writer_main, name=f"soak-writer-{self.gen}", daemon=False,
                                       args=(self.root, self.gen, a.per_shard, a.rate, self.stop_file))
        self.writer.start()

    def start_job(self) -> None:
        self.job += 1
        a = self.args
        cfg = {"root": self.root, "run": self.run, "ckpt": self.ckpt, "job": self.job, "batch": a.batch,
               "workers": a.workers, "every": a.every, "resume": latest_checkpoint(self.ckpt),
               "idle_timeout_s": 120.0, "collective_timeout_s": 60.0}
        port = _free_port()
        self.ranks = [self.ctx.Process(target=_rank_entry, args=(r, WORLD, port, cfg), daemon=False,
                                       name=f"soak-job{self.job}-rank{r}") for r in range(WORLD)]
        for p in self.ranks:
            p.start()

    def stop_job(self) -> None:
        for p in self.ranks:
            _killpg(p)

    def check_job(self) -> bool | None:
        """True when every rank finished, False after a failure (the job was restarted), None while running."""
        codes = [p.exitcode for p in self.ranks]
        if all(c == 0 for c in codes):
            return True
        if any(c not in (None, 0) for c in codes):
            self.stop_job()
            self.restarts += 1
            self.start_job()
            return False
        return None

    def inject(self, kind: str) -> bool:
        """SIGKILL one victim of ``kind``; False when there is none yet (a job still starting)."""
        rank = random.randrange(WORLD)
        if kind == "disk":
            return self._fill_disk()
        if self.http is not None and kind in self.http_kinds():
            on = self.http.inject(kind)
            if on is None:
                return False  # the reader has not met the faults armed so far: try again shortly
            self.faults.append({"kind": kind, "time": time.time(), "job": self.job, "writer": self.gen,
                                "rank": None, "on": on})
            return True
        if kind == "worker":
            kids = _children(self.ranks[rank].pid) if self.ranks[rank].exitcode is None else []
            if not kids:
                return False
            os.kill(random.choice(kids), signal.SIGKILL)
        elif kind == "rank":
            if self.ranks[rank].exitcode is not None:
                return False
            os.killpg(self.ranks[rank].pid, signal.SIGKILL)
        else:
            _killpg(self.writer)
            self.start_writer()
        self.faults.append({"kind": kind, "time": time.time(), "job": self.job, "writer": self.gen - 1
                            if kind == "writer" else self.gen, "rank": None if kind == "writer" else rank})
        return True


    def http_kinds(self) -> tuple:
        return self.kinds[len(KINDS) + ("disk" in self.kinds):]

    def _fill_disk(self) -> bool:
        """Fill the dataset's file system to its last 16 KiB for a while (a neighbour filling the disk)."""
        span = max(2.0, min(10.0, self.args.fault_every_s_eff / 2))
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        if free <= 16 << 10 or self.filler is not None:
            return False
        path = os.path.join(self.root, ".soak-filler")  # a dot-name: no reader takes it for a shard
        with open(path, "wb") as f:
            try:
                left = free - (16 << 10)
                while left > 0:
                    left -= f.write(bytes(min(left, 1 << 20)))
                f.flush()
            except OSError:
                pass
        self.filler = (path, time.monotonic() + span)
        self.faults.append({"kind": "disk", "time": time.time(), "job": self.job, "writer": self.gen, "rank": None})
        return True

    def writer_died(self) -> bool:
        """A writer that met the full disk died: start another once there is room (True), else False."""
        if self.filler is None and not any(f["kind"] == "disk" and time.time() - f["time"] < 60
                                           for f in self.faults[-2:]):
            return False
        if self.filler is not None:
            return True  # wait for room before starting one
        self.enospc_writers += 1
        self.start_writer()
        return True

    def clear_disk(self, force: bool = False) -> None:
        if self.filler is not None and (force or time.monotonic() >= self.filler[1]):
            os.unlink(self.filler[0])
            self.filler = None


def _mount_tmpfs(path: str, size: int) -> bool:
    """A small file system for the dataset, so a full disk is a real ENOSPC (root only; else a folder)."""
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
            except OSError:
                pass
    return total


def _rss(pids) -> int:
    """RSS of ``pids`` and their loader workers."""
    rss = 0
    for pid in list(pids) + [k for p in pids for k in _children(p)]:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return rss


def _rank_entry(rank, world, port, cfg) -> None:
    try:
        rank_main(rank, world, port, cfg)
    except BaseException as e:  # noqa: BLE001 - the driver reads why the rank stopped
        with open(os.path.join(cfg["run"], f"error-job{cfg['job']:04d}-rank{rank}"), "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        os._exit(3)


def _drive(r: _Run, args, minutes: float, every_s: float) -> None:
    r.start_writer()
    r.start_job()
    if r.http is not None:
        r.http.start(r.ctx)
    t_end = time.monotonic() + minutes * 60
    next_fault, k = time.monotonic() + every_s, 0
    next_sample = 0.0
    while time.monotonic() < t_end:
        if time.monotonic() >= next_sample:
            r.sample()
            next_sample = time.monotonic() + 5
        r.clear_disk()
        if r.writer.exitcode is not None and not r.writer_died():
            raise RuntimeError(f"bench soak: the writer (generation {r.gen}) exited with {r.writer.exitcode} "
                               "without being killed; see its traceback above")
        if r.http is not None and r.http.failed():
            raise RuntimeError(f"bench soak: the remote reader failed; see {os.path.join(r.run, 'error-remote-reader')}")
        if r.check_job() is True:
            raise RuntimeError(f"bench soak: the job ended before the stream did (job {r.job}); "
                               f"see {r.run}")
        if time.monotonic() >= next_fault and r.inject(r.kinds[k % len(r.kinds)]):
            f = r.faults[-1]
            what = ("filled the dataset's disk" if f["kind"] == "disk" else f"killed {f['kind']}" if "on" not in f
                    else f"server fault {f['kind']} on the next {f['on']} request")
            print(f"soak: {time.monotonic() - t_end + minutes * 60:7.1f} s  {what}"
                  + (f" of rank {f['rank']}" if f["rank"] is not None else "") + f" (job {f['job']})", flush=True)
            k += 1
            next_fault = time.monotonic() + every_s
        time.sleep(0.05)
    r.clear_disk(force=True)
    with open(r.stop_file, "w"):
        pass
    r.writer.join(120)
    if r.writer.exitcode != 0:
        raise RuntimeError(f"bench soak: the last writer did not end the stream (exit {r.writer.exitcode})")
    deadline = time.monotonic() + args.drain_timeout_s
    while (done := r.check_job()) is not True:
        if time.monotonic() > deadline:
            r.stop_job()
            for n in sorted(os.listdir(r.run)):
                if n.startswith("error-"):
                    with open(os.path.join(r.run, n)) as f:
                        print(f"soak: {n}: {f.read()[:400]}", flush=True)
            raise RuntimeError(f"bench soak: the job did not drain the stream in {args.drain_timeout_s:g} s "
                               f"(--drain-timeout-s); records in {r.run}")
        time.sleep(0.1 if done is None else 0)
    if r.http is not None:
        r.http.finish(deadline - time.monotonic())
        r.sample()


def main(args) -> int:
    import torch  # noqa: F401 - imported once here, so the forked ranks need not import it again

    minutes = 0.5 if args.quick else args.minutes
    every_s = args.fault_every_s or min(30.0, minutes * 60 / 4)
    from shardfeed.tools.arg_bounds import duration

    err = duration("--minutes", minutes, above=True, hi=7 * 24 * 60) or duration(
        "--fault-every-s", every_s, above=True, hi=86400.0)
    if err:
        raise ValueError(err)
    args.fault_every_s_eff = every_s
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        r = _Run(args, tmp)
        try:
            try:
                _drive(r, args, minutes, every_s)
            except RuntimeError:
                keep_records(r.run, args.out)  # the messages name records in tmp, removed on the way out
                raise
            finally:
                r.stop_job()
                if r.writer is not None:
                    _killpg(r.writer)
            res = report(r, args, minutes)
            if r.http is not None:
                m = res["remote"] = r.http.report(r.root, r.samples)
                clean = not (m["lost"] or m["repeated"] or m["unknown"])
                for k in r.http_kinds():  # a server fault is survived when the remote follower lost nothing
                    res["survived"][k] = res["faults"][k] if clean and m["faults_served"].get(k) else 0
        finally:
            r.close()
    f, s = res["faults"], res["survived"]
    print(f"bench soak: {minutes:g} min, {plural(res['published'], 'sample')} published, "
          f"{res['unique']:,} delivered once ({res['replayed']:,} replayed after restarts), lost {res['lost']}, "
          f"partial shards published {res['partial_shards_published']}; "
          f"faults injected/survived: " + ", ".join(f"{k} {f[k]}/{s[k]}" for k in r.kinds if k in f)
          + f"; {plural(res['job_restarts'], 'job restart')}, {plural(res['writers'], 'writer')}")
    if "remote" in res:
        m = res["remote"]
        print(f"bench soak: remote follower over HTTP: {m['unique']:,} delivered once, lost {m['lost']}, "
              f"repeated {m['repeated']}; server faults served: "
              + ", ".join(f"{k} {v}" for k, v in sorted(m["faults_served"].items()))
              + f"; peak RSS {m['peak_rss'] / 2**20:.0f} MiB, peak cache {m['peak_cache_bytes'] / 2**20:.1f} MiB")
    from shardfeed.tools.bench import results

    results.write(args.out, {"bench_soak.json": res}, say="soak")
    m = res.get("remote", {})
    bad = m.get("lost") or m.get("repeated") or m.get("unknown") or res["lost"] or res["audit_exit"] or res["partial_shards_published"] or sum(f.values()) != sum(s.values())
    return 1 if bad else 0
