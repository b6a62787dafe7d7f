"""The suite's two tiers: every entry of tests/tiers.py names a test that exists, conftest.py marks
what it names, `make test` leaves the second tier out, `make test-slow` runs it and .ci/run runs both."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import tiers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("entry", tiers.TIER2)
def test_each_second_tier_entry_names_a_test(entry):
    path, _, name = entry.partition("::")
    full = os.path.join(ROOT, path)
    assert os.path.isfile(full), f"tests/tiers.py: {path} does not exist (renamed or moved? update TIER2)"
    source = open(full, encoding="utf-8").read()
    if name:
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), \
            f"tests/tiers.py: {path} has no test {name} (renamed? update TIER2)"
    else:
        assert re.search(r"^def test_", source, re.M), f"tests/tiers.py: {path} holds no test"


def test_an_entry_covers_its_parametrizations_and_a_file_entry_its_tests():
    file_entry = next(e for e in tiers.TIER2 if "::" not in e)
    test_entry = next(e for e in tiers.TIER2 if "::" in e)
    assert tiers.in_tier2(f"{file_entry}::test_anything[3]")
    assert tiers.in_tier2(f"{test_entry}[a-b]")
    assert not tiers.in_tier2(f"{test_entry}_and_more")
    assert not tiers.in_tier2("tests/loader/test_nothing_here.py::test_x")


def test_conftest_marks_what_tiers_names_and_nothing_else():
    second, first = "tests/tools/test_bench_startup.py", "tests/project/test_tiers.py"
    assert second in tiers.TIER2 and not tiers.in_tier2(f"{first}::test_x")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                          "-m", "tier2", second, first], cwd=ROOT, capture_output=True, text=True, timeout=120)
    picked = {line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line}
    assert picked == {second}, out.stdout + out.stderr


def test_make_test_leaves_the_second_tier_to_make_test_slow_and_ci_runs_both():
    make = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    recipe = {m.group(1): m.group(2) for m in re.finditer(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)+)", make, re.M)}
    assert '-m "not tier2"' in recipe["test"], "make test must deselect the second tier"
    assert "-m tier2" in recipe["test-slow"], "make test-slow must run the second tier"
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    assert "make test" in ci and "make test-slow" in ci, ".ci/run must run both tiers"
