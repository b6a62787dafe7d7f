"""Worker processes: each makes the batches the main process assigns to it.

Batch ``b`` of an epoch always goes to worker ``b % num_workers`` and the
main process takes results in batch order, so the order never depends on the
number of workers. A worker gets the epoch's plan once per iteration
(``("plan", plan)``: ~1.4 KB pickled) and then only ``(b, start, stop,
slot, image_size, key)`` per batch (key: what seeds the batch's transform,
batch_seeds.py), computing the sample ids itself: the main
process neither computes nor pickles them (~45 us per batch of 256 there).
Results are values: ``("ok", b, header, info)`` or
``("err", b, exception, traceback text)``; an exception raised in a worker is
re-raised by the consumer. A worker that dies without a word (SIGKILL,
segfault) is noticed through its process sentinel within ``poll_s``.

Processes are forked by default (fast start; the dataset's index is
inherited, not pickled). Workers touch numpy, numba and pyarrow, not torch's
thread pools, and set torch to one thread, so a fork after torch started its
threads is safe. ``spawn`` and ``forkserver`` work too: the maker factory
(MakerFactory) and the pipe ends are pickled to the child. Each worker also watches its parent: if the main process is killed, the
workers exit instead of lingering as orphans.

Signals: a worker ignores SIGINT (a Ctrl-C reaches the whole process group;
the main process decides, as torch's DataLoader workers stay quiet), and
SIGTERM ends it through its ``finally``, which unlinks its shared-memory
segments: multiprocessing sends daemon workers SIGTERM when the main process
exits without closing the loader (an exception, a rank's error).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait

from shardfeed.formats import ShardError
from shardfeed.loader import shm
from shardfeed.loader.batch_seeds import in_worker, set_batch
from shardfeed.loader.error_policy import WorkerError

_PARENT_CHECK_S = 1.0


def _portable(exc: BaseException):
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _Terminated(BaseException):
    """SIGTERM in a worker: unwinds to the ``finally`` that unlinks its segments."""


def _on_sigterm(_signum, _frame) -> None:
    raise _Terminated


def _worker_main(wid: int, make_maker: MakerFactory, tasks, results, prefix: str, slots: int, parent: int,
                 close_fds) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _serve(wid, make_maker, tasks, results, prefix, slots, parent, close_fds)
    except (_Terminated, KeyboardInterrupt):
        pass  # the main process stops us (or a Ctrl-C came before SIGINT was ignored): nothing to report


def _serve(wid: int, make_maker: MakerFactory, tasks, results, prefix: str, slots: int, parent: int, close_fds) -> None:
    for c in close_fds:
        c.close()
    try:
        import torch

        torch.set_num_threads(1)
    except Exception:
        pass
    maker = make_maker()
    in_worker(maker)
    make_maker.warm(maker)  # load jitted code now, in parallel with the other workers
    writer = shm.SlotWriter(prefix, wid, slots)
    plan = None
    # one poll object for the worker's life: Connection.poll builds a selector
    # per call (~20 us of CPU a batch on a 2-core machine the main process shares)
    poller = select.poll()
    poller.register(tasks.fileno(), select.POLLIN)
    try:
        while True:
            if not poller.poll(_PARENT_CHECK_S * 1000):
                if parent is not None and os.getppid() != parent:
                    return
                continue
            try:
                msg = tasks.recv()
            except (EOFError, OSError):
                return
            if msg is None:
                return
            if msg[0] == "plan":
                plan = msg[1]
                continue
            b, start, stop, slot, image_size, key = msg
            try:
                set_batch(maker, key)
                ids = plan.positions(start, stop)
                maker.hint(plan, start, stop)
                columns, info = maker.make(ids, image_size, alloc=writer.alloc(slot))
                header = writer.pack(slot, columns)
                out = ("ok", b, header, info)
            except _Terminated:
                raise
            except BaseException as e:  # noqa: BLE001 - every failure travels to the consumer
                out = ("err", b, _portable(e), traceback.format_exc())
            try:
                results.send(out)
            except (BrokenPipeError, OSError):
                return
    finally:
        writer.close()
        maker.close()


class WorkerPool:
    """``num_workers`` named daemon processes with a task and a result pipe each."""

    def __init__(self, num_workers: int, make_maker: MakerFactory, slots: int, name: str = "shardfeed-loader", context=None):
        if context is None:
            context = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(context) if isinstance(context, str) else context
        forked = ctx.get_start_method() == "fork"
        self.start_method = ctx.get_start_method()
        # a forkserver child's parent is the server, not us: it notices our
        # death by EOF on its task pipe instead
        parent = None if ctx.get_start_method() == "forkserver" else os.getpid()
        shm.prune_stale()  # segments of loaders that were killed
        self.prefix = shm.new_prefix()
        self.slots = slots
        self.reader = shm.SlotReader()
        self.procs, self.tasks, self.results = [], [], []
        self.outstanding: list[int] = []
        self._current: dict[tuple[int, int], str] = {}
        self._closed = False
        ends = []
        for _ in range(num_workers):
            t_recv, t_send = ctx.Pipe(duplex=False)
            r_recv, r_send = ctx.Pipe(duplex=False)
            ends.append((t_recv, t_send, r_recv, r_send))
        try:
            for w, (t_recv, _t_send, _r_recv, r_send) in enumerate(ends):
                # a forked child closes every end that is not its own, so EOF works
                # both ways; a spawned one inherits only what it is given
                others = [c for i, e in enumerate(ends) for c in e
                          if not (i == w and c in (t_recv, r_send))] if forked else []
                p = ctx.Process(target=_worker_main, name=f"{name}-{w}", daemon=True,
                                args=(w, make_maker, t_recv, r_send, self.prefix, slots, parent, others))
                p.start()
                self.procs.append(p)
        finally:
            for t_recv, _t_send, _r_recv, r_send in ends:
                t_recv.close()
                r_send.close()
        self.tasks = [e[1] for e in ends]
        self.results = [e[2] for e in ends]
        self.outstanding = [0] * num_workers
        # per worker, one poll object on its result pipe and every worker's
        # sentinel, built once: multiprocessing's wait() builds a selector and
        # registers them all again on every call
        self._pollers = []
        for conn in self.results:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            for p in self.procs:
                poller.register(p.sentinel, select.POLLIN)
            self._pollers.append(poller)

    @property
    def num_workers(self) -> int:
        return len(self.procs)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def set_plan(self, plan) -> None:
        """The plan whose positions the following submits refer to (every worker)."""
        if self._closed:
            raise RuntimeError("the loader's workers are closed")
        for w, conn in enumerate(self.tasks):
            try:
                conn.send(("plan", plan))
            except (BrokenPipeError, OSError):
                self._raise_dead(w, -1)

    def submit(self, w: int, b: int, start: int, stop: int, slot: int, image_size, key=None) -> None:
        """Batch ``b``: positions ``start:stop`` of the current plan, into ``slot``; ``key``
        seeds its transform's draws (batch_seeds.py)."""
        if self._closed:
            raise RuntimeError("the loader's workers are closed")
        try:
            self.tasks[w].send((b, start, stop, slot, image_size, key))
        except (BrokenPipeError, OSError):
            self._raise_dead(w, b)
        self.outstanding[w] += 1

    def receive(self, w: int, b: int, slot: int, timeout: float | None = None):
        """The result of batch ``b`` from worker ``w``: (columns as views, info)."""
        conn, proc = self.results[w], self.procs[w]
        fd, poller = conn.fileno(), self._pollers[w]
        while True:
            ready = {f for f, _ in poller.poll(None if timeout is None else max(0, int(timeout * 1000)))}
            if not ready:
                raise WorkerError(f"worker {w} (pid {proc.pid}) sent nothing for batch {b} in {timeout} s")
            if fd in ready:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._raise_dead(w, b)
                self.outstanding[w] -= 1
                kind, got, payload, extra = msg
                if kind == "err":
                    self.close()
                    if isinstance(payload, ShardError):
                        payload.add_note(f"in loader worker {w} (pid {proc.pid}), batch {b}:\n{extra}")
                        raise payload
                    raise WorkerError(f"loader worker {w} (pid {proc.pid}) failed on batch {b}: "
                                      f"{type(payload).__name__}: {payload}\n--- worker traceback ---\n{extra}") \
                        from payload
                if got != b:
                    continue  # a result of an abandoned iteration
                name = payload.get("seg")
                if name is not None and self._current.get((w, slot)) != name:
                    old = self._current.get((w, slot))
                    self._current[(w, slot)] = name
                    if old is not None:
                        self.reader.forget(old)  # the worker outgrew it
                return self.reader.unpack(payload), extra
            for i, p in enumerate(self.procs):
                if p.sentinel in ready and not p.is_alive():
                    self._raise_dead(i, b)

    def _raise_dead(self, w: int, b: int):
        p = self.procs[w]
        p.join(timeout=1)
        code = p.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        self.close()
        raise WorkerError(f"loader worker {w} (pid {p.pid}) {how} while the main process waited for batch {b}; "
                          f"the epoch cannot continue (resume from the last state_dict()){self._spawn_hint(code)}")

    def _spawn_hint(self, code) -> str:
        main = sys.modules.get("__main__")
        # __main__ (a foreign module) has no __file__ in an interactive session
        if code != 1 or self.start_method == "fork" or not getattr(main, "__file__", None):
            return ""
        # the usual cause: a spawned child imports the script again and starts a Loader of its own
        return (f". Workers started with {self.start_method!r} import the main script ({main.__file__}) again: "
                "put the code that builds and iterates the Loader under `if __name__ == \"__main__\":`, or pass "
                "multiprocessing_context=\"fork\"")

    def drain(self) -> None:
        """Discard results of an abandoned iteration so the next one starts clean."""
        for w in range(self.num_workers):
            while self.outstanding[w] > 0:
                self._discard(w)

    def _discard(self, w: int) -> None:
        conn, proc = self.results[w], self.procs[w]
        ready = wait([conn, proc.sentinel], timeout=60)
        if conn not in ready:
            self._raise_dead(w, -1)
        conn.recv()  # a result (or error) nobody waits for any more
        self.outstanding[w] -= 1

    def close(self) -> None:
        """Stop and join the workers, remove their segments; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for c in self.tasks:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=2)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.tasks + self.results:
            c.close()
        self.reader.close()
        shm.cleanup(self.prefix)


class MakerFactory:
    """Builds a worker's BatchMaker; a plain picklable object (not a closure)
    so workers can be spawned as well as forked."""

    def __init__(self, dataset, collate_fn: Callable | None, readers: int = 1):
        self.dataset, self.collate_fn, self.readers = dataset, collate_fn, readers

    def __call__(self):
        if self.readers > 1:  # siblings decode each Parquet row group once between them
            from shardfeed.formats.engine.row_group_share import share_in_this_process

            share_in_this_process()
        if self.dataset.cache is not None:  # sizes what each reader keeps pinned
            return self.dataset.maker(self.collate_fn, readers=self.readers)
        maker = self.dataset.maker(self.collate_fn)
        maker.stride = self.readers  # a worker reads every num_workers-th batch
        return maker

    def warm(self, maker) -> None:
        """Load the jitted gather and this order's permutation before the
        first task: a fresh worker otherwise spends ~1 s of its first batch
        loading them from numba's cache, and the batches of the worker that
        starts second wait behind that on the consumer's path."""
        maker.reader.warm()
        if self.dataset.follow:
            return  # a stream has no fixed plan to warm
        plan = self.dataset.unbatched_plan()
        if plan.num_samples:
            plan.positions(0, 1)
