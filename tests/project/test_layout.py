"""The package layout holds: imports point down the floors, no cycle between
packages, no module past the size limit, and docs/architecture.md states the
graph as it is. Measured from the source by tests/layout.py."""

from __future__ import annotations

import pathlib
import re
import warnings

import layout

# A module holds one concept; size is a prompt to check that, not where code goes. Past WARN_LINES the
# test names the module in a warning; past MAX_LINES it fails.
WARN_LINES = 400
MAX_LINES = 600
# Known violators of MAX_LINES, to shrink as their owners split them. A module leaves this list when it
# is split; the test fails for a module that grows past its figure here or past MAX_LINES unlisted.
OVER_LIMIT = {
}


def test_no_import_points_up_a_floor():
    up = layout.upward_edges()
    assert not up, "imports that point up a floor (formats < shuffling, cache < loader < tools):\n" + "\n".join(up)


def test_shuffling_and_cache_stay_apart():
    side = layout.sideways_edges()
    assert not side, "shuffling and cache import each other:\n" + "\n".join(side)


# what shuffling may take from formats: the compile layer and the base of helpers that know no format
SHUFFLING_TAKES_FROM_FORMATS = ("formats.compiler", "formats.base")


def formats_imports_of_shuffling(root: str = layout.ROOT) -> list[str]:
    """shuffling's imports of formats outside the compile layer and the base (a format, an index, a reader)."""
    return [e for e in layout.package_graph(root).get(("shuffling", "formats"), [])
            if not any(e.split(" -> ")[1] == p or e.split(" -> ")[1].startswith(p + ".")
                       for p in SHUFFLING_TAKES_FROM_FORMATS)]


def test_shuffling_takes_only_the_compile_layer_and_the_base_from_formats():
    other = formats_imports_of_shuffling()
    assert not other, ("shuffling imports formats beyond formats/compiler/ and formats/base/ (move the helper into "
                       "formats/base/ if it knows no format):\n" + "\n".join(other))


# packages with no cycle among their own modules; the rest are named on docs/architecture.md
NO_CYCLE_INSIDE = layout.PACKAGES  # every package


def test_no_cycle_inside_packages():
    """A module imports nothing that imports it back, function-level imports included (a lazy import
    is still a dependency): each package is a stack of modules, not a knot."""
    found = {pkg: layout.cycles(layout.inside(pkg)) for pkg in NO_CYCLE_INSIDE}
    assert found == {pkg: [] for pkg in NO_CYCLE_INSIDE}, f"cycles inside packages: {found}"


def test_no_cycle_between_packages():
    graph = {}
    for a, b in layout.package_graph():
        graph.setdefault(a, set()).add(b)
    assert layout.cycles(graph) == []


def test_modules_stay_small():
    counts = layout.line_counts()
    too_big = {p: n for p, n in counts.items() if n > OVER_LIMIT.get(p, MAX_LINES)}
    assert not too_big, f"modules over {MAX_LINES} lines (or past their allowlisted size): {too_big}"
    stale = {p for p in OVER_LIMIT if counts.get(p, 0) <= MAX_LINES}
    assert not stale, f"no longer over {MAX_LINES} lines: drop {sorted(stale)} from OVER_LIMIT"
    large = {p: n for p, n in counts.items() if n > WARN_LINES}
    if large:
        warnings.warn(f"modules over {WARN_LINES} lines (does each still hold one concept?): "
                      + ", ".join(f"{p} {n}" for p, n in sorted(large.items(), key=lambda kv: -kv[1])), stacklevel=1)


