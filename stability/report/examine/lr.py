"""The learning rate as a study axis: LR sensitivity and the stable LR range per setting.

When ``train.lr`` is swept, every setting of the other factors (clipping, precision,
accumulation...) gets a curve of final validation loss against the learning rate, and two
numbers from it:

- the **LR sensitivity** of Wortsman et al. (2023, "Small-scale proxies for large-scale
  Transformer training instabilities"): ``mean over the swept LRs of min(loss(lr), loss_init)
  - min over the LRs of loss(lr)``, where ``loss_init`` is the validation loss before training
  (the run's ``loss_init`` metric). A run that did not finish, or whose loss is not finite,
  counts as ``loss_init``: it learned nothing. ``loss(lr)`` is the mean over seeds; the
  sensitivity of each seed is given too.
- the **stable LR range**: the largest swept LR up to which every swept LR trains stably,
  i.e. its config's stability verdict (``report/examine/health.py``) is not ``unstable`` and its
  mean final loss is below ``loss_init``. ``None`` when even the smallest LR does not.

Then one sentence per level of each other factor against its reference, e.g. "clipping at
max_norm 1 widens the stable LR range from <=3e-3 to <=3e-2 (fp32)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stability.design.factors import CLIP, level_name
from stability.report.decide.factors import Designed, design
from stability.tracking.contract import LOSS_INIT, Outcome

LR = "train.lr"


@dataclass(frozen=True)
class LrCurve:
    """One setting of the other factors across the swept learning rates."""

    setting: tuple[tuple[str, str], ...]  # (factor, level) of every other factor
    lrs: tuple[float, ...]
    loss: tuple[float, ...]  # mean over seeds of the capped final loss, per LR
    low: tuple[float, ...]  # min over seeds (the figure's band)
    high: tuple[float, ...]  # max over seeds
    seeds: int
    loss_init: float
    stable: tuple[bool, ...]  # per LR: not unstable and below loss_init
    sensitivity: float
    sensitivity_seeds: tuple[float, ...]

    @property
    def label(self) -> str:
        """``clip off, fp32`` (``all runs`` when no other factor was swept)."""
        return ", ".join(level_name(f, v) for f, v in self.setting) or "all runs"

    @property
    def stable_max(self) -> float | None:
        """The largest LR up to which every swept LR trains stably."""
        top = None
        for lr, ok in zip(self.lrs, self.stable, strict=True):
            if not ok:
                break
            top = lr
        return top


def sensitivity(loss: np.ndarray, loss_init: float) -> float:
    """Wortsman et al.'s LR sensitivity of one curve: ``E[min(L, L0)] - min L``.

    Args:
        loss: final loss per swept LR (non-finite: the run learned nothing).
        loss_init: the loss before training.
    """
    capped = np.minimum(np.where(np.isfinite(loss), loss, loss_init), loss_init)
    return float(capped.mean() - capped.min())


def _final_loss(runs: pd.DataFrame) -> pd.Series:
    """Each run's last validation loss (``val_loss``), else its best; NaN if unfinished."""
    last = pd.to_numeric(runs.get("val_loss", runs.get("best_val_loss")), errors="coerce")
    return last.where(runs["outcome"] == Outcome.FINISHED)


