"""Count the package's long calls, long signatures and a wing's imports: ``python
experiments/house_counts.py [--wing stability.report]``.

Issue 50's measures of how readable the code is: calls that pass ``--calls`` (7) or more
positional arguments, by callee, and functions that take ``--params`` (8) or more parameters
(``self`` and ``cls`` not counted), read from ``stability/`` (or the folders given) with
``ast`` only. ``--wing`` adds one package's modules, the imports between them (those under
``TYPE_CHECKING`` too), its floors (the longest chain of imports, a circle counted as one
floor) and its circles, from grimp's graph of the installed ``stability``.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "?"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")])


def count(folders: list[Path], calls: int, params: int) -> tuple[Counter[str], list[str]]:
    """``(long calls by callee, "path:line name (n)" of each long signature)``."""
    by_callee: Counter[str] = Counter()
    long_defs: list[str] = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and len(node.args) >= calls:
                    by_callee[_callee(node)] += 1
                elif (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                      and _params(node) >= params):
                    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    long_defs.append(f"{rel}:{node.lineno} {node.name} ({_params(node)})")
    return by_callee, long_defs


def wing(package: str) -> tuple[int, int, int, list[list[str]]]:
    """``(modules, imports between them, floors, circles)`` of one package of ``stability``."""
    import grimp  # the dev extra's (import-linter's); only this measure needs it

    graph = grimp.build_graph("stability", exclude_type_checking_imports=False, cache_dir=None)
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(t for t in graph.find_modules_directly_imported_by(m)
                       if t in mods and t != m) for m in mods}
    reach = {m: {m, *graph.find_downstream_modules(m)} & set(mods) for m in mods}
    circle_of = {m: frozenset(t for t in reach[m] if m in reach[t]) for m in mods}
    circles = sorted({c for c in circle_of.values() if len(c) > 1}, key=sorted)
    floors: dict[frozenset[str], int] = {}

    def floor(c: frozenset[str]) -> int:  # 1 + the highest floor it imports from
        if c not in floors:
            below = {circle_of[t] for m in c for t in edges[m]} - {c}
            floors[c] = 1 + max((floor(b) for b in below), default=0)
        return floors[c]

    top = max(floor(c) for c in set(circle_of.values()))
    return len(mods), sum(map(len, edges.values())), top, [sorted(c) for c in circles]


def main() -> None:
    """Print both counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / "stability"])
    ap.add_argument("--calls", type=int, default=7, help="positional arguments (default 7)")
    ap.add_argument("--params", type=int, default=8, help="parameters (default 8)")
    ap.add_argument("--wing", help="a package of stability whose imports to count, e.g. "
                    "stability.report")
    ns = ap.parse_args()
    by_callee, long_defs = count(ns.folders, ns.calls, ns.params)
    print(f"calls with {ns.calls}+ positional arguments: {sum(by_callee.values())}")
    for name, n in by_callee.most_common():
        print(f"  {n:3d} {name}")
    print(f"functions with {ns.params}+ parameters: {len(long_defs)}")
    for line in long_defs:
        print(f"  {line}")
    if ns.wing:
        modules, imports, floors, circles = wing(ns.wing)
        print(f"{ns.wing}: {modules} modules, {imports} imports between them, {floors} floors, "
              f"{len(circles)} circle(s)")
        for c in circles:
            print(f"  {' -> '.join(c)}")


if __name__ == "__main__":
    main()
