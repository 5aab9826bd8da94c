"""The ``Section`` protocol: what one block of the report does, and ``Part``, its plain form.

A section reads the frozen ``Study`` (``analyse``), may draw figures into the report's
``plots/`` folder, and writes its Markdown. ``analyse`` returning None leaves the section out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stability.report.present.plots import Figure
from stability.report.present.study import Study

Drawn = Figure | str  # a figure, or one line saying why a figure is not drawn


class Section(Protocol):
    """One block of the report."""

    name: str

    def analyse(self, study: Study) -> Any | None:
        """What the section shows, from the study alone; None leaves the section out."""

    def figures(self, result: Any, folder: Path) -> Sequence[Drawn]:
        """The section's figures, written into ``folder`` (the report's ``plots/``)."""

    def markdown(self, result: Any) -> str:
        """The section's Markdown; "" for a section that only draws."""


def _no_figures(result: Any, folder: Path) -> Sequence[Drawn]:
    return ()


def _no_markdown(result: Any) -> str:
    return ""


@dataclass(frozen=True)
class Part:
    """A ``Section`` made of three functions; the ones a section does not need default to none.

    Attributes:
        name: the section's name (a figure that fails is named by it under Problems).
        analyse: ``study -> result | None``.
        markdown: ``result -> str``.
        figures: ``(result, folder) -> [Figure | remark]``.
    """

    name: str
    analyse: Callable[[Study], Any | None]
    markdown: Callable[[Any], str] = _no_markdown
    figures: Callable[[Any, Path], Sequence[Drawn]] = _no_figures


def lines(*parts: str | Sequence[str]) -> str:
    """Markdown lines joined as the report joins them (one "\\n" each; "" is a blank line)."""
    out: list[str] = []
    for p in parts:
        out += [p] if isinstance(p, str) else list(p)
    return "\n".join(out)


def drawn(fig: Figure | None) -> Sequence[Drawn]:
    """A figure function's result (``None``: nothing to draw) as a section's figures."""
    return () if fig is None else (fig,)