def curves(runs: pd.DataFrame, configs: pd.DataFrame, *,
           designed: Designed | None = None) -> list[LrCurve]:
    """One ``LrCurve`` per setting of the other factors; empty unless ``train.lr`` was swept.

    Args:
        runs: one row per training run (``fetch.fetch_runs``), with ``loss_init``.
        configs: ``select.aggregate(runs)``, with ``stability`` (``health.judge``) if judged.
        designed: ``design(runs, configs)``, made once by the report (None: made here).
    """
    d = designed if designed is not None else design(runs, configs)
    table, factors = d.table, d.factors
    if LR not in {f.name for f in factors}:
        return []
    others = [f.name for f in factors if f.name != LR]
    table = table.assign(
        lr=table[LR].astype(float), final=_final_loss(runs).to_numpy(float),
        loss_init=pd.to_numeric(runs.get(LOSS_INIT), errors="coerce").to_numpy(float)
        if LOSS_INIT in runs else math.nan)
    verdict = dict(zip(configs["fingerprint"], configs.get("stability", pd.Series(
        "stable", index=configs.index)), strict=True))
    out = []
    for key, g in (table.groupby(others, sort=False) if others else [((), table)]):
        key = key if isinstance(key, tuple) else (key,)
        l0 = float(np.nanmean(g["loss_init"])) if g["loss_init"].notna().any() else math.nan
        ref = l0 if math.isfinite(l0) else float(np.nanmax(g["final"]))  # no loss_init: worst
        capped = g.assign(final=np.minimum(g["final"].fillna(ref), ref))
        grid = capped.pivot_table(index="lr", columns="seed", values="final", aggfunc="mean")
        mean = grid.mean(axis=1)
        fps = g.groupby("lr")["fingerprint"].first()
        stable = tuple(verdict.get(fps[lr], "stable") != "unstable" and mean[lr] < ref
                       for lr in grid.index)
        per_seed = tuple(sensitivity(grid[s].to_numpy(float), ref) for s in grid.columns
                         if grid[s].notna().all())
        out.append(LrCurve(tuple(zip(others, key, strict=True)), tuple(grid.index.astype(float)),
                           tuple(mean), tuple(grid.min(axis=1)), tuple(grid.max(axis=1)),
                           grid.shape[1], l0, stable, sensitivity(mean.to_numpy(float), ref),
                           per_seed))
    order = {f.name: f.levels for f in factors}  # each factor's display order, reference first
    return sorted(out, key=lambda c: [order[f].index(v) for f, v in c.setting])


def lr_text(lr: float) -> str:
    """``3e-3``, ``2.5e-2``, ``1e0``: the way the LR papers write them."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):.3g}e{int(exponent)}"


def _range(c: LrCurve, say_all: bool = False) -> str:
    top = c.stable_max
    if top is None:
        return "no swept LR"
    every = " (every swept LR)" if say_all and top == max(c.lrs) else ""
    return f"<={lr_text(top)}{every}"


def sentences(found: list[LrCurve], references: dict[str, str]) -> list[str]:
    """For each level of each other factor against its reference: how the stable range moves.

    Args:
        found: ``curves``.
        references: factor name -> its reference level (``Factor.reference``).
    """
    lines = []
    for factor, ref in references.items():
        levels = sorted({dict(c.setting)[factor] for c in found} - {ref})
        for level in levels:
            parts = []
            for c in found:
                s = dict(c.setting)
                if s[factor] != level:
                    continue
                base = next((b for b in found if dict(b.setting) == {**s, factor: ref}), None)
                if base is None:
                    continue
                rest = ", ".join(level_name(f, v) for f, v in c.setting if f != factor)
                a, b = base.stable_max, c.stable_max
                if a == b:
                    verb = f"leaves the stable LR range at {_range(c, say_all=True)}"
                else:
                    wider = (b or 0) > (a or 0)
                    verb = (f"{'widens' if wider else 'narrows'} the stable LR range from "
                            f"{_range(base)} to {_range(c, say_all=True)}")
                parts.append(f"{verb} (LR sensitivity {base.sensitivity:.3f} -> "
                             f"{c.sensitivity:.3f}){f' at {rest}' if rest else ''}")
            if parts:
                what = (f"Clipping at {level}" if factor == CLIP
                        else f"{level_name(factor, level)} (vs {level_name(factor, ref)})")
                lines.append(f"{what} " + "; ".join(parts) + ".")
    return lines


def table_rows(found: list[LrCurve]) -> list[list[str]]:
    """Rows of the LR table (header: ``HEADER``)."""
    rows = []
    for c in found:
        spread = (f"{min(c.sensitivity_seeds):.3g}–{max(c.sensitivity_seeds):.3g}"
                  if c.sensitivity_seeds else "—")
        rows.append([c.label, " ".join(lr_text(lr) for lr in c.lrs),
                     " ".join("ok" if ok else "x" for ok in c.stable), _range(c),
                     f"{c.loss_init:.4g}" if math.isfinite(c.loss_init) else "—",
                     f"{c.sensitivity:.4g}", spread, str(c.seeds)])
    return rows


HEADER = ["setting", "learning rates", "trains stably (per LR)", "stable LR range",
          "loss_init", "LR sensitivity", "per seed (min–max)", "seeds"]
