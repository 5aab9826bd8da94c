"""Count the package's long calls and long signatures: ``python experiments/house_counts.py``.

Two of issue 50's measures of how readable the code is: calls that pass ``--calls`` (7) or more
positional arguments, by callee, and functions that take ``--params`` (8) or more parameters
(``self`` and ``cls`` not counted). Reads ``stability/`` (or the folders given) with ``ast``
only; imports nothing from them.
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


def main() -> None:
    """Print both counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[ROOT / "stability"])
    ap.add_argument("--calls", type=int, default=7, help="positional arguments (default 7)")
    ap.add_argument("--params", type=int, default=8, help="parameters (default 8)")
    ns = ap.parse_args()
    by_callee, long_defs = count(ns.folders, ns.calls, ns.params)
    print(f"calls with {ns.calls}+ positional arguments: {sum(by_callee.values())}")
    for name, n in by_callee.most_common():
        print(f"  {n:3d} {name}")
    print(f"functions with {ns.params}+ parameters: {len(long_defs)}")
    for line in long_defs:
        print(f"  {line}")


if __name__ == "__main__":
    main()
