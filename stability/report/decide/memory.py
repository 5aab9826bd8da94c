"""Memory as a cost a GPU user pays: a budget the decision respects, and what accumulation saved.

``report.memory_budget_mb`` states the most a config may use (its runs' median
``peak_memory_mb``: on CUDA ``torch.cuda.max_memory_allocated``, on CPU the process's peak
resident set, interpreter included; ``core/cost.py``). A config over it, or without a measured
peak, is set aside before anything is analysed, one line naming each (the first ten, then a
count), so the decision, the factor effects and the sealed test see only configs that fit.
Accumulation's point is memory: the same effective batch in smaller micro-batches. The report
says, per accumulation level, the median peak of its configs against accum 1's, as measured.
"""

from __future__ import annotations

import math

import pandas as pd

from stability.report.decide import select
from stability.report.options import ReportError

NAMED = 10  # configs named in the set-aside line; the rest are counted


def within_budget(runs: pd.DataFrame, configs: pd.DataFrame, budget_mb: float | None,
                  confidence: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """The runs and configs that fit ``budget_mb``, and the line that names the rest.

    Raises:
        ReportError: no config fits (one line: the budget and the lowest measured peak).
    """
    if budget_mb is None:
        return runs, configs, []
    peak = pd.to_numeric(configs["peak_memory_mb"], errors="coerce")
    fits = peak <= budget_mb
    if not fits.any():
        low = peak.min()
        raise ReportError(f"report.memory_budget_mb={budget_mb:g} is invalid for this sweep: "
                          "no config fits it (lowest measured peak "
                          f"{'none' if math.isnan(low) else f'{low:.0f} MB'}); allowed values "
                          "are a budget at or above a config's peak_memory_mb, or null")
    over = configs[~fits]
    if over.empty:
        return runs, configs, []
    named = ", ".join(f"{r.label} ({'not measured' if math.isnan(p) else f'{p:.0f} MB'})"
                      for r, p in zip(over.head(NAMED).itertuples(), peak[~fits].head(NAMED),
                                      strict=True))
    more = f" and {len(over) - NAMED} more" if len(over) > NAMED else ""
    line = (f"memory budget {budget_mb:g} MB (report.memory_budget_mb): {len(over)} of "
            f"{len(configs)} configs set aside, their median peak memory over it or not "
            f"measured: {named}{more}")
    kept = runs[runs["fingerprint"].isin(set(configs.loc[fits, "fingerprint"]))].copy()
    kept.attrs.update(runs.attrs)
    return kept, select.aggregate(kept, confidence), [line]


def accumulation_memory(configs: pd.DataFrame) -> str:
    """``Peak memory by accumulation (median of its configs): accum 1 340 MB; accum 4 ...``."""
    return _by_level(configs, "accum_steps", "accum", 1, "accumulation keeps the micro-batch "
                     "and grows the effective batch, so it saves memory only against one batch "
                     "of the same effective size")


def precision_memory(configs: pd.DataFrame) -> str:
    """``Peak memory by precision (median of its configs): fp32 900 MB; bf16 610 MB ...``."""
    return _by_level(configs, "precision", "", "fp32", "autocast keeps fp32 weights and "
                     "optimizer state; what it saves is activations")


def _by_level(configs: pd.DataFrame, column: str, prefix: str, reference: object,
              why: str) -> str:
    if column not in configs or configs[column].nunique() < 2:
        return ""
    levels = configs[column].astype(int) if column == "accum_steps" else configs[column]
    peak = pd.to_numeric(configs["peak_memory_mb"], errors="coerce")
    by = peak.groupby(levels).median().dropna()
    if by.empty or reference not in by.index:
        return ""
    base = float(by.loc[reference])
    name = "accumulation" if column == "accum_steps" else column
    parts = [f"{f'{prefix} ' if prefix else ''}{k} {v:.0f} MB"
             + ("" if k == reference else f" ({(v - base) / base:+.1%})") for k, v in by.items()]
    return (f"Peak memory by {name} (median of its configs' median peaks, as measured; {why}): "
            + "; ".join(parts) + ".")