def test_the_measurement_sees_real_edges(tmp_path):
    """The graph is not vacuous: a planted upward import, a cycle and a long module are found."""
    for pkg in layout.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "formats" / "a.py").write_text("def f():\n    from shardfeed.loader.b import g\n")
    (tmp_path / "loader" / "b.py").write_text("from shardfeed.formats import a\n" + "x = 1\n" * 401)
    (tmp_path / "loader" / "c.py").write_text("from . import b\n")
    assert layout.upward_edges(str(tmp_path)) == ["formats.a -> loader.b"]
    assert layout.cycles(layout.module_graph(str(tmp_path))) == [["formats.a", "loader.b"]]
    assert layout.inside("loader", str(tmp_path)) == {"b": set(), "c": {"b"}}
    assert layout.line_counts(str(tmp_path))["loader/b.py"] == 402
    for sub in ("compiler", "base"):
        (tmp_path / "formats" / sub).mkdir()
        (tmp_path / "formats" / sub / "__init__.py").write_text("")
        (tmp_path / "formats" / sub / "h.py").write_text("")
    (tmp_path / "shuffling" / "s.py").write_text(
        "from shardfeed.formats.compiler.h import x\nfrom shardfeed.formats.base import h\n"
        "from shardfeed.formats import a\n")
    assert formats_imports_of_shuffling(str(tmp_path)) == ["shuffling.s -> formats", "shuffling.s -> formats.a"]


# Two modules never share a file name, in one package or across packages: a name says what its module
# holds, and `audit.py` twice (a recorder and a CLI command) sends a reader, a traceback and a grep to
# the wrong file. No per-package exception, errors.py included (one errors.py: formats/, ShardError).
EXPECTED_COLLISIONS: dict[str, list[str]] = {}
# Modules whose path is the point: an old import path kept working by re-exporting the module that
# moved (a rename would end the path it keeps). Each holds no code of its own (checked below).
ALIASES = {
    "tools/convert/ray_data.py",  # shardfeed.tools.convert.ray_data -> shardfeed.formats.ray_data
}


def _collisions(root: str = layout.ROOT) -> dict[str, list[str]]:
    found = {}
    for name, paths in layout.basename_collisions(root).items():
        paths = [p for p in paths if p not in ALIASES]
        if len(paths) > 1:
            found[name] = paths
    return found


def test_no_two_modules_share_a_file_name():
    found = _collisions()
    new = {name: paths for name, paths in found.items() if EXPECTED_COLLISIONS.get(name) != paths}
    assert not new, ("modules that share a file name (rename one for what it holds): "
                     + "; ".join(f"{name}: {', '.join(paths)}" for name, paths in new.items()))
    stale = sorted(set(EXPECTED_COLLISIONS) - set(found))
    assert not stale, f"no longer shared: drop {stale} from EXPECTED_COLLISIONS"


def test_an_alias_module_only_re_exports():
    """An alias keeps a path, not code: nothing defined in it (a def or class would be a module
    of its own under a taken name)."""
    import ast

    for path in sorted(ALIASES):
        tree = ast.parse((pathlib.Path(layout.ROOT) / path).read_text())
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert not defined, f"{path} is listed as an alias but defines {defined}"


def test_the_name_check_sees_a_shared_name(tmp_path):
    """A planted pair is found, across packages and inside one; __init__.py and __main__.py are not."""
    for pkg in layout.PACKAGES:
        (tmp_path / pkg / "sub").mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "sub" / "__init__.py").write_text("")
    (tmp_path / "tools" / "__main__.py").write_text("")
    (tmp_path / "tools" / "sub" / "__main__.py").write_text("")
    (tmp_path / "loader" / "plan.py").write_text("")
    (tmp_path / "tools" / "sub" / "plan.py").write_text("")
    (tmp_path / "cache" / "store.py").write_text("")
    (tmp_path / "cache" / "sub" / "store.py").write_text("")
    (tmp_path / "cache" / "alone.py").write_text("")
    assert _collisions(str(tmp_path)) == {"plan.py": ["loader/plan.py", "tools/sub/plan.py"],
                                          "store.py": ["cache/store.py", "cache/sub/store.py"]}


