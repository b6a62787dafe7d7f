"""Publishing a staged dataset folder: DST checks, the swap into DST, and the older host+pid stages.

A writer that builds a whole dataset at once (``shardfeed convert``, the Ray
datasink) writes it into a hidden stage beside DST (``stage_path``) and
publishes it with one rename, so a reader sees the whole dataset or nothing.
``publish_stage`` renames the finished stage to DST (an existing DST, with
overwrite, first moved aside as ``.<name>.old-<host>-<pid>`` and removed
after the swap), deferring SIGINT and SIGTERM over the two renames.
Overwrite replaces only an empty folder or a shardfeed dataset, never a
folder of other files. Stages named ``.<name>.convert-<host>-<pid>`` (before
stages were keyed by the arguments, see resume.py) and moved-aside datasets
whose owner no longer runs on this host are removed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import threading

from shardfeed.formats.errors import ShardError
from shardfeed.formats.index import INDEX_NAME, LOG_DIR

_OWNED = re.compile(r"^\.(?P<name>.+)\.(?P<kind>convert|old)-(?P<host>[A-Za-z0-9_.-]+)-(?P<pid>\d+)$")


def stage_path(dst: str, key: str) -> str:
    """The hidden stage beside ``dst`` for the run named by ``key`` (see tools/convert/resume.py)."""
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.convert-{key}")


def host_tag() -> str:
    # The host tells apart runs on machines sharing a folder, whose pids mean nothing here.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "localhost"


def _owned_name(dst: str, kind: str) -> str:
    return os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{kind}-{host_tag()}-{os.getpid()}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_stages(parent: str) -> list[str]:
    """Remove the staging (and moved-aside) folders of dead conversions in ``parent``.

    Only names this module makes, with this host's name and a pid that no
    longer runs, are removed; a reused pid keeps a stale stage (the safe way).
    """
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    host = host_tag()
    for name in names:
        m = _OWNED.match(name)
        if not m or m["host"] != host or int(m["pid"]) == os.getpid() or pid_alive(int(m["pid"])):
            continue
        path = os.path.join(parent, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)  # a symlinked DST moved aside: the link goes, not what it points to
            except FileNotFoundError:
                pass  # another run removed it first
        removed.append(path)
    return removed


class SignalsHeld:
    """Defers SIGINT and SIGTERM over a few renames that must not be cut in half.

    Python runs signal handlers in the main thread, so swapping in a handler
    that only records the signal is enough (masking would not be: the kernel
    may deliver to any other thread, and Python still runs the handler here).
    A signal caught meanwhile is dropped: it came too late to stop the
    conversion, which completes; or, for a step that only must not be cut
    in half, delivered again by ``replay()`` once the caller can clean up.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.old, self.caught = {}, []
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, lambda n, _f: self.caught.append(n)) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.old.items():
            signal.signal(s, handler)
        return False

    def replay(self) -> None:
        """Deliver the first signal caught while held to the handlers in place now."""
        if self.caught:
            signal.raise_signal(self.caught[0])


def publish_stage(stage: str, dst: str, overwrite: bool) -> None:
    old = None
    with SignalsHeld():  # between the two renames DST does not exist
        if os.path.isdir(dst) and not os.listdir(dst):
            os.rmdir(dst)
        elif os.path.lexists(dst):
            # checked up front too; DST may have changed meanwhile
            check_destination(dst, overwrite)
            old = _owned_name(dst, "old")
            os.replace(dst, old)
        os.replace(stage, dst)
    if old is not None:  # outside the held signals: removing a big old dataset takes a while
        shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.unlink(old)


def _is_dataset(path: str) -> bool:
    return os.path.isfile(os.path.join(path, INDEX_NAME)) or os.path.isdir(os.path.join(path, LOG_DIR))


def _check_replaceable(dst: str) -> None:
    """Only a dataset may be replaced, never a folder (or file) of someone's other data."""
    if not os.path.isdir(dst):
        raise ShardError(dst, "is a file, not a dataset folder; --overwrite replaces only a shardfeed dataset. "
                              "Move the file away or choose another DST")
    if not _is_dataset(dst):
        names = sorted(os.listdir(dst))
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise ShardError(dst, f"is not a shardfeed dataset (no {INDEX_NAME} or {LOG_DIR}/; it holds {shown}); "
                              "--overwrite replaces only an empty folder or a dataset. Empty it yourself "
                              "or choose another DST")


def check_destination(dst: str, overwrite: bool, src: str | None = None) -> None:
    if "://" in dst:
        raise ShardError(dst, "convert writes a local folder; upload the finished dataset afterwards")
    if src is not None and "://" not in src and os.path.exists(src):
        s, d = os.path.realpath(src), os.path.realpath(dst)
        if s == d or s.startswith(d.rstrip(os.sep) + os.sep):
            raise ShardError(dst, f"the source {src} lies inside the destination; write to another folder")
    if not os.path.lexists(dst) or (os.path.isdir(dst) and not os.listdir(dst)):
        return
    _check_replaceable(dst)  # first: suggesting --overwrite for someone's other files would be wrong
    if not overwrite:
        raise ShardError(dst, "is an existing dataset; pass --overwrite to replace it or choose a new folder")


