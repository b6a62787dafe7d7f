"""What `make demo` and `make test` install, read from `make -n` (a dry run: nothing is built).

Regressions: the demo's set-up installed the test extras (ray among them),
which the demo never uses, and pip ran with -q: minutes of silence on a
loaded machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this system")


def _pip_lines(target: str, tmp_path) -> list[str]:
    out = subprocess.run(["make", "-n", "-C", ROOT, f"VENV={tmp_path / 'venv'}", target], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "pip install" in line]


def test_the_demo_installs_no_test_extras(tmp_path):
    lines = _pip_lines("demo", tmp_path)
    assert lines and not any("[test" in line for line in lines), lines
    assert any(".[bench]" in line for line in lines), lines  # the trainer's plot


def test_make_test_installs_the_test_extras(tmp_path):
    assert any(".[test]" in line for line in _pip_lines("test", tmp_path))


@pytest.mark.parametrize("target", ["demo", "test"])
def test_pip_shows_what_it_installs(tmp_path, target):
    lines = _pip_lines(target, tmp_path)
    assert not any(" -q" in line or "--quiet" in line for line in lines), lines
