"""How the report writes a number, a table and a figure file: each shape once.

A value that does not exist is written as "—". Which values count as missing is a choice of the
call site (``Blank``): a config table shows an infinite mean as ``inf`` (a config that lost a
seed), a factor sentence shows no infinite estimate at all, and a few older sentences print the
raw value. Every table goes through ``table``, which keeps a cell on one line and its pipes
inert, so an MLflow value cannot add a column or a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")  # no display: the report runs on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

DASH = "—"
SMALL = 5e-5  # four decimals everywhere; a size below this prints "<0.0001", never scientific
P_FLOOR = 1e-4  # a p-value below this prints "<0.0001" (two significant digits above it)
DPI = 130
ACC_DIGITS = 3  # an accuracy's decimals, in the answer and every table

Blank = Literal["never", "nan", "nonfinite"]  # which values print as DASH


def _blank(x: float, blank: Blank) -> bool:
    if blank == "nan":
        return math.isnan(x)
    return blank == "nonfinite" and not math.isfinite(x)


def signed(x: float, blank: Blank = "nan") -> str:
    """A signed loss difference: four decimals, always (one format per column: a difference
    below 5e-5 prints ``+0.0000``).

    Args:
        x: the difference.
        blank: ``"nan"`` writes NaN as "—" (an infinite one as ``+inf``); ``"nonfinite"``
            writes every non-finite value as "—".
    """
    if _blank(x, blank):
        return DASH
    return f"{x:+.4f}"


def size(x: float, blank: Blank = "nan") -> str:
    """An unsigned size (a margin, a detectable difference): four decimals; ``<0.0001`` below 5e-5.

    Args:
        x: the size.
        blank: as in ``signed``; ``"never"`` prints the value as it is (``nan``).
    """
    if _blank(x, blank):
        return DASH
    return "<0.0001" if 0 < abs(x) < SMALL else f"{x:.4f}"


def fixed_signed(x: float) -> str:
    """A signed value with four decimals; "—" when not finite (the adaptive rounds' table)."""
    return DASH if not math.isfinite(x) else f"{x:+.4f}"


def fmt(x: float | None, digits: int = 4) -> str:
    """A number for a table: fixed digits, 'inf' for +inf, an em dash for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if x == math.inf:
        return "inf"
    return f"{x:.{digits}f}"


def pm(mean: float, std: float, digits: int = 4) -> str:
    """``mean ± std``, or the mean alone when there is no spread."""
    return fmt(mean, digits) if math.isnan(std) else f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def ci(low: float, high: float, digits: int = 4) -> str:
    """``[low, high]``, or "—" without an interval."""
    return DASH if math.isnan(low) else f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def signed_ci(low: float, high: float) -> str:
    """An interval on a difference, ``[-0.0100, +0.0200]``."""
    return DASH if math.isnan(low) else f"[{signed(low)}, {signed(high)}]"


def pval(p: float) -> str:
    """A p-value to two significant digits, ``<0.0001`` below 1e-4 (one format everywhere)."""
    if math.isnan(p):
        return DASH
    return "<0.0001" if p < P_FLOOR else f"{p:.2g}"


def seeds(n: float) -> str:
    """A seed count that may be unknown or beyond reach."""
    return DASH if math.isnan(n) else ("> 10000" if math.isinf(n) else str(int(n)))


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; a cell's newlines (data) become spaces and its pipes are escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(" ".join(str(c).split()).replace("|", "\\|") for c in r) + " |"
              for r in rows]
    return "\n".join(lines)


def save(fig: plt.Figure, folder: Path, name: str, dpi: int = DPI, tight: bool = True) -> str:
    """Write ``fig`` as ``folder/name`` and close it; ``tight=False`` for a constrained layout."""
    folder.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(folder / name, dpi=dpi)
    plt.close(fig)
    return name
