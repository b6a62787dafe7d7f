"""The package's layout, measured from the source tree (AST, nothing imported).

``python tests/layout.py`` prints the import graph between the subpackages
(formats, shuffling, cache, loader, tools), the graph between the modules of
one subpackage (``--inside loader``), the edges that point the wrong way, and
the line count of every module; docs/architecture.md shows its output (checked by
tests/project/test_layout.py, which also holds the rules).
"""

from __future__ import annotations

import argparse
import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# floor of each subpackage: an import may point to its own floor or below, never up
FLOORS = {"formats": 0, "shuffling": 1, "cache": 1, "loader": 2, "tools": 3}
PACKAGES = tuple(FLOORS)


def modules(root: str = ROOT) -> dict[str, str]:
    """Dotted module name (``loader.follow``) -> file path, for every library module."""
    out = {}
    for pkg in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(root, pkg)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), root)[:-3].replace(os.sep, ".")
                    out[rel.removesuffix(".__init__")] = os.path.join(folder, f)
    return out


def imports_of(path: str, name: str) -> set[str]:
    """The shardfeed modules ``path`` imports (``shardfeed.`` stripped), anywhere in the file,
    function-level imports included: a lazy import is still a dependency."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
                names = ["shardfeed." + n for n in names]
            else:
                mod = node.module or ""
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n.startswith("shardfeed."):
                found.add(n[len("shardfeed."):])
    return found


def module_graph(root: str = ROOT) -> dict[str, set[str]]:
    """module -> modules it imports (only names that are modules of the tree)."""
    mods = modules(root)
    graph = {}
    for name, path in mods.items():
        graph[name] = {m for m in imports_of(path, name) if m in mods and m != name}
    return graph


def package_graph(root: str = ROOT) -> dict[tuple[str, str], list[str]]:
    """(from package, to package) -> the module edges behind it, for edges between packages."""
    edges = defaultdict(list)
    for a, targets in module_graph(root).items():
        for b in targets:
            pa, pb = a.split(".")[0], b.split(".")[0]
            if pa != pb:
                edges[(pa, pb)].append(f"{a} -> {b}")
    return {k: sorted(v) for k, v in sorted(edges.items())}


def upward_edges(root: str = ROOT) -> list[str]:
    """Module edges from a lower floor to a higher one (formats -> loader, cache -> tools, ...)."""
    return [e for (pa, pb), es in package_graph(root).items() if FLOORS[pb] > FLOORS[pa] for e in es]


def sideways_edges(root: str = ROOT) -> list[str]:
    """Edges between the two packages of floor 1 (shuffling <-> cache)."""
    return [e for (pa, pb), es in package_graph(root).items() if FLOORS[pb] == FLOORS[pa] for e in es]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def inside(package: str, root: str = ROOT) -> dict[str, set[str]]:
    """The module graph restricted to one package, names without the package prefix.
    A package's ``__init__`` only re-exports, so it is left out."""
    g = module_graph(root)
    p = package + "."
    return {a[len(p):]: {b[len(p):] for b in bs if b.startswith(p)}
            for a, bs in g.items() if a.startswith(p)}


def rooms(package: str, root: str = ROOT) -> dict[str, set[str]]:
    """The graph between the subfolders (rooms) of one package: room -> the rooms its modules import
    (a module directly in the package, its ``__init__`` only, is left out)."""
    g = inside(package, root)
    names = {a.split(".")[0] for a in g if "." in a}
    out: dict[str, set[str]] = {r: set() for r in names}
    for a, bs in g.items():
        if "." in a:
            out[a.split(".")[0]].update(b.split(".")[0] for b in bs)
    return {r: (targets & names) - {r} for r, targets in out.items()}


# what a probe is: hasattr(x, "name") / getattr(x, "name"...) on an object of the project (a seam asked about
# instead of declared); a module's platform features (os, fcntl) are not objects of the project
_PLATFORM_MODULES = {"os", "fcntl", "sys", "signal", "socket", "errno"}


def probes(package: str, root: str = ROOT) -> list[str]:
    """``module:line object.name`` of every hasattr/getattr with a literal name in ``package``."""
    out = []
    for name, path in modules(root).items():
        if not name.startswith(package + ".") and name != package:
            continue
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                target = ast.unparse(node.args[0])
                if target not in _PLATFORM_MODULES:
                    out.append(f"{name}:{node.lineno} {target}.{node.args[1].value}")
    return sorted(out)


def line_counts(root: str = ROOT) -> dict[str, int]:
    """Module path (``loader/follow.py``) -> its number of lines."""
    out = {}
    for path in modules(root).values():
        with open(path, encoding="utf-8") as f:
            out[os.path.relpath(path, root)] = sum(1 for _ in f)
    return out


def basename_collisions(root: str = ROOT) -> dict[str, list[str]]:
    """File name -> the module paths that share it, for names held by more than one module
    (``__init__.py`` and ``__main__.py`` are a package's by role, not by name, and left out)."""
    by_name = defaultdict(list)
    for path in modules(root).values():
        name = os.path.basename(path)
        if name not in ("__init__.py", "__main__.py"):
            by_name[name].append(os.path.relpath(path, root))
    return {name: sorted(paths) for name, paths in sorted(by_name.items()) if len(paths) > 1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inside", help="show the module graph inside this package instead")
    p.add_argument("--rooms", help="show the graph between this package's subfolders and its probes instead")
    p.add_argument("--lines", action="store_true", help="line count of every module, largest first")
    args = p.parse_args(argv)
    if args.lines:
        for path, n in sorted(line_counts().items(), key=lambda kv: -kv[1]):
            print(f"{n:5d}  {path}")
        return 0
    if args.rooms:
        for a, bs in sorted(rooms(args.rooms).items()):
            print(f"{a} -> {', '.join(sorted(bs)) or '(none)'}")
        for p in probes(args.rooms):
            print("probe:", p)
        return 0
    if args.inside:
        g = inside(args.inside)
        for a in sorted(g):
            if g[a]:
                print(f"{a} -> {', '.join(sorted(g[a]))}")
        for c in cycles(g):
            print("cycle:", " <-> ".join(c))
        return 0
    for (pa, pb), es in package_graph().items():
        flag = " (UP)" if FLOORS[pb] > FLOORS[pa] else " (sideways)" if FLOORS[pb] == FLOORS[pa] else ""
        print(f"{pa} -> {pb}: {len(es)} imports{flag}")
        if flag:
            for e in es:
                print(f"    {e}")
    pkg = {pa: {pb for (x, pb) in package_graph() if x == pa} for pa in PACKAGES}
    for c in cycles(pkg):
        print("package cycle:", " <-> ".join(c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
