"""An adaptive study's looks replayed on what it recorded, and the runs its next round needs.

``sequential.look`` decides on complete arrays. A real study records runs one by one, some of
them unfinished, and may be killed and resumed; this module turns what is recorded into the
looks, so that the sweep's strategy (planning) and the report (what was decided when) read the
same decisions off the same runs:

- Look ``k`` takes place once every config the previous look needed holds its first ``n_k``
  seeds (``Plan.looks``). Seeds are added in order, so the runs a look reads (seed index
  ``< n_k``) never change once that look could be taken: replaying the looks on more data
  gives the same states. The next round is what the next look lacks: a pure function of the
  recorded runs, whatever the order they came in or how often the study was resumed.
- A run that did not finish (diverged, failed, killed) counts, as in the report
  (``report.decide.factors``), at the worst finished loss, here among the runs the look reads
  (seed index ``< n_k``, so that the value too is fixed once the look could be taken), and a
  contrast that reads one is never called equivalent.
- The equivalence margin is fixed at the first look: an absolute loss difference, or a share
  of the best config's mean over the first ``n0`` seeds (``design.Margin``). Later looks
  keep it, so it cannot drift with the decisions it feeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stability.stats import sequential as sq


@dataclass(frozen=True)
class Replay:
    """The looks an adaptive study could take on its recorded runs.

    Attributes:
        states: the state after each look taken (``sequential.State``, no batch axes).
        margin: the equivalence margin the looks used (NaN before the first look).
        fill: per look, the loss its unfinished runs stood at (NaN: none unfinished).
        missing: ``[levels..., seed]``: the runs the next look needs that are not recorded
            (all False when the study is done: every contrast decided or given up, or the
            last look taken).
    """

    states: list[sq.State]
    margin: float
    fill: list[float] = field(default_factory=list)
    missing: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def done(self) -> bool:
        """Nothing more to run: the next look needs no run."""
        return not self.missing.any()


def replay(loss: np.ndarray, ran: np.ndarray, plan: sq.Plan,
           margin: Callable[[float], float]) -> Replay:
    """Every look the recorded runs allow, and the runs the next one needs.

    Args:
        loss: best validation loss per run ``[levels..., seed index]``; NaN where a run was not
            recorded or did not finish. The seed axis may be shorter or longer than
            ``plan.max_seeds`` (seeds beyond it are never read).
        ran: like ``loss``: which runs were recorded (finished or not).
        plan: the rounds and the error spending.
        margin: the margin in loss units given the best config's mean loss at the first look
            (``design.Margin.of``: a share of it, or a fixed difference).

    Returns:
        The ``Replay``.
    """
    levels = tuple(loss.shape[:-1])
    width = max(plan.max_seeds, loss.shape[-1])
    pad = ((0, 0),) * len(levels) + ((0, width - loss.shape[-1]),)
    loss = np.pad(np.asarray(loss, dtype=float), pad, constant_values=np.nan)
    ran = np.pad(np.asarray(ran, dtype=bool), pad, constant_values=False)
    finished = ran & np.isfinite(loss)
    state = sq.start((), levels)
    states: list[sq.State] = []
    fills: list[float] = []
    value = math.nan
    for n in plan.looks:
        if not ran[..., :n][state.needed].all():
            return Replay(states=states, margin=value, fill=fills,
                          missing=state.needed[..., None] & ~ran & (np.arange(width) < n))
        window = finished[..., :n]
        fill = float(loss[..., :n][window].max()) if window.any() else math.nan
        unfinished = ran[..., :n] & ~window
        y = np.where(unfinished, fill, loss[..., :n])
        if not states:
            value = float(margin(float(np.min(y.mean(axis=-1)))))
        state = sq.look(y, state, plan, value, unfinished)
        states.append(state)
        fills.append(fill if unfinished.any() else math.nan)
        if not state.needed.any():
            break
    return Replay(states=states, margin=value, fill=fills,
                  missing=np.zeros(levels + (width,), dtype=bool))
