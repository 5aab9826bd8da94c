"""A study that runs until its answer is shown: the looks of ``strategy=decide``, vectorised.

The report's decision (``stats.choice.level_choice``, per factor) picks a level by multiple
comparisons with the best (MCB): the answer is *shown* when the chosen level's simultaneous
upper bound on its gap to the best is within the margin. At 5 seeds it rarely is. A decide
study adds seeds until it is, and only where the answer is still open:

- **Look k** (``Plan.looks[k]`` = ``n_k`` seeds) reads the runs recorded with seed index below
  ``n_k`` (an unfinished run at the worst finished loss among them, as the report counts it)
  and decides every factor with ``level_choice`` at the look's share of alpha,
  ``Plan.spend[k]``, split evenly over the factors (Bonferroni). The margin is the report's: a
  share of the lowest mean of the configs whose read runs all finished (``design.Margin.of``,
  given as ``margin_of``).
- A factor is **settled** when its chosen level is shown within the margin *and* no level still
  open (neither within nor shown worse) is cheaper by the cost rule (``stats.cost
  .equally_cheap`` over the levels not shown worse): the study never stops on a level that the
  same rule would drop for a cheaper one with a few more seeds (under no effect, fp16 would
  otherwise be chosen as often as fp32, at 6x the cost).
- **The next round** gives ``step`` more seeds to every config none of whose levels is shown
  worse by more than the margin (a level shown worse leaves as a whole), while some factor is
  not settled. A settled factor keeps its other levels: the report's MCB weighs every seed
  alike, so each later seed should average its paired differences over the same cells for
  every level (a seed over 2 cells instead of 12 counts as much with 6x the variance). The
  study stops when every factor is settled at the same look, or after the last look
  (``max_seeds``).
- **The bounds** are taken over the levels not shown worse (``best.mcb(constrained=True)``):
  under the event below the true best is never shown worse, so a level that left early, its
  few seeds making wide pairs, cannot widen every later bound.

**Error.** Let ``E_k`` be the event that look k's MCB bounds hold for every factor (each
factor's true best is never shown worse, and ``mu_i - min_j mu_j <= U_i`` for every level).
``P(not E_k) <= spend[k]`` by Hsu's construction with Bonferroni over the factors, so all looks
hold together with probability at least ``1 - sum(spend) = 1 - alpha`` whatever the stopping
rule (a union bound, as ``stats.sequential``'s verdicts). Under all ``E_k`` every "shown
within" the study or the report prints is true, for whatever margin was printed (the bounds
do not depend on it). Where this is exact: when a look reads the first ``n_k`` seeds of a set
of configs fixed in advance (round 1, a study that narrows nothing) the bound at each look is
Hsu's. Where the simulation carries the proof: the cells a later look reads were chosen from
earlier looks, so its per-seed differences average over fewer cells for the later seeds
(heteroscedastic seeds, and under interaction a different average): the Clopper-Pearson
bounds of ``tests/stats/test_decide_simulation.py`` assert the rate over the audit's
scenarios, through this very code.

**Pure function of the runs.** A look reads seed indices below ``n_k``, the seeds are added in
order, and look k is taken once every config its round asked for holds those seeds: replaying
the looks on more data gives the same looks, so a killed study resumes to the same plan
(``replay``). The simulations (``simulate``) and the sweep's strategy (a batch of one) run the
same ``look``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from stability.stats import best as mcb
from stability.stats import cost as costs
from stability.stats.choice import Terms, joint, level_choice
from stability.stats.sequential import Plan

MarginOf = Callable[[np.ndarray], np.ndarray]  # lowest config mean(s) -> margin(s), loss units


@dataclass(frozen=True)
class Look:
    """What one look decided (arrays with the batch's leading shape ``[...]``).

    Attributes:
        index: the look, 1-based.
        seeds: ``n_k``, the seeds it read per config.
        alpha: its share of alpha (each factor's MCB spends ``alpha / factors``).
        margin: the margin it used ``[...]`` (NaN: no config finished every read run).
        status: per factor, each level's MCB status ``[..., level]`` (``best.WITHIN`` ...).
        upper: per factor, each level's simultaneous upper bound on its gap to the best.
        gap: per factor, each level's point estimate of that gap.
        pick: the rule's level per factor ``[..., factor]``.
        shown: the pick is shown within the margin ``[..., factor]``.
        settled: shown, and no open level is cheaper ``[..., factor]``.
        runs: the runs it read ``[...]``.
        next: the configs the next round seeds ``[..., levels...]`` (none once all are settled
            or after the last look).
    """

    index: int
    seeds: int
    alpha: float
    margin: np.ndarray
    status: tuple[np.ndarray, ...]
    upper: tuple[np.ndarray, ...]
    gap: tuple[np.ndarray, ...]
    pick: np.ndarray
    shown: np.ndarray
    settled: np.ndarray
    runs: np.ndarray
    next: np.ndarray

    @property
    def done(self) -> np.ndarray:
        """Every factor settled ``[...]``."""
        return self.settled.all(axis=-1)


@dataclass(frozen=True)
class Setup:
    """A decide study's fixed terms: what every one of its looks decides with.

    Attributes:
        plan: the rounds and the error spending.
        margin_of: the margin in loss units given the lowest config mean (vectorised).
        simple: per factor, each level's simplicity rank (0 simplest).
        tolerance: a share a cost difference must exceed (``report.cost_tolerance``).
    """

    plan: Plan
    margin_of: MarginOf
    simple: Sequence[np.ndarray]
    tolerance: float = costs.FLOOR


def look(y: np.ndarray, ran: np.ndarray, k: int, setup: Setup,
         seconds: np.ndarray | None = None) -> Look:
    """Look ``k`` (0-based) on what is recorded.

    Args:
        y: best validation loss per run ``[batch..., levels..., seed]`` (NaN: not finished or
            not run); at least ``n_k`` seeds wide.
        ran: like ``y``: which runs are recorded (finished or not).
        k: the look.
        setup: the study's plan, margin, simplicity ranks and cost floor.
        seconds: training seconds per run, broadcastable to ``y`` (None: cost decides nothing).
    """
    plan, simple, tolerance = setup.plan, setup.simple, setup.tolerance
    nf = len(simple)
    n = plan.looks[k]
    y, ran = np.asarray(y, dtype=float), np.asarray(ran, dtype=bool)
    secs = (np.full(y.shape, np.nan) if seconds is None
            else np.broadcast_to(np.asarray(seconds, dtype=float), y.shape))
    y, ran, secs = y[..., :n], ran[..., :n], secs[..., :n]
    lead = y.ndim - 1 - nf
    finished = ran & np.isfinite(y)
    axes = tuple(range(lead, y.ndim))
    worst = np.max(np.where(finished, y, -np.inf), axis=axes, keepdims=True)
    worst = np.where(np.isfinite(worst), worst, np.nan)  # no finished run: nothing to floor at
    y = np.where(ran, np.where(finished, y, worst), np.nan)  # unfinished: the worst finished
    secs = np.where(ran, secs, np.nan)
    margin = _margin(y, ran, finished, lead, nf, setup.margin_of)
    delta = np.where(np.isfinite(margin), margin, -np.inf)  # no margin: nothing is within
    share = float(plan.spend[k])
    terms = Terms(delta=delta, alpha=share / nf, tolerance=tolerance, constrained=True)
    status, upper, gap, picks, settled = [], [], [], [], []
    for f in range(nf):
        b, _, pick = level_choice(y, nf, [f], terms, secs, np.asarray(simple[f]))
        at = pick[..., None]
        shown = np.take_along_axis(b.status, at, -1)[..., 0] == mcb.WITHIN
        live = np.isin(b.status, (mcb.WITHIN, mcb.NEAR, mcb.OPEN))  # not shown worse
        cheap = costs.equally_cheap(costs.level_cost(joint(secs, [f], nf)), live, tolerance)
        status.append(b.status)
        upper.append(b.upper)
        gap.append(b.gap)
        picks.append(pick)
        settled.append(shown & np.take_along_axis(cheap, at, -1)[..., 0])
    pick = np.stack(picks, axis=-1)
    settle = np.stack(settled, axis=-1)
    shown_all = np.stack([np.take_along_axis(s, p[..., None], -1)[..., 0] == mcb.WITHIN
                          for s, p in zip(status, picks, strict=True)], axis=-1)
    last = k + 1 == len(plan.looks)
    nxt = np.zeros(y.shape[:-1], dtype=bool) if last else _contention(status, lead)
    nxt &= ~settle.all(axis=-1).reshape(settle.shape[:-1] + (1,) * nf)
    return Look(index=k + 1, seeds=n, alpha=share, margin=margin, status=tuple(status),
                upper=tuple(upper), gap=tuple(gap), pick=pick, shown=shown_all, settled=settle,
                runs=ran.sum(axis=axes), next=nxt)


def _margin(y: np.ndarray, ran: np.ndarray, finished: np.ndarray, lead: int, nf: int,
            margin_of: MarginOf) -> np.ndarray:
    """The report's margin: of the lowest mean among configs whose read runs all finished."""
    whole = ran.any(axis=-1) & ~(ran & ~finished).any(axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.where(whole, np.nanmean(np.where(finished, y, np.nan), axis=-1), np.inf)
    low = np.min(mean.reshape(mean.shape[:lead] + (-1,)), axis=-1)
    return np.asarray(margin_of(np.where(np.isfinite(low), low, np.nan)), dtype=float)


def _contention(status: list[np.ndarray], lead: int) -> np.ndarray:
    """The configs whose every level is not shown worse (``[..., levels...]``)."""
    nf = len(status)
    out = np.ones(status[0].shape[:lead] + tuple(s.shape[-1] for s in status), dtype=bool)
    for f, s in enumerate(status):
        view = [1] * nf
        view[f] = s.shape[-1]
        keep = np.isin(s, (mcb.WITHIN, mcb.NEAR, mcb.OPEN))  # not shown worse
        out &= keep.reshape(keep.shape[:lead] + tuple(view))
    return out


@dataclass(frozen=True)
class Study:
    """Decide studies run on complete data (``simulate``).

    Attributes:
        looks: every look taken by some study of the batch.
        stopped: the look each study ended on, 1-based ``[...]``.
        runs: the runs each study used ``[...]``.
        final: the ended look's numbers per study (``Look`` fields picked at ``stopped``).
    """

    looks: list[Look]
    stopped: np.ndarray
    runs: np.ndarray
    final: Look


def simulate(y: np.ndarray, plan: Plan, margin_of: MarginOf, simple: Sequence[np.ndarray],
             seconds: np.ndarray | None = None, tolerance: float = costs.FLOOR) -> Study:
    """Every look of decide studies on potential outcomes ``y[batch..., levels..., max_seeds]``.

    A config "runs" only the seeds the rule asked for; what it did not run is never read.
    """
    nf = len(simple)
    batch = y.shape[: y.ndim - 1 - nf]
    asked = np.zeros(y.shape, dtype=bool)
    asked[..., : plan.looks[0]] = True
    setup = Setup(plan=plan, margin_of=margin_of, simple=simple, tolerance=tolerance)
    looks: list[Look] = []
    stopped = np.zeros(batch, dtype=int)
    for k in range(len(plan.looks)):
        got = look(np.where(asked, y, np.nan), asked, k, setup, seconds)
        looks.append(got)
        live = stopped == 0
        ends = live & (got.done | (k + 1 == len(plan.looks)))
        stopped = np.where(ends, k + 1, stopped)
        if (stopped > 0).all():
            break
        more = got.next & (stopped == 0).reshape(batch + (1,) * nf)
        seed = np.arange(y.shape[-1])
        asked |= more[..., None] & (seed >= plan.looks[k]) & (seed < plan.looks[k + 1])
    return Study(looks=looks, stopped=stopped, runs=_at(looks, stopped, "runs"),
                 final=final_look(looks, stopped))


def _at(looks: list[Look], stopped: np.ndarray, name: str) -> np.ndarray:
    out = np.asarray(getattr(looks[0], name)).copy()
    for lk in looks[1:]:
        v = np.asarray(getattr(lk, name))
        sel = (stopped == lk.index).reshape(stopped.shape + (1,) * (v.ndim - stopped.ndim))
        out = np.where(sel, v, out)
    return out


def final_look(looks: list[Look], stopped: np.ndarray) -> Look:
    """Each study's numbers at the look it ended on (``index``/``seeds``/``alpha``: the
    batch's last look's; read ``stopped`` for each study's)."""
    pick = {name: _at(looks, stopped, name) for name in ("margin", "pick", "shown", "settled",
                                                          "runs")}
    per_factor = {name: tuple(_at_factor(looks, stopped, name, f)
                              for f in range(len(looks[0].status)))
                  for name in ("status", "upper", "gap")}
    last = looks[-1]
    return Look(index=last.index, seeds=last.seeds, alpha=last.alpha, next=last.next,
                **pick, **per_factor)


def _at_factor(looks: list[Look], stopped: np.ndarray, name: str, f: int) -> np.ndarray:
    out = np.asarray(getattr(looks[0], name)[f]).copy()
    for lk in looks[1:]:
        out = np.where((stopped == lk.index)[..., None], getattr(lk, name)[f], out)
    return out


@dataclass(frozen=True)
class Replay:
    """The looks a decide study could take on its recorded runs (no batch axes).

    Attributes:
        looks: each look taken.
        missing: ``[levels..., seed]``: the runs the next look needs that are not recorded
            (all False when the study is done).
    """

    looks: list[Look]
    missing: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def done(self) -> bool:
        """Nothing more to run: every factor settled, or the last look taken."""
        return not self.missing.any()

    @property
    def settled(self) -> bool:
        """Every factor settled at the last look taken."""
        return bool(self.looks) and bool(self.looks[-1].done)


def replay(loss: np.ndarray, ran: np.ndarray, plan: Plan, margin_of: MarginOf,
           simple: Sequence[np.ndarray], seconds: np.ndarray | None = None,
           tolerance: float = costs.FLOOR) -> Replay:
    """Every look the recorded runs allow, and the runs the next one needs.

    Args:
        loss: best validation loss per run ``[levels..., seed index]`` (NaN: not recorded or
            not finished); seeds beyond ``plan.max_seeds`` are never read.
        ran: like ``loss``: which runs were recorded.
        plan, margin_of, simple, tolerance: as ``Setup``.
        seconds: as ``look``.
    """
    levels = tuple(loss.shape[:-1])
    width = max(plan.max_seeds, loss.shape[-1])
    pad = ((0, 0),) * len(levels) + ((0, width - loss.shape[-1]),)
    loss = np.pad(np.asarray(loss, dtype=float), pad, constant_values=np.nan)
    ran = np.pad(np.asarray(ran, dtype=bool), pad, constant_values=False)
    if seconds is not None:
        seconds = np.pad(np.asarray(seconds, dtype=float), pad, constant_values=np.nan)
    setup = Setup(plan=plan, margin_of=margin_of, simple=simple, tolerance=tolerance)
    need = np.ones(levels, dtype=bool)
    seed = np.arange(width)
    looks: list[Look] = []
    for k, n in enumerate(plan.looks):
        start = plan.looks[k - 1] if k else 0
        window = need[..., None] & (seed >= start) & (seed < n)
        if not ran[window].all():
            return Replay(looks=looks, missing=window & ~ran)
        got = look(loss, ran, k, setup, seconds)
        looks.append(got)
        need = got.next
        if not need.any():
            break
    return Replay(looks=looks, missing=np.zeros(levels + (width,), dtype=bool))
