"""A conversion's staging folder, keyed by its arguments, and the record of finished shards.

A conversion stages into ``.<DST name>.convert-<key>`` beside DST, where the
key is a hash of everything that decides the output (source, its size,
format, shard limits, processes, part, shuffle seed). So a run killed
outright (SIGKILL, power loss, an OOM kill) leaves a stage that the next run
with the same arguments finds and continues; a run with other arguments
removes it (its shards would not fit) and starts afresh.

While a run writes, it holds an exclusive ``flock`` on ``<stage>/.lock``: the
kernel drops it when the process dies however it dies, so a held lock means
a live run (a second run with the same arguments is refused), a free one a
dead run whose work can be taken over. flock is per host: two machines
sharing the folder over NFS must not convert into the same DST at once.

Each part of the conversion keeps ``part-NNN/done.jsonl``: one line per
finished shard, appended (and fsynced) after the shard and its sidecar were
renamed into ``part-NNN/`` under their final part-local names; the line
``{"done": true}`` closes the part. A shard renamed but not yet recorded is
written again, to the same bytes, on resume; a recorded one never is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil

from shardfeed.formats import ShardError, ShardInfo

MANIFEST = "done.jsonl"
LOCK = ".lock"


def args_key(parts: dict) -> str:
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


_KEYED = re.compile(r"^\.(?P<name>.+)\.convert-(?P<key>[0-9a-f]{16})$")


class StageLock:
    """The exclusive lock of one stage; ``release()`` is safe to call twice."""

    def __init__(self, stage: str):
        os.makedirs(stage, exist_ok=True)
        self.path = os.path.join(stage, LOCK)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            owner = _read_owner(self.path)
            raise ShardError(stage, f"another conversion with the same arguments is writing here ({owner}); "
                                    "wait for it to finish, or stop it first") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()}\n".encode())

    def release(self, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove:  # before unlocking: a waiting run must not take a lock file about to vanish
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(self.fd)
        self.fd = None


def _read_owner(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip() or "pid unknown"
    except OSError:
        return "pid unknown"


def _locked(stage: str) -> bool:
    try:
        fd = os.open(os.path.join(stage, LOCK), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_superseded(dst: str, key: str) -> list[str]:
    """Stages of dead runs into DST with other arguments: they cannot be resumed by this run."""
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for entry in names:
        m = _KEYED.match(entry)
        if not m or m["name"] != name or m["key"] == key:
            continue
        path = os.path.join(parent, entry)
        if os.path.isdir(path) and not os.path.islink(path) and not _locked(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def read_manifest(part_dir: str) -> tuple[list[ShardInfo], list[str], bool]:
    """(finished shards in order, fields seen up to the last of them, part complete)."""
    shards, fields, done = [], [], False
    path = os.path.join(part_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return shards, fields, done
    kept = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            break  # a line cut by the kill: everything after it is redone
        if rec.get("done"):
            done = True
            kept.append(line)
            continue
        info = ShardInfo(rec["name"], rec["format"], int(rec["samples"]), int(rec["bytes"]), rec["hash"])
        if not os.path.exists(os.path.join(part_dir, info.name)):
            break  # removed by hand: redo from here
        shards.append(info)
        fields = list(rec["fields"])
        kept.append(line)
    if len(kept) != sum(1 for line in lines if line.strip()):
        # drop the cut line, or every later record would be appended behind it and never read
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return shards, fields, done


def append_manifest(part_dir: str, record: dict) -> None:
    with open(os.path.join(part_dir, MANIFEST), "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
