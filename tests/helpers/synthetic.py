"""Synthetic studies of the default grid's shape, as arrays and as the report's runs table.

The grid: clip off/1/5/10 x accum 1/2/4/8 x fp32/bf16/fp16 x 5 seeds = 240 runs. The noise is
the default study's, measured on 2026-12-01 (docs/report.md, "Factor effects"): the SD of a
run's best val loss around its config mean and seed, the SD of the seed effect, and the typical
loss (the lowest config mean) that sets the 5% margin. The costs are the default study's
training seconds per run by precision (fp16 ~6x and bf16 ~2.6x fp32 on these CPUs, DESIGN.md).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats

from stability.design.margin import Margin
from stability.report.decide import winner
from stability.stats import cost as costs
from stability.stats.choice import Terms

CLIPS, ACCUMS, PRECISIONS, SEEDS = (None, 1.0, 5.0, 10.0), (1, 2, 4, 8), ("fp32", "bf16", "fp16"), 5
SHAPE = (len(CLIPS), len(ACCUMS), len(PRECISIONS), SEEDS)
NOISE = {"run": 0.0105, "seed": 0.0013, "loss": 0.0777}
MARGIN = 0.05 * NOISE["loss"]
SECONDS = {"fp32": 9.0, "bf16": 23.5, "fp16": 55.0}


def studies(rng: np.random.Generator, n: int, effect: np.ndarray | None = None,
            run: float | np.ndarray = NOISE["run"], seed_by_clip: float = 0.0,
            tails: float = math.inf, seeds: int = SEEDS) -> np.ndarray:
    """``n`` studies ``y[n, clip, accum, precision, seed]``: base + effects + seed + noise.

    ``run`` may be an array of the grid's shape without seeds (unequal noise per config);
    ``seed_by_clip`` adds a seed x clip-level interaction; ``tails`` < inf draws the run noise
    from a Student t with that many df (scaled to ``run``). ``effect`` (and an array ``run``)
    may have another grid's shape (levels of each factor) with a seed axis of one or
    ``seeds``.
    """
    y = NOISE["loss"] + (0.0 if effect is None else effect)
    grid = np.shape(y)[:-1] if np.ndim(y) else SHAPE[:-1]
    y = y + rng.normal(0, NOISE["seed"], (n,) + (1,) * len(grid) + (seeds,))
    y = y + rng.normal(0, seed_by_clip, (n, grid[0]) + (1,) * (len(grid) - 1) + (seeds,))
    sd = np.asarray(run, dtype=float)
    sd = sd[..., None] if sd.ndim == len(grid) else sd
    if math.isinf(tails):
        noise = rng.normal(0, 1, (n, *grid, seeds))
    else:
        noise = rng.standard_t(tails, (n, *grid, seeds)) / math.sqrt(tails / (tails - 2))
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


STUDY_CSV = "tests/data/default_study_runs.csv"  # the default study of 2026-12-01, 240 runs


def default_study() -> tuple[np.ndarray, np.ndarray]:
    """The measured default study: ``(loss, seconds)``, each ``[clip, accum, precision, seed]``."""
    from pathlib import Path
    frame = pd.read_csv(Path(__file__).resolve().parents[2] / STUDY_CSV)
    loss, seconds = np.full(SHAPE, np.nan), np.full(SHAPE, np.nan)
    clips = ["off", *(f"{c:g}" for c in CLIPS[1:])]
    for r in frame.itertuples():
        at = (clips.index(str(r.max_norm)), ACCUMS.index(int(r.accum)),
              PRECISIONS.index(str(r.precision)), int(r.seed))
        loss[at], seconds[at] = r.best_val_loss, r.wall_time_s
    return loss, seconds


def real_noise(rng: np.random.Generator, n: int, seeds: int = SEEDS) -> np.ndarray:
    """``n`` noise draws ``[n, clip, accum, precision, seed]`` with the measured study's covariance.

    The study's residuals around each config's mean (48 configs x 5 seeds) span 4 seed
    directions ``Z`` (an orthonormal basis orthogonal to the mean); ``Z @ G / 2`` with ``G``
    standard normal ``[4, 5]`` has, seed by seed, the covariance ``Z Z' / 4`` across the 48
    configs: the seed effect, the configs that share a seed's initialisation and shuffling
    moving together, and the run noise, as measured (a parametric bootstrap). ``seeds``: as
    many independent seeds as asked (each drawn the same way).
    """
    loss, _ = default_study()
    flat = loss.reshape(-1, SEEDS)
    basis = np.linalg.svd(np.eye(SEEDS) - 1 / SEEDS)[0][:, :SEEDS - 1]  # orthogonal to 1
    z = (flat - flat.mean(axis=1, keepdims=True)) @ basis  # [48, 4]
    g = rng.normal(0, 1, (n, SEEDS - 1, seeds))
    return (z @ g / math.sqrt(SEEDS - 1)).reshape(n, *SHAPE[:-1], seeds)


def run_seconds(rng: np.random.Generator, n: int, log_sd: float = 0.0,
                ratios: dict[str, tuple] | None = None, seeds: int = SEEDS) -> np.ndarray:
    """Training seconds of every run ``[n, clip, accum, precision, seed]``: the precision's
    cost (``SECONDS``), or fp32's times each factor's ``ratios`` (``README_COST``), with
    log-normal run-to-run noise of SD ``log_sd``."""
    if ratios is None:
        base = np.array([SECONDS[p] for p in PRECISIONS])[None, None, None, :, None]
    else:
        base = SECONDS["fp32"] * np.exp(planted(*(np.log(ratios[f]) for f in FACTORS)))[None]
    return base * np.exp(rng.normal(0, log_sd, (n, *SHAPE[:-1], seeds)))


# The README's answer (the default study of 2026-12-04): each level's CPU time over its factor's
# first level (the "time x" column), and the run-to-run spread its "≈" marks imply: accum 2 at
# 0.86x is inside it and accum 4 at 0.84x is not, which with 60 runs a level puts the log SD
# of one run near 0.125 (the decision audit of issue 54).
FACTORS = ("clip", "accum", "precision")
README_COST = {"clip": (1.0, 0.98, 1.0, 0.98), "accum": (1.0, 0.86, 0.84, 0.94),
               "precision": (1.0, 3.71, 4.51)}
README_SPREAD = 0.125
SIMPLE = ([0, 1, 1, 1], [0, 1, 2, 3], [0, 1, 2])  # design.factors.simplicity of each level
SHARE = Margin.parse("5%")  # report.margin's default


def report_margin(y: np.ndarray) -> np.ndarray:
    """The margin the report uses in each study ``y[n, ..., seed]``: 5% of the lowest config
    mean (``design.Margin.lowest``, what ``report.stages.weigh`` calls), biased low as the
    lowest of 48 noisy means is."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a config with no run: NaN, left out
        means = np.nanmean(y, axis=-1).reshape(len(y), -1)
    return np.array([SHARE.lowest(row) for row in means])


def true_margin(effect: np.ndarray | None) -> float:
    """The margin the report means to use: 5% of the true lowest config mean."""
    return SHARE.of(NOISE["loss"] + float(np.min(0.0 if effect is None else effect)))


def decide_batch(y: np.ndarray, delta: float | np.ndarray | None = None, alpha: float = 0.05,
                 seconds: np.ndarray | None = None, tolerance: float = costs.FLOOR) -> list:
    """Each factor decided on its own (no interaction detected), as ``winner.decide`` does:
    alpha split over the 3 choices, the report's margin (``report_margin``) unless ``delta``
    is given, the report's default cost floor. ``[(bounds, mean, pick)]`` per factor."""
    delta = report_margin(y) if delta is None else delta
    if seconds is None:
        seconds = run_seconds(np.random.default_rng(0), 1, seeds=1)
    terms = Terms(delta=delta, alpha=alpha / 3, tolerance=tolerance)
    return [winner.level_choice(y, 3, [axis], terms, seconds, np.array(SIMPLE[axis]))
            for axis in range(3)]
