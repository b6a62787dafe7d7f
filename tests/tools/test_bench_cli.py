"""`shardfeed bench` dispatcher: routes to each benchmark module, shares --out,
and reports a benchmark that is not built instead of crashing."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from shardfeed.tools.bench import command as bench


def _fake(name, calls, code=0):
    mod = types.ModuleType(name)

    def add_arguments(p):
        p.add_argument("--quick", action="store_true")
        p.add_argument("--level", type=int, default=7)

    def main(args):
        calls.append((name, args.out, args.quick, args.level))
        return code

    mod.add_arguments, mod.main = add_arguments, main
    return mod


@pytest.fixture
def fake_benches(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "fake_bench_read", _fake("fake_bench_read", calls))
    monkeypatch.setitem(sys.modules, "fake_bench_formats", _fake("fake_bench_formats", calls, code=3))
    monkeypatch.setattr(bench, "BENCHES", {
        "read": ("fake_bench_read", "read"),
        "shuffle": ("shardfeed.tools.no_such_bench_module", "shuffle"),
        "formats": ("fake_bench_formats", "formats"),
    })
    return calls


def _parse(argv):
    parser = argparse.ArgumentParser(prog="shardfeed bench")
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_routes_to_the_named_benchmark_with_its_own_options(fake_benches):
    assert bench.main(_parse(["read", "--level", "3", "--out", "/tmp/x"])) == 0
    assert fake_benches == [("fake_bench_read", "/tmp/x", False, 3)]


def test_out_defaults_to_bench_results(fake_benches):
    assert bench.main(_parse(["read"])) == 0
    assert fake_benches[0][1] == "bench-results"


def test_a_benchmark_not_built_is_reported_not_a_crash(fake_benches, capsys):
    assert bench.main(_parse(["shuffle", "--out", "o"])) == 0
    assert "not built" in capsys.readouterr().out
    assert fake_benches == []


def test_all_runs_each_with_defaults_and_shared_out(fake_benches, capsys):
    code = bench.main(_parse(["all", "--out", "res", "--quick"]))
    assert fake_benches == [("fake_bench_read", "res", True, 7), ("fake_bench_formats", "res", True, 7)]
    out = capsys.readouterr().out
    assert "shuffle not built" in out and "formats exit 3" in out
    assert code == 1  # a benchmark that failed fails the whole run


def test_a_broken_benchmark_module_is_not_mistaken_for_a_missing_one(monkeypatch):
    monkeypatch.setattr(bench, "BENCHES", {"read": ("fake_broken_bench", "read")})

    def fail_import(name, *a, **k):
        raise ModuleNotFoundError("No module named 'some_dependency'", name="some_dependency")

    monkeypatch.setattr(bench.importlib, "import_module", fail_import)
    with pytest.raises(ModuleNotFoundError, match="some_dependency"):
        bench.main(argparse.Namespace(bench="read", out="o"))


def test_real_modules_are_wired(capsys):
    """The real table: `bench read` parses its options under the dispatcher."""
    args = _parse(["read", "--quick", "--workers", "0", "--out", "somewhere"])
    assert args.bench == "read" and args.quick and args.workers == "0" and args.out == "somewhere"
