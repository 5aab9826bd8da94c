"""A max_norm recommendation from measured gradient norms, instead of a guessed threshold.

The procedure a practitioner follows by hand (train without clipping, look at the pre-clip
norms, see how often spikes occur, then choose a threshold that only touches them), done from
the sweep's clip-off runs: per accumulation setting (accumulation changes the norm of the
accumulated gradient) and per seed, the ``1 - target_share`` quantile of the finite pre-clip
norms is the max_norm that would have clipped ``target_share`` of the steps. The seeds' spread
says how stable that number is; the swept max_norm values are compared by the share of these
same steps each would have clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from stability.core.steplog import COLUMN
from stability.design.factors import ACCUM_STEPS, CLIP_ENABLED
from stability.report.options import ClipAdviceConfig


@dataclass(frozen=True)
class Recommendation:
    """The recommended max_norm for one accumulation setting."""

    accum_steps: int
    target_share: float
    max_norm: float  # median over seeds of each seed's quantile
    low: float  # smallest seed's value
    high: float  # largest seed's value
    per_seed: dict[int, float]
    steps: int  # pooled finite pre-clip norms behind it
    swept_share: dict[float, float]  # swept max_norm -> share of these steps it would clip
    norms: np.ndarray  # the pooled norms (for the figure)
    decided: str = ""  # how it stands to the decision's clipping choice (``against``)

    def sentence(self) -> str:
        """``acc=1: max_norm 0.83 clips 5% of steps (seeds 0.79-0.88); swept 1 would clip 2%``."""
        spread = (f"{len(self.per_seed)} seeds {self.low:.3g}–{self.high:.3g}"
                  if len(self.per_seed) > 1 else "1 seed")
        swept = ", ".join(f"{m:g} clips {s:.0%}" for m, s in sorted(self.swept_share.items()))
        return (f"accum {self.accum_steps}: max_norm **{self.max_norm:.3g}** would clip "
                f"{self.target_share:.0%} of steps ({spread}, {self.steps} steps)"
                + (f"; of the swept values {swept}" if swept else "")
                + (f"; {self.decided}" if self.decided else ""))

    def tag(self) -> str:
        """Compact form for an MLflow tag."""
        return f"acc={self.accum_steps}:{self.max_norm:.4g}[{self.low:.4g},{self.high:.4g}]"


def _norms(table: pd.DataFrame) -> np.ndarray:
    ok = table[COLUMN.skipped].astype(int) == 0
    v = pd.to_numeric(table.loc[ok, COLUMN.grad_l2_pre_clip], errors="coerce").to_numpy(dtype=float)
    return v[np.isfinite(v)]


def against(rec: Recommendation, clip_enabled: bool, max_norm: float, accum_steps: int) -> str:
    """How a recommendation stands to the decision's clipping choice, in words.

    The recommendation reads the clip-off runs' norms, the decision the validation loss: where
    they differ the line says so, so the advice never reads as the answer's choice.
    """
    where = "" if int(accum_steps) == rec.accum_steps else \
        f" (for accum {rec.accum_steps}; the decision chose accum {int(accum_steps)})"
    if not clip_enabled:
        return ("the decision is **clip off**: no clipping level was needed for the validation "
                "loss on this grid, so this threshold only matters for a run that wants "
                f"clipping (e.g. a longer or larger one){where}")
    if math.isfinite(max_norm) and nearest_swept(rec) == max_norm:
        return f"it agrees with the decision's max_norm {max_norm:g}{where}"
    return (f"the decision chose max_norm {max_norm:g} from the validation loss; this threshold "
            f"comes from the clip-off runs' norms and was not itself tested{where}")


def recommend(runs: pd.DataFrame, configs: pd.DataFrame, steps: dict[str, pd.DataFrame],
              cfg: ClipAdviceConfig, chosen: Any = None) -> list[Recommendation]:
    """One recommendation per accumulation setting that has finished clip-off runs with norms.

    Args:
        runs: the sweep's training runs (``fetch.fetch_runs``).
        configs: the ranked config table (for the swept max_norm values).
        steps: ``{run_id: steps table}`` (runs without one are left out).
        cfg: the target share of clipped steps.
        chosen: the decision's config row (``clip_enabled``, ``max_norm``, ``accum_steps``);
            each recommendation then says how it stands to that choice (``against``).
    """
    if CLIP_ENABLED not in runs or ACCUM_STEPS not in runs:
        return []  # clipping not swept (a run that does not record it): no clip-off runs known
    off = runs[(runs["outcome"] == "finished") & ~runs[CLIP_ENABLED].astype(bool)]
    swept = sorted(float(m) for m in configs["max_norm"].dropna().unique())
    out = []
    for accum, group in off.groupby(ACCUM_STEPS):
        per_seed: dict[int, np.ndarray] = {}
        for _, row in group.iterrows():
            if row["run_id"] in steps:  # precisions of one seed pool: clipping acts unscaled
                n = _norms(steps[row["run_id"]])
                per_seed[int(row["seed"])] = np.concatenate([per_seed.get(int(row["seed"]),
                                                                          np.array([])), n])
        per_seed = {s: v for s, v in per_seed.items() if len(v)}
        if not per_seed:
            continue
        q = {s: float(np.quantile(v, 1 - cfg.target_share)) for s, v in sorted(per_seed.items())}
        pooled = np.concatenate(list(per_seed.values()))
        out.append(Recommendation(
            accum_steps=int(accum), target_share=cfg.target_share,
            max_norm=float(np.median(list(q.values()))), low=min(q.values()),
            high=max(q.values()), per_seed=q, steps=len(pooled),
            swept_share={m: float((pooled > m).mean()) for m in swept}, norms=pooled))
    if chosen is not None:
        out = [replace(r, decided=against(r, bool(chosen.clip_enabled), float(chosen.max_norm),
                                          int(chosen.accum_steps))) for r in out]
    return out


def nearest_swept(rec: Recommendation) -> float:
    """The swept max_norm closest to the recommendation on a log scale (NaN if none swept)."""
    if not rec.swept_share:
        return math.nan
    return min(rec.swept_share, key=lambda m: abs(math.log(m / rec.max_norm)))
