"""The suite's bounds on hostile-input cases (conftest.py's ``hostile`` marker):
a hang is a failed test, a runaway allocation a MemoryError, and every module
of hostile cases carries the marker."""

from __future__ import annotations

import ast
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_LIMIT_AT_IMPORT = resource.getrlimit(resource.RLIMIT_AS)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the modules whose cases feed damaged, forged or absurd input to the library
HOSTILE_MODULES = [
    "formats/test_audit_records.py", "formats/test_commit_log_rules.py", "formats/test_formats_flips.py",
    "formats/test_formats_fuzz.py", "formats/test_formats_errors.py", "formats/test_hardening_crashes.py",
    "formats/test_hardening_files.py", "formats/test_hardening_integrity.py", "formats/test_hardening_sizes.py",
    "tools/test_cli_bounds.py", "cache/test_cache_hostile.py",
]


@pytest.mark.hostile
def test_a_runaway_allocation_in_a_hostile_case_is_a_memory_error():
    # 4 GiB never touched: without the cap the kernel maps it lazily and this passes
    with pytest.raises(MemoryError):
        np.empty(4 << 30, np.uint8)


def test_the_cap_is_lifted_after_the_case():
    """Runs after the capped case above: the limit is what it was when this module was imported."""
    assert resource.getrlimit(resource.RLIMIT_AS) == _LIMIT_AT_IMPORT


def test_a_hanging_hostile_case_fails_within_its_limit(tmp_path):
    """A hostile case that hangs ends as a failure in about its time limit (a pytest run of its own)."""
    (tmp_path / "test_hang.py").write_text(textwrap.dedent("""
        import time, pytest

        @pytest.mark.hostile(timeout=2)
        def test_hangs():
            time.sleep(60)
    """))
    conftest = os.path.join(TESTS, "conftest.py")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        "--confcutdir", str(tmp_path), "-c", os.devnull, "-p", "conftest", str(tmp_path / "test_hang.py")],
                       capture_output=True, text=True, timeout=50, cwd=str(tmp_path),
                       env=dict(os.environ, PYTHONPATH=os.path.dirname(conftest)))
    assert p.returncode == 1 and "Timeout (>2.0s)" in p.stdout and "1 failed" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("module", HOSTILE_MODULES)
def test_every_module_of_hostile_cases_is_bounded(module):
    tree = ast.parse(open(os.path.join(TESTS, module), encoding="utf-8").read())
    marks = [ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)]
    assert any("pytest.mark.hostile" in m for m in marks), f"{module}: pytestmark = pytest.mark.hostile is missing"
