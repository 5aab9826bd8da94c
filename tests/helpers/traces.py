"""Synthetic ``steps.csv`` tables: healthy training with batch noise, and planted instabilities.

Healthy loss: a binary classifier whose score for a sample is ``k_t * (|x| + e)`` with
``x, e`` normal (``e``: the model's error, SD ``sigma``) and ``k_t`` growing over training; the
step's loss is the mean BCE over a batch of 64. The count of near-boundary samples in a batch
is what makes a small batch's loss right-skewed, so a healthy run has isolated 6-std steps:
with ``kmax = 40, sigma = 0.1`` (the heaviest-tailed of the generators tried, 0.1-0.14 such
steps a run of 288-594 steps) the traces end near the default task's loss (0.08-0.09).

fp16 runs carry a GradScaler with the real update rule (``growth_interval`` clean steps double
the scale; an overflow skips the step and halves it): the scale settles where the gradients
fit and probes upward every ``growth_interval`` steps, each probe one skipped step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

FP16_MAX = 65504.0


def healthy_loss(rng: np.random.Generator, n: int, batch: int = 64, kmax: float = 40.0,
                 sigma: float = 0.1) -> np.ndarray:
    """Per-step mean batch loss of a healthy run of ``n`` optimizer steps."""
    progress = 1 - np.exp(-np.arange(n) / (n / 3))
    k = 0.5 + kmax * progress
    x = rng.normal(0, 1, (n, batch))
    score = k[:, None] * (np.abs(x) + rng.normal(0, sigma, (n, batch)))
    return np.log1p(np.exp(-score)).mean(axis=1)


def scaler_trace(rng: np.random.Generator, n: int, growth: float = 1.0,
                 interval: int = 100, init: float = 65536.0) -> tuple[np.ndarray, np.ndarray]:
    """``(scale used at each step, skipped)`` of a GradScaler over gradients that grow by
    ``growth`` over the run (1: steady; 2**12: growing until the scale collapses)."""
    norm = np.exp(rng.normal(np.log(2.0), 0.5, n)) * growth ** (np.arange(n) / n)
    scale, tracker = init, 0
    used, skipped = np.empty(n), np.zeros(n, dtype=int)
    for i in range(n):
        used[i] = scale
        if scale * norm[i] * 4 > FP16_MAX * 8:  # some gradient element overflows fp16
            skipped[i], scale, tracker = 1, scale / 2, 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = scale * 2, 0
    return used, skipped


def table(loss: np.ndarray, scale: np.ndarray | None = None,
          skipped: np.ndarray | None = None) -> pd.DataFrame:
    """A ``steps.csv`` table with the columns the verdicts read."""
    n = len(loss)
    skipped = np.zeros(n, dtype=int) if skipped is None else skipped
    return pd.DataFrame({
        "step": np.arange(1, n + 1), "loss": loss, "skipped": skipped,
        "skip_reason": np.where(skipped == 1, "nonfinite_grad", ""),
        "scaler_scale": np.ones(n) if scale is None else scale,
        "clipped": np.zeros(n, dtype=int)})


def spiky(rng: np.random.Generator, loss: np.ndarray, spikes: int = 5,
          factor: float = 4.0) -> np.ndarray:
    """``loss`` with ``spikes`` single-step jumps to ``factor`` x the loss in its second half.

    The second half: while the loss still falls fast, the window's std is the trend's, and a
    4x step is inside it (a known blind spot of the z-score rule, docs/report.md).
    """
    out = loss.copy()
    at = rng.choice(np.arange(len(loss) // 2, len(loss)), spikes, replace=False)
    out[at] *= factor
    return out


def lr_too_high(rng: np.random.Generator, n: int, every: int = 25) -> np.ndarray:
    """Loss of a run whose LR is too high: it keeps blowing up (x5) and recovering over 5 steps."""
    loss = healthy_loss(rng, n)
    for start in range(40, n, every):
        bump = 4.0 * np.exp(-np.arange(min(5, n - start)) / 1.5)
        loss[start:start + len(bump)] *= 1 + bump
    return loss
