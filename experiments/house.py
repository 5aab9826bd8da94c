"""The house's figures from its import graph: lines, rooms, circles, the report wing's floors.

``python experiments/house.py`` prints what a review of the layout asks about, measured the same
way before and after a refactor (the closing notes quote it):

- lines and modules of ``stability/``, and its rooms (the first-level packages);
- arrows back up: direct imports from a module to a layer above it in pyproject's
  ``[tool.importlinter]`` layers (``tests/test_layers.py`` asserts there are none);
- circles: strongly connected components of two or more modules, once with every import
  (``TYPE_CHECKING`` ones included: a type-only circle is still a knot to read) and once
  without them (the ones that could fail at import time);
- the report wing: its modules, the arrows between them, and its inner floors (the longest
  chain of imports inside ``stability.report``, in modules).
"""

from __future__ import annotations

import functools
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "stability"
WING = "stability.report"


def _graph(type_only: bool) -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=not type_only,
                             cache_dir=None)


def _edges(graph: grimp.ImportGraph, within: str = PACKAGE) -> dict[str, set[str]]:
    mods = {m for m in graph.modules if m == within or m.startswith(within + ".")}
    return {m: {t for t in graph.find_modules_directly_imported_by(m) if t in mods}
            for m in mods}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, recursive: the graph is
    a few hundred modules deep at most)."""
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
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def floors(edges: dict[str, set[str]]) -> int:
    """The longest import chain, in modules (1: nothing imports anything); a circle's members
    count once."""

    @functools.cache
    def depth(v: str, seen: frozenset[str] = frozenset()) -> int:
        return 1 + max((depth(w, seen | {v}) for w in edges[v] if w not in seen | {v}),
                       default=0)

    return max((depth(v) for v in edges), default=0)


def _layer_rows() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return [[name.strip() for name in row.split("|")] for row in layers]


def arrows_up(edges: dict[str, set[str]]) -> int:
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


def main() -> None:
    """Print the figures, one per line."""
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    rooms = sorted({f.relative_to(ROOT / PACKAGE).parts[0] for f in files
                    if len(f.relative_to(ROOT / PACKAGE).parts) > 1})
    every, runtime = _edges(_graph(True)), _edges(_graph(False))
    wing = _edges(_graph(False), WING)
    wing_files = [f for f in files if "report" in f.relative_to(ROOT / PACKAGE).parts[:1]]
    wing_lines = sum(len(f.read_text().splitlines()) for f in wing_files)
    print(f"lines: {lines} in {len(files)} modules; rooms: {len(rooms)} ({', '.join(rooms)})")
    print(f"arrows: {sum(map(len, runtime.values()))}; back up: {arrows_up(runtime)}")
    all_circles, runtime_circles = circles(every), circles(runtime)
    print(f"circles: {len(all_circles)} counting type-only imports, "
          f"{len(runtime_circles)} without them")
    for c in all_circles:
        print("  circle: " + " -> ".join(m.removeprefix(PACKAGE + ".") for m in c))
    print(f"report wing: {len(wing_files)} files, {wing_lines} lines "
          f"({100 * wing_lines / lines:.0f}%), {sum(map(len, wing.values()))} arrows, "
          f"{floors(wing)} inner floors")


if __name__ == "__main__":
    main()
