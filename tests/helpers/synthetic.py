"""Synthetic studies of the default grid's shape, as arrays and as the report's runs table.

The grid: clip off/1/5/10 x accum 1/2/4/8 x fp32/bf16/fp16 x 5 seeds = 240 runs. The noise is
the default study's, measured on 2026-12-01 (docs/report.md, "Factor effects"): the SD of a
run's best val loss around its config mean and seed, the SD of the seed effect, and the typical
loss (the lowest config mean) that sets the 5% margin. The costs are the default study's
training seconds per run by precision (fp16 ~6x and bf16 ~2.6x fp32 on these CPUs, DESIGN.md).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

CLIPS, ACCUMS, PRECISIONS, SEEDS = (None, 1.0, 5.0, 10.0), (1, 2, 4, 8), ("fp32", "bf16", "fp16"), 5
SHAPE = (len(CLIPS), len(ACCUMS), len(PRECISIONS), SEEDS)
NOISE = {"run": 0.0105, "seed": 0.0013, "loss": 0.0777}
MARGIN = 0.05 * NOISE["loss"]
SECONDS = {"fp32": 9.0, "bf16": 23.5, "fp16": 55.0}


def studies(rng: np.random.Generator, n: int, effect: np.ndarray | None = None,
            run: float | np.ndarray = NOISE["run"], seed_by_clip: float = 0.0,
            tails: float = math.inf) -> np.ndarray:
    """``n`` studies ``y[n, clip, accum, precision, seed]``: base + effects + seed + noise.

    ``run`` may be an array of the grid's shape without seeds (unequal noise per config);
    ``seed_by_clip`` adds a seed x clip-level interaction; ``tails`` < inf draws the run noise
    from a Student t with that many df (scaled to ``run``).
    """
    y = NOISE["loss"] + (0.0 if effect is None else effect)
    y = y + rng.normal(0, NOISE["seed"], (n, 1, 1, 1, SEEDS))
    y = y + rng.normal(0, seed_by_clip, (n, len(CLIPS), 1, 1, SEEDS))
    sd = np.asarray(run, dtype=float)
    sd = sd[..., None] if sd.ndim == 3 else sd
    if math.isinf(tails):
        noise = rng.normal(0, 1, (n, *SHAPE))
    else:
        noise = rng.standard_t(tails, (n, *SHAPE)) / math.sqrt(tails / (tails - 2))
    return y + noise * sd


def planted(clip: tuple = (0, 0, 0, 0), accum: tuple = (0, 0, 0, 0),
            precision: tuple = (0, 0, 0)) -> np.ndarray:
    """An additive effect array of the grid's shape (level 0 of each factor is the reference)."""
    return (np.asarray(clip)[:, None, None, None] + np.asarray(accum)[None, :, None, None]
            + np.asarray(precision)[None, None, :, None])


def fingerprint(c: int, a: int, p: int) -> str:
    """The synthetic config id of grid point ``(clip, accum, precision)``."""
    return f"{CLIPS[c]}-{ACCUMS[a]}-{PRECISIONS[p]}"


def runs_table(y: np.ndarray, outcome: dict[tuple[int, int, int, int], str] | None = None,
               drop: set[tuple[int, int, int, int]] = frozenset(),
               seeds: tuple[int, ...] | None = None) -> pd.DataFrame:
    """The report's runs table of one study ``y[clip, accum, precision, seed]``.

    ``outcome`` marks grid points (with seed index) not finished (e.g. ``"diverged"``); points
    in ``drop`` were never run; ``seeds`` names the seed of each index (default 0, 1, ...).
    """
    outcome = outcome or {}
    rows = []
    for idx, loss in np.ndenumerate(y):
        if idx in drop or not np.isfinite(loss):
            continue
        c, a, p, s = idx
        clip, fp = CLIPS[c], fingerprint(c, a, p)
        seed = seeds[s] if seeds else s
        done = outcome.get(idx, "finished")
        rows.append({"run_id": f"{fp}-{seed}", "fingerprint": fp, "seed": seed,
                     "outcome": done, "best_val_loss": loss if done == "finished" else math.nan,
                     "precision.name": PRECISIONS[p], "clip.enabled": clip is not None,
                     "clip.method": "norm", "clip.max_norm": clip or 1.0,
                     "train.accum_steps": ACCUMS[a], "wall_time_s": 1.0, "skip_count": 0,
                     "step_time_median_s": SECONDS[PRECISIONS[p]] / 100,
                     "optimizer_steps": 100})
    return pd.DataFrame(rows)


def rate_ci(hits: int, n: int) -> tuple[float, float, float]:
    """The rate and its two-sided 95% Clopper-Pearson interval."""
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return hits / n, ci.low, ci.high
