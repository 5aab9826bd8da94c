"""One factor's choice on arrays: its joint levels, their MCB bounds and the rule's pick.

``level_choice`` is the rule the report's decision (``report.decide.winner.decide``) applies to each
factor (or group of interacting factors): multiple comparisons with the best
(``stats.best.mcb``), the candidates (``stats.best.candidates``), the equally cheap among them
(``stats.cost.equally_cheap``), then the simplest (``stats.best.choose``). It lives here, below
the report and the sweep, so that the decide study (``stability.sweep.decide``, through
``stats.shown``) plans its rounds with the very rule the report decides with. Arrays have any
leading batch axes: the simulations run this code on thousands of studies at once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from stability.stats import best as mcb
from stability.stats import cost as costs


def joint(y: np.ndarray, axes: list[int], k: int) -> np.ndarray:
    """``y[..., joint level, cell of the other factors, seed]`` from ``y[..., f_1..f_k, seed]``.

    ``axes`` are the group's factor indices among the ``k`` factors; leading axes are batch
    axes.
    """
    lead = y.ndim - 1 - k
    rest = [a for a in range(k) if a not in axes]
    order = [*range(lead), *(lead + a for a in axes), *(lead + a for a in rest), y.ndim - 1]
    levels = int(np.prod([y.shape[lead + a] for a in axes]))
    return np.transpose(y, order).reshape(y.shape[:lead] + (levels, -1, y.shape[-1]))


@dataclass(frozen=True)
class Terms:
    """What one group is decided at: the margin, its share of alpha, the cost floor.

    Attributes:
        delta: the margin (a scalar, or one per batch element; ``-inf``: nothing is within).
        alpha: the error this group may spend.
        tolerance: a share a cost difference must exceed beside the measured spread
            (``stats.cost.FLOOR`` by default).
        constrained: the gap bounds over the levels not shown worse (``best.mcb``), as a
            decide study's looks take them.
    """

    delta: float | np.ndarray
    alpha: float
    tolerance: float = costs.FLOOR
    constrained: bool = False


def level_choice(y: np.ndarray, k: int, axes: list[int], terms: Terms, seconds: np.ndarray,
                 simple: np.ndarray) -> tuple[mcb.Best, np.ndarray, np.ndarray]:
    """MCB bounds, level means and the rule's pick for one group (any leading batch axes).

    Args:
        y: losses ``[..., level of factor 1, ..., level of factor k, seed]`` (NaN: not run).
        k: the number of factors.
        axes: the group's factor indices.
        terms: the margin, the error this group may spend, the cost floor and whether the
            bounds are constrained.
        seconds: training seconds of every run, the shape of ``y`` (NaN: unknown).
        simple: simplicity rank of each joint level (``[L]``).

    Returns:
        ``(bounds, mean[..., L], pick[...])``.
    """
    yj = joint(y, axes, k)
    b = mcb.mcb(mcb.pairwise(yj), terms.delta, terms.alpha, terms.constrained)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a level never run: NaN mean
        mean = np.nanmean(yj.reshape(yj.shape[:-2] + (-1,)), axis=-1)
    cost = costs.level_cost(joint(np.broadcast_to(seconds, y.shape), axes, k))
    pool = mcb.candidates(b.status, b.gap, terms.delta)
    cheap = costs.equally_cheap(cost, pool, terms.tolerance)
    return b, mean, mcb.choose(pool, cheap, simple, mean)
