"""The house's figures: its import graph and how readable its code is, one report.

``python experiments/house.py [folders] [--wing stability.report] [--calls 7] [--params 8]
[--records 4]`` prints what a review of the layout asks about, measured the same way before and
after a refactor (the closing notes quote it):

- lines and modules of ``stability/``, and its rooms (the first-level packages);
- arrows (imports between its modules) and arrows back up: direct imports from a module to a
  layer above it in pyproject's ``[tool.importlinter]`` layers (``tests/test_layers.py``
  asserts there are none);
- circles: strongly connected components of two or more modules, once with every import
  (``TYPE_CHECKING`` ones included: a type-only circle is still a knot to read) and once
  without them (the ones that could fail at import time);
- a wing (``--wing``, the report's by default): its files, lines, the arrows between its
  modules and its floors (the longest chain of imports inside it, a circle counted as one
  floor), without the type-only imports and then with them, and its circles;
- calls that pass ``--calls`` or more positional arguments, by callee; functions that take
  ``--params`` or more parameters (``self`` and ``cls`` not counted); records (dataclasses,
  named tuples) built with ``--records`` or more positional arguments in more than one place.
  These three read ``stability/`` (or the folders given) with ``ast`` only.

The graph comes from grimp (the dev extra's, import-linter's) over the installed ``stability``.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "stability"

Edges = dict[str, set[str]]


def _edges(type_only: bool, within: str = PACKAGE) -> Edges:
    """Imports between the modules of ``within`` (itself and below), ``TYPE_CHECKING`` ones
    too when ``type_only``; a module's import of itself is not an arrow."""
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=not type_only,
                              cache_dir=None)
    mods = {m for m in graph.modules if m == within or m.startswith(within + ".")}
    return {m: {t for t in graph.find_modules_directly_imported_by(m) if t in mods and t != m}
            for m in mods}