def test_the_architecture_page_shows_the_loaders_graph_as_it_is():
    """docs/architecture.md draws the loader's module graph: every edge it shows exists, and every
    module with imports inside the package is drawn with all of them (a doc that lags the code
    misleads the reader it was written for)."""
    import pathlib
    import re

    text = (pathlib.Path(layout.ROOT) / "docs" / "architecture.md").read_text()
    block = text.split("The loader's modules (`python tests/layout.py --inside loader`)", 1)[1]
    block = block.split("```text", 1)[1].split("```", 1)[0]
    drawn = {}
    for line in block.splitlines():
        for part in re.split(r"\s{3,}(?=[\w.]+\s+->)", line.strip()):
            if "->" in part:
                name, targets = (x.strip() for x in part.split("->", 1))
                drawn[name] = {t.strip() for t in targets.split(",") if t.strip()}
    real = {name: deps for name, deps in layout.inside("loader").items() if deps}
    assert drawn == real


# --- docs/architecture.md's "The structure as measured" section, checked against the code

def _page() -> str:
    return (pathlib.Path(layout.ROOT) / "docs" / "architecture.md").read_text()


def _block_after(text: str, lead: str) -> str:
    """The body of the first ```text block after the paragraph that starts with ``lead``."""
    assert lead in text, f"docs/architecture.md has no paragraph starting {lead!r}"
    return text.split(lead, 1)[1].split("```text", 1)[1].split("```", 1)[0]


def package_edges_on_page(text: str) -> dict[tuple[str, str], int]:
    block = _block_after(text, "Between packages, imports per edge")
    return {(a, b): int(n) for a, b, n in re.findall(r"(\w+) -> (\w+)\s+(\d+)", block)}


def cycles_on_page(text: str) -> set[tuple[str, tuple[str, ...]]]:
    block = _block_after(text, "Cycles inside packages")
    out = set()
    for line in block.strip().splitlines():
        if line.strip() == "(none)":
            continue
        pkg, _, members = line.partition(":")
        out.add((pkg.strip(), tuple(sorted(m.strip() for m in members.split("<->")))))
    return out


def over_warn_on_page(text: str) -> set[str]:
    m = re.search(rf"Modules over {WARN_LINES} lines: (.*?)\.(?:\s|$)", text, re.S)
    assert m, f"docs/architecture.md does not say which modules are over {WARN_LINES} lines"
    named = m.group(1).strip()
    return set() if named == "none" else set(re.findall(r"`([\w/.]+\.py)`", named))


def largest_on_page(text: str) -> dict[str, int]:
    block = _block_after(text, f"Modules over {WARN_LINES} lines:")
    return {path: int(n) for n, path in re.findall(r"(\d+)\s+([\w/.]+\.py)", block)}


def test_the_architecture_page_states_the_edges_between_packages():
    real = {k: len(v) for k, v in layout.package_graph().items()}
    drawn = package_edges_on_page(_page())
    assert drawn == real, ("docs/architecture.md's imports per edge differ from the code "
                           f"(`python tests/layout.py` prints them): page {drawn}, code {real}")


def test_the_architecture_page_states_the_cycles_inside_packages():
    real = {(pkg, tuple(c)) for pkg in layout.PACKAGES for c in layout.cycles(layout.inside(pkg))}
    drawn = cycles_on_page(_page())
    assert drawn == real, (f"cycles inside packages: the page shows {sorted(drawn)}, the code has {sorted(real)} "
                           "(`python tests/layout.py --inside PACKAGE`)")


def test_the_architecture_page_states_the_large_modules():
    """The modules over WARN_LINES are named exactly; the largest are the largest (each listed size within
    10% of the module's own, and no module left out is 10% larger than the smallest one listed)."""
    text = _page()
    counts = layout.line_counts()
    assert over_warn_on_page(text) == {p for p, n in counts.items() if n > WARN_LINES}
    listed = largest_on_page(text)
    assert listed, "docs/architecture.md lists no largest modules"
    for path, n in listed.items():
        assert path in counts, f"docs/architecture.md names {path}, which is not a module"
        assert abs(counts[path] - n) <= 0.1 * n, f"{path}: the page says {n} lines, it has {counts[path]}"
    floor = min(listed.values())
    bigger = {p: n for p, n in counts.items() if p not in listed and n > 1.1 * floor}
    assert not bigger, f"larger than the modules docs/architecture.md lists as the largest: {bigger}"


