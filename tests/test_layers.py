"""The package's layers, read from pyproject's ``[tool.importlinter]``: no upward import, no cycle.

The contract lives in one place (pyproject.toml), which ``make lint`` checks with
``lint-imports``; these tests read the same contract and check it on grimp's import graph, so a
plain ``pytest`` run fails on an upward arrow or a cycle too. Imports inside functions count: a
cycle hidden that way is still a cycle.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(kind: str) -> dict:
    return next(c for c in CONTRACTS["contracts"] if c["type"] == kind)


def _forbidden_hits(graph: grimp.ImportGraph, contract: dict) -> list[tuple[str, str]]:
    """Direct imports that a ``forbidden`` contract rules out."""
    return [(m, t) for source in contract["source_modules"]
            for m in graph.find_descendants(source) | {source}
            for t in graph.find_modules_directly_imported_by(m)
            if any(t == f or t.startswith(f + ".") for f in contract["forbidden_modules"])]


def _layers() -> list[set[str]]:
    return [{m.strip() for m in row.split("|")} for row in _contract("layers")["layers"]]


def _stage_layers() -> list[set[str]]:
    """The report's stages, top to bottom: the ``layers`` contract with ``containers``."""
    (stages,) = [c for c in CONTRACTS["contracts"] if c["type"] == "layers" and "containers" in c]
    return [{f"{box}.{m.strip()}" for box in stages["containers"] for m in row.split("|")}
            for row in stages["layers"]]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("stability", include_external_packages=True,
                             exclude_type_checking_imports=True, cache_dir=None)


def _upward(graph: grimp.ImportGraph, layers: list[set[str]] | None = None
            ) -> list[tuple[str, str]]:
    """Every direct import from a module to one in a layer above it (or a sibling in a row);
    the package's layers unless ``layers`` are given."""
    layers = _layers() if layers is None else layers

    def row(module: str) -> tuple[int, str] | None:
        for i, names in enumerate(layers):
            for name in names:
                if module == name or module.startswith(name + "."):
                    return i, name
        return None

    bad = []
    for importer in graph.modules:
        src = row(importer)
        if src is None:
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            dst = row(imported)
            # Lower index = higher layer; a sibling in the same row is independent.
            if dst is not None and (dst[0] < src[0] or (dst[0] == src[0] and dst[1] != src[1])):
                bad.append((importer, imported))
    return sorted(bad)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of two or more of our modules (Tarjan, iterative)."""
    ours = sorted(m for m in graph.modules if m.startswith("stability"))
    edges = {m: sorted(t for t in graph.find_modules_directly_imported_by(m)
                       if t.startswith("stability")) for m in ours}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in ours:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def test_no_module_imports_a_layer_above_it(graph: grimp.ImportGraph) -> None:
    assert _upward(graph) == []


def test_a_report_stage_imports_only_the_stages_before_it(graph: grimp.ImportGraph) -> None:
    """fetch (evidence) -> weigh, decide -> examine -> sealed test -> present -> publish."""
    assert len(_stage_layers()) > 5
    assert _upward(graph, _stage_layers()) == []


def test_no_import_cycle(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_no_import_cycle_even_through_type_only_imports() -> None:
    """A ``TYPE_CHECKING`` import cannot fail at run time, but a circle through one is still
    two modules that must be read together: the records both use live below them."""
    every = grimp.build_graph("stability", include_external_packages=True,
                              exclude_type_checking_imports=False, cache_dir=None)
    assert _cycles(every) == []


def test_stats_imports_none_of_ours_nor_a_tracker(graph: grimp.ImportGraph) -> None:
    assert _forbidden_hits(graph, _contract("forbidden")) == []


def _protected_hits(graph: grimp.ImportGraph, contract: dict) -> list[tuple[str, str]]:
    """Direct imports of a ``protected`` module by one outside it and not allowed to."""

    def within(module: str, names: list[str]) -> bool:
        return any(module == n or module.startswith(n + ".") for n in names)

    protected, allowed = contract["protected_modules"], contract["allowed_importers"]
    return sorted((m, t) for m in graph.modules if not within(m, protected + allowed)
                  for t in graph.find_modules_directly_imported_by(m) if within(t, protected))


def test_only_the_presenter_imports_a_report_section(graph: grimp.ImportGraph) -> None:
    """The report's stages compute and its sections present: no stage reads a section."""
    assert _protected_hits(graph, _contract("protected")) == []


def test_a_report_section_reads_nothing_from_mlflow(graph: grimp.ImportGraph) -> None:
    contract = next(c for c in CONTRACTS["contracts"]
                    if c["type"] == "forbidden" and c["source_modules"] == [
                        "stability.report.present.sections"])
    assert _forbidden_hits(graph, contract) == []


def test_every_forbidden_contract_holds(graph: grimp.ImportGraph) -> None:
    """E.g. the report never imports a trainer or its callbacks (only ``integrations.backends``)."""
    contracts = [c for c in CONTRACTS["contracts"] if c["type"] == "forbidden"]
    assert any("lightning" in c["forbidden_modules"] for c in contracts)
    assert [h for c in contracts for h in _forbidden_hits(graph, c)] == []


def test_the_checks_catch_a_planted_upward_import_and_cycle() -> None:
    """The checks above can fail: plant an upward arrow and a cycle in a copy of the graph."""
    g = grimp.build_graph("stability", exclude_type_checking_imports=True, cache_dir=None)
    g.add_import(importer="stability.core.step", imported="stability.report.pipeline")
    assert ("stability.core.step", "stability.report.pipeline") in _upward(g)
    g.add_import(importer="stability.report.evidence.fetch",
                 imported="stability.report.decide.select")
    assert ("stability.report.evidence.fetch", "stability.report.decide.select") in _upward(
        g, _stage_layers())
    g.add_import(importer="stability.stats.paired", imported="stability.stats.effects")
    assert ["stability.stats.effects", "stability.stats.paired"] in _cycles(g)
    g.add_import(importer="stability.tracking.run", imported="stability.integrations.step_recorder")
    assert ("stability.tracking.run", "stability.integrations.step_recorder") in _upward(g)
    g.add_import(importer="stability.report.pipeline",
                 imported="stability.integrations.step_recorder")
    (report,) = [c for c in CONTRACTS["contracts"] if c["type"] == "forbidden"
                 and c["source_modules"] == ["stability.report"]]
    assert ("stability.report.pipeline", "stability.integrations.step_recorder") in _forbidden_hits(
        g, report)