def components(edges: Edges) -> list[list[str]]:
    """Strongly connected components, each sorted, singletons included (Tarjan, recursive: the
    graph is a few hundred modules deep at most)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def circles(edges: Edges) -> list[list[str]]:
    """The components of two or more modules."""
    return [c for c in components(edges) if len(c) > 1]


def floors(edges: Edges) -> int:
    """The longest import chain, in modules (1: nothing imports anything); a circle is one
    floor."""
    comp_of = {m: i for i, c in enumerate(components(edges)) for m in c}
    below: dict[int, set[int]] = defaultdict(set)
    for m, targets in edges.items():
        below[comp_of[m]] |= {comp_of[t] for t in targets} - {comp_of[m]}
    height: dict[int, int] = {}

    def floor(c: int) -> int:  # 1 + the highest floor it imports from
        if c not in height:
            height[c] = 1 + max((floor(b) for b in below[c]), default=0)
        return height[c]

    return max((floor(c) for c in set(comp_of.values())), default=0)


def _layer_rows() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return [[name.strip() for name in row.split("|")] for row in layers]


def arrows_up(edges: Edges) -> int:
    """Imports from a module to one in a higher layer (or a sibling of its row)."""
    rows = _layer_rows()

    def where(m: str) -> tuple[int, str] | None:
        for i, row in enumerate(rows):
            for name in row:
                if m == name or m.startswith(name + "."):
                    return i, name
        return None

    count = 0
    for src, targets in edges.items():
        a = where(src)
        for t in targets:
            b = where(t)
            if a and b and (b[0] < a[0] or (b[0] == a[0] and b[1] != a[1])):
                count += 1
    return count


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "?"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")])


def _record(node: ast.ClassDef) -> bool:
    """A dataclass or a named tuple."""
    return (any("dataclass" in ast.unparse(d) for d in node.decorator_list)
            or any("NamedTuple" in ast.unparse(b) for b in node.bases))


def _trees(folders: list[Path]) -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path)))
            for folder in folders for path in sorted(folder.rglob("*.py"))]


def _where(path: Path, node: ast.AST) -> str:
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{rel}:{getattr(node, 'lineno', 0)}"


def count(folders: list[Path], calls: int, params: int
          ) -> tuple[Counter[str], list[str]]:
    """``(long calls by callee, "path:line name (n)" of each long signature)``."""
    by_callee: Counter[str] = Counter()
    long_defs: list[str] = []
    for path, tree in _trees(folders):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) >= calls:
                by_callee[_callee(node)] += 1
            elif (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                  and _params(node) >= params):
                long_defs.append(f"{_where(path, node)} {node.name} ({_params(node)})")
    return by_callee, long_defs


def positional_records(folders: list[Path], least: int) -> dict[str, list[str]]:
    """Records built with ``least`` or more positional arguments in more than one place:
    ``{record: ["path:line", ...]}``."""
    trees = _trees(folders)
    records = {n.name for _, t in trees for n in ast.walk(t)
               if isinstance(n, ast.ClassDef) and _record(n)}
    built: dict[str, list[str]] = defaultdict(list)
    for path, tree in trees:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and _callee(node) in records
                    and len(node.args) >= least):
                built[_callee(node)].append(_where(path, node))
    def order(at: str) -> tuple[str, int]:
        path, line = at.rsplit(":", 1)
        return path, int(line)

    return {name: sorted(at, key=order) for name, at in sorted(built.items()) if len(at) > 1}


def main() -> None:
    """Print the figures, one per line (lists indented below their count)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / PACKAGE],
                    help="what the call, signature and record counts read (default stability/)")
    ap.add_argument("--wing", default=f"{PACKAGE}.report",
                    help="a package of stability whose inner imports to count "
                         "(default stability.report)")
    ap.add_argument("--calls", type=int, default=7, help="positional arguments (default 7)")
    ap.add_argument("--params", type=int, default=8, help="parameters (default 8)")
    ap.add_argument("--records", type=int, default=4,
                    help="positional arguments of a record built in two places (default 4)")
    ns = ap.parse_args()

    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    rooms = sorted({f.relative_to(ROOT / PACKAGE).parts[0] for f in files
                    if len(f.relative_to(ROOT / PACKAGE).parts) > 1})
    every, runtime = _edges(True), _edges(False)
    print(f"lines: {lines} in {len(files)} modules; rooms: {len(rooms)} ({', '.join(rooms)})")
    print(f"arrows: {sum(map(len, runtime.values()))}; back up: {arrows_up(runtime)}")
    all_circles, runtime_circles = circles(every), circles(runtime)
    print(f"circles: {len(all_circles)} counting type-only imports, "
          f"{len(runtime_circles)} without them")
    for c in all_circles:
        print("  circle: " + " -> ".join(m.removeprefix(PACKAGE + ".") for m in c))

    wing_dir = ROOT.joinpath(*ns.wing.split("."))
    wing_files = sorted(wing_dir.rglob("*.py")) if wing_dir.is_dir() \
        else [wing_dir.with_suffix(".py")]
    wing_lines = sum(len(f.read_text().splitlines()) for f in wing_files)
    name = ns.wing.removeprefix(PACKAGE + ".")
    wing, wing_every = _edges(False, ns.wing), _edges(True, ns.wing)
    print(f"{name} wing: {len(wing_files)} files, {wing_lines} lines "
          f"({100 * wing_lines / lines:.0f}%), {sum(map(len, wing.values()))} arrows, "
          f"{floors(wing)} inner floors")
    wing_circles = circles(wing_every)
    print(f"{name} wing counting type-only imports: {len(wing_every)} modules, "
          f"{sum(map(len, wing_every.values()))} arrows, {floors(wing_every)} floors, "
          f"{len(wing_circles)} circle(s)")
    for c in wing_circles:
        print(f"  {' -> '.join(c)}")

    by_callee, long_defs = count(ns.folders, ns.calls, ns.params)
    print(f"calls with {ns.calls}+ positional arguments: {sum(by_callee.values())}")
    for callee, n in by_callee.most_common():
        print(f"  {n:3d} {callee}")
    print(f"functions with {ns.params}+ parameters: {len(long_defs)}")
    for line in long_defs:
        print(f"  {line}")
    built = positional_records(ns.folders, ns.records)
    print(f"records built with {ns.records}+ positional arguments in two or more places: "
          f"{len(built)}")
    for record, at in built.items():
        print(f"  {record} ({len(at)}): {', '.join(at)}")


if __name__ == "__main__":
    main()