def test_the_page_checks_see_a_wrong_page():
    """The parsers read what the page says: a changed count, a dropped cycle and a missing large module
    are seen as differences, not read as matching."""
    text = _page()
    edges = package_edges_on_page(text)
    assert edges[("loader", "formats")] == len(layout.package_graph()[("loader", "formats")])
    wrong = re.sub(r"(loader -> formats\s+)(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + 1), text, count=1)
    assert package_edges_on_page(wrong)[("loader", "formats")] == edges[("loader", "formats")] + 1
    block = "Cycles inside packages (`python tests/layout.py --inside PACKAGE`):\n\n```text\n{}\n```\n"
    assert cycles_on_page(block.format("(none)")) == set()
    assert cycles_on_page(block.format("cache: a <-> b")) == {("cache", ("a", "b"))}  # a cycle drawn is read
    assert over_warn_on_page("Modules over 400 lines: `a/b.py` 401, `c/d.py` 450. The") == {"a/b.py", "c/d.py"}
    assert over_warn_on_page("Modules over 400 lines: none. The") == set()


# --- the cache's rooms and its probes (docs/architecture.md, "The cache's rooms")

# hasattr/getattr on objects that are no seam of the project: the status of a third-party client's error
NOT_A_SEAM = {"cache.fetching.fetch err.code", "cache.fetching.fetch err.status"}


def rooms_on_page(text: str) -> dict[str, set[str]]:
    block = _block_after(text, "The cache's rooms (`python tests/layout.py --rooms cache`)")
    out = {}
    for line in block.strip().splitlines():
        name, _, targets = (x.strip() for x in line.partition("->"))
        out[name] = set() if targets == "(none)" else {t.strip() for t in targets.split(",")}
    return out


def test_the_architecture_page_states_the_cache_rooms():
    assert rooms_on_page(_page()) == layout.rooms("cache")


def test_no_probe_of_a_seam_is_left_in_the_cache():
    """Every member a caller of the cache uses is declared (a contract with defaults), never asked
    about with hasattr/getattr; the page says how many are left."""
    left = [p for p in layout.probes("cache") if re.sub(r":\d+ ", " ", p) not in NOT_A_SEAM]
    assert left == [], f"probes of a seam in cache/ (declare the member instead): {left}"
    m = re.search(r"Probes of a seam left in cache/: (\d+)", _page())
    assert m and int(m.group(1)) == len(left)


def test_the_rooms_and_probes_are_measured(tmp_path):
    """A planted room edge and a planted probe are seen."""
    for pkg in layout.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for room in ("a", "b"):
        (tmp_path / "cache" / room).mkdir()
        (tmp_path / "cache" / room / "__init__.py").write_text("")
    (tmp_path / "cache" / "a" / "x.py").write_text("from shardfeed.cache.b import y\n")
    (tmp_path / "cache" / "b" / "y.py").write_text("import os\n\ndef f(s):\n    return hasattr(s, 'get_small') "
                                                   "or hasattr(os, 'posix_fallocate')\n")
    assert layout.rooms("cache", str(tmp_path)) == {"a": {"b"}, "b": set()}
    assert layout.probes("cache", str(tmp_path)) == ["cache.b.y:4 s.get_small"]
    assert rooms_on_page("The cache's rooms (`python tests/layout.py --rooms cache`):\n\n```text\n"
                         "a -> (none)\nb -> a, c\n```\n") == {"a": set(), "b": {"a", "c"}}
