"""`shardfeed --help`, every command's --help and argument errors come before any heavy import.

Regression: `shardfeed --help`, `inspect` and `verify` took 6-9 s on a loaded
machine, 4-5 s of it importing torch: the parser imported every command's
module, the trainer's among them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import labelled_sample
from shardfeed.formats import ShardWriter

EXE = str(Path(sys.executable).with_name("shardfeed"))


def _fastest(argv: list[str], tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        subprocess.run(argv, capture_output=True, timeout=120)
        best = min(best, time.perf_counter() - t)
    return best


def test_help_costs_a_few_bare_interpreter_starts():
    """Timed against `python -c pass` in the same run, so a loaded machine slows both alike."""
    bare = _fastest([sys.executable, "-c", "pass"])
    helped = _fastest([EXE, "--help"])
    # measured 2-3x on the 2-core dev VM (0.03-0.05 s); importing torch made it 100x or more
    assert helped / bare < 15, f"shardfeed --help {helped:.3f}s, python -c pass {bare:.3f}s"


PARSE_EVERY_COMMAND = """
import json, sys
from shardfeed.tools.cli import COMMANDS, main
for name in set(COMMANDS) - {{"bench"}}:  # bench's parser lists its benchmarks, which run on torch
    for argv in ([name, "--help"], [name, "--no-such-option"]):
        try:
            main(argv)
        except SystemExit:
            pass
main(["inspect", {root!r}])
main(["verify", {root!r}])
print(json.dumps([m for m in ("torch",) if m in sys.modules]))
"""


def test_parsing_and_reading_commands_import_no_torch(tmp_path):
    root = str(tmp_path / "ds")
    with ShardWriter(root, max_shard_samples=10) as w:
        for i in range(20):
            w.write(labelled_sample(i))
    out = subprocess.run([sys.executable, "-c", PARSE_EVERY_COMMAND.format(root=root)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []
