"""Adaptive seeds: the factor verdicts re-decided after every round, error held across the looks.

A study runs in rounds ("looks"). Every config gets ``n0`` seeds; after each round the
main-effect verdicts (``effects``: helps / hurts / equivalent / undecided, seeds as blocks) are
recomputed, and the next round adds ``step`` seeds only to the configs an **undecided** contrast
still needs, up to ``max_seeds``. A level decided **hurts** leaves the study as a whole (all
accum 8 cells at once): later looks average every contrast over the levels still in play.

Error control across looks and contrasts:

- **Across looks: alpha spending with a union bound.** Look ``k`` (``n_k`` seeds, information
  fraction ``t_k = n_k / max_seeds``) may spend ``alpha * (t_k**rho - t_{k-1}**rho)``. Whatever
  the dependence between looks, and however the decision to go on depends on earlier data, a
  contrast's chance of a false decision at *some* look is at most the sum, ``alpha``: the event
  "decided falsely at look k" is contained in "the test on the first ``n_k`` seeds rejects", which
  has probability at most look k's share. No boundary needs the looks' correlation, so unequal
  rounds, runs that fail and a resumed study change nothing.
- **Across contrasts: Holm within each look, with what earlier looks rejected set aside.** A
  contrast decided earlier leaves the family; the others face Holm at the look's share. This is
  the graphical procedure of Maurer & Bretz (2013, "Multiple testing in group sequential trials
  using graphical approaches", Stat Biopharm Res 5:311) with Holm's graph, tested at the current
  look only (not re-testing past looks with the recycled level, which is conservative).
- **Two families, as in the fixed study:** the difference tests (helps / hurts) and the
  equivalence tests (TOST against the margin) each hold ``alpha``. A contrast that stops for
  any reason still counts in the other family's size until that family rejects it.

Everything is vectorised over leading batch axes: the simulation in
``tests/stats/test_sequential.py`` runs this very rule on thousands of synthetic studies, and the
sweep's adaptive strategy runs it on one study (a batch of one). The next round is a pure
function of the recorded results: replaying the looks on the same data plans the same runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from stability.stats import effects as fx

#: Verdict codes of the vectorised state (``VERDICTS[code]`` is the word).
VERDICTS = (fx.UNDECIDED, fx.HELPS, fx.HURTS, fx.EQUIVALENT)
UNDECIDED, HELPS, HURTS, EQUIVALENT = range(4)


@dataclass(frozen=True)
class Plan:
    """The rounds of an adaptive study and the error each look may spend.

    Attributes:
        n0: seeds every config gets in the first round. Three is the fewest that leave the
            per-seed t-test two degrees of freedom; with two (one df) the t quantile at a
            look's share of alpha over eight contrasts is in the hundreds, so the first look
            could decide nothing.
        step: seeds added per round to the configs still needed.
        max_seeds: the most seeds any config gets (the last look).
        alpha: family-wise error of each family (differences, equivalence) over all looks.
        rho: the spending function's exponent, ``alpha * t**rho`` (Kim & DeMets' power family):
            1 spends in proportion to seeds, 3 resembles O'Brien-Fleming (almost everything
            kept for the last look).
        power: futility: an undecided contrast stops getting seeds when, were its estimate the
            truth, even ``max_seeds`` would decide it with less than this power (0.8, the
            report's default). Stopping for futility never adds a false decision: it only
            gives up chances to reject.
    """

    n0: int = 3
    step: int = 2
    max_seeds: int = 9
    alpha: float = 0.05
    rho: float = 1.0
    power: float = 0.8

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.n0, int) and self.n0 >= 2):
            problems.append(f"n0={self.n0!r}: allowed values are an integer >= 2")
        if not (isinstance(self.step, int) and self.step >= 1):
            problems.append(f"step={self.step!r}: allowed values are an integer >= 1")
        if not (isinstance(self.max_seeds, int) and self.max_seeds >= self.n0):
            problems.append(f"max_seeds={self.max_seeds!r}: allowed values are an integer >= n0")
        if not 0 < self.alpha < 1:
            problems.append(f"alpha={self.alpha!r}: allowed values are 0 < alpha < 1")
        if not self.rho > 0:
            problems.append(f"rho={self.rho!r}: allowed values are > 0")
        if not 0 < self.power < 1:
            problems.append(f"power={self.power!r}: allowed values are 0 < power < 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def looks(self) -> tuple[int, ...]:
        """Seeds per needed config at each look: ``n0, n0 + step, ..., max_seeds``."""
        seeds = list(range(self.n0, self.max_seeds + 1, self.step))
        if seeds[-1] != self.max_seeds:
            seeds.append(self.max_seeds)
        return tuple(seeds)

    @property
    def spend(self) -> np.ndarray:
        """The share of ``alpha`` each look may spend (sums to ``alpha``)."""
        t = np.asarray(self.looks, dtype=float) / self.max_seeds
        return np.diff(np.concatenate([[0.0], self.alpha * t**self.rho]))


@dataclass(frozen=True)
class State:
    """Where an adaptive study stands after a look (arrays with the batch's leading shape).

    Attributes:
        verdict: per main-effect contrast, a code of ``VERDICTS`` (factor by factor, each level
            against level 0: the order of ``effects.study_verdicts``).
        decided_at: the look (1-based) that decided each contrast; 0 while undecided.
        mean: each contrast's latest estimate (over the levels in play at its last look).
        se: its standard error (``seeds - 1`` degrees of freedom at that look).
        futile: per contrast, undecided and given up (``Plan.power``): it gets no more seeds.
        alive: per factor, which levels are still in play (level 0 always is).
        needed: per config (the factor axes), whether the next round gives it seeds.
        looks: looks taken so far.
    """

    verdict: np.ndarray
    decided_at: np.ndarray
    mean: np.ndarray
    se: np.ndarray
    futile: np.ndarray
    alive: tuple[np.ndarray, ...]
    needed: np.ndarray
    looks: int

    @property
    def done(self) -> np.ndarray:
        """Whether every contrast is decided or given up (per study)."""
        return np.all((self.verdict != UNDECIDED) | self.futile, axis=-1)


def contrasts(levels: tuple[int, ...]) -> list[tuple[int, int]]:
    """The main-effect contrasts ``(factor, level)`` of a grid, each level against level 0."""
    return [(i, a) for i, n in enumerate(levels) for a in range(1, n)]


def start(batch: tuple[int, ...], levels: tuple[int, ...]) -> State:
    """The state before the first look: nothing decided, every config needed."""
    m = len(contrasts(levels))
    return State(
        verdict=np.zeros(batch + (m,), dtype=int),
        decided_at=np.zeros(batch + (m,), dtype=int),
        mean=np.full(batch + (m,), np.nan),
        se=np.full(batch + (m,), np.nan),
        futile=np.zeros(batch + (m,), dtype=bool),
        alive=tuple(np.ones(batch + (n,), dtype=bool) for n in levels),
        needed=np.ones(batch + tuple(levels), dtype=bool),
        looks=0,
    )


def look(y: np.ndarray, state: State, plan: Plan, margin: float | np.ndarray,
         unfinished: np.ndarray | None = None) -> State:
    """Take the next look at ``y`` and decide what it can.

    Args:
        y: best validation loss per run, ``[batch..., level_1, ..., level_k, seed]``, holding
            at least this look's ``n_k`` seeds for every config the previous state needed (other
            entries are never read; NaN is fine there). Unfinished runs must already stand at
            a finite value (the report counts them at the study's worst finished loss).
        state: the state after the previous look (``start`` before the first).
        plan: the rounds and the error spending.
        margin: the equivalence margin (per study, or one for all).
        unfinished: optional, like ``y``: which runs did not finish. As in the report, a
            contrast that reads an unfinished run is never called equivalent (its loss is only
            a floor).

    Returns:
        The new state: verdicts, levels still in play, and the configs the next round needs
        (none after the last look).
    """
    levels = state.needed.shape[-len(state.alive):]
    k = len(levels)
    lead = y.ndim - 1 - k
    kth = state.looks  # 0-based index of this look
    if kth >= len(plan.looks):
        raise ValueError(f"the plan has {len(plan.looks)} looks; all were taken")
    n = plan.looks[kth]
    share = plan.spend[kth]
    margin = np.asarray(margin, dtype=float)
    y = y[..., :n]
    pairs = contrasts(levels)
    open_ = (state.verdict == UNDECIDED) & ~state.futile
    mean, se, sd, p_diff, p_equiv = (np.full(state.verdict.shape, np.nan) for _ in range(5))
    for j, (i, a) in enumerate(pairs):
        d, w = _paired(y, state.alive, lead, i, a)
        est = _estimate(d, w)
        mean[..., j] = est.mean
        se[..., j] = est.se
        sd[..., j] = est.sd_seed
        p_diff[..., j] = fx.p_two_sided(est)
        p_equiv[..., j] = fx.p_equivalent(est, margin)
        if unfinished is not None:
            u, _ = _paired(unfinished[..., :n].astype(float), state.alive, lead, i, a, both=True)
            p_equiv[..., j] = np.where((u.sum(axis=-1) * w).sum(axis=-1) > 0, 1.0,
                                       p_equiv[..., j])
    # Holm at the look's share. A family sets aside only what *it* rejected (Maurer & Bretz):
    # a contrast decided by the other family, or given up, stays in with p = 1, so no level
    # is recycled from a hypothesis that was never rejected.
    diff_out = (state.verdict == HELPS) | (state.verdict == HURTS)
    equiv_out = state.verdict == EQUIVALENT
    p_diff = np.where(diff_out, np.nan, np.where(open_, p_diff, 1.0))
    p_equiv = np.where(equiv_out, np.nan, np.where(open_, p_equiv, 1.0))
    diff_holm, equiv_holm = fx.holm(p_diff), fx.holm(p_equiv)
    words = fx.decide(mean, diff_holm, equiv_holm, share)
    code = np.select([words == fx.HELPS, words == fx.HURTS, words == fx.EQUIVALENT],
                     [HELPS, HURTS, EQUIVALENT], UNDECIDED)
    verdict = np.where(open_, code, state.verdict)
    decided_at = np.where(open_ & (code != UNDECIDED), kth + 1, state.decided_at)
    mean = np.where(open_, mean, state.mean)
    se = np.where(open_, se, state.se)
    still = open_ & (verdict == UNDECIDED)
    futile = state.futile | (still & (_seeds_to_decide(mean, sd, margin, plan, still)
                                      > plan.max_seeds))
    alive = _alive(state.alive, verdict, pairs)
    last = kth + 1 == len(plan.looks)
    needed = (np.zeros_like(state.needed) if last
              else _needed(alive, (verdict == UNDECIDED) & ~futile, pairs, lead))
    return State(verdict, decided_at, mean, se, futile, alive, needed, kth + 1)


def _seeds_to_decide(mean: np.ndarray, sd: np.ndarray, margin: np.ndarray, plan: Plan,
                     still: np.ndarray) -> np.ndarray:
    """Seeds at which each contrast would be decided with ``plan.power`` were ``mean`` true.

    The fewer of what the difference test and (inside the margin) TOST need, at the last look's
    share over the contrasts still open (Holm's first step), by the normal approximation
    ``n = ((z_a + z_power) sd / distance)^2``. Normal quantiles are smaller than the t's the
    looks use, so this errs towards seeding on, never towards giving up early.
    """
    m = np.maximum(still.sum(axis=-1, keepdims=True), 1)
    level = plan.spend[-1] / m
    # The difference test is two-sided; each of TOST's two tests is one-sided at the level.
    z_diff = stats.norm.isf(level / 2) + stats.norm.ppf(plan.power)
    z_equiv = stats.norm.isf(level) + stats.norm.ppf(plan.power)
    gap = (margin[..., None] if np.ndim(margin) else margin) - np.abs(mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_diff = (z_diff * sd / np.abs(mean)) ** 2
        n_equiv = np.where(gap > 0, (z_equiv * sd / gap) ** 2, np.inf)
    return np.nan_to_num(np.minimum(n_diff, n_equiv), nan=np.inf)


def run(y: np.ndarray, plan: Plan, margin: float | np.ndarray,
        levels: tuple[int, ...]) -> tuple[State, np.ndarray]:
    """Every look of adaptive studies on complete data ``y[batch..., levels..., max_seeds]``.

    Used by the simulation: a config only "runs" the seeds the rule asked for (returned), and
    what it did not run is never read into a decision.

    Returns:
        The final state, and the seeds each config got ``[batch..., levels...]``.
    """
    batch = y.shape[: y.ndim - 1 - len(levels)]
    state = start(batch, levels)
    seeds = np.full(batch + tuple(levels), plan.looks[0])
    for nxt in (*plan.looks[1:], None):
        state = look(y, state, plan, margin)  # a study already done changes nothing
        if nxt is None or not state.needed.any():
            break
        seeds = np.where(state.needed, nxt, seeds)
    return state, seeds


def _paired(y: np.ndarray, alive: tuple[np.ndarray, ...], lead: int, i: int,
            a: int, both: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Differences ``level a - level 0`` of factor ``i``, ``[batch..., cells, seed]``, and each
    cell's weight (1 where every other factor's level is in play); ``both``: the sum instead."""
    ax = lead + i
    d = np.take(y, a, ax) + (1 if both else -1) * np.take(y, 0, ax)
    w = np.ones(d.shape[:-1], dtype=bool)
    for f, mask in enumerate(alive):
        if f == i:
            continue
        fa = lead + (f if f < i else f - 1)
        shape = [1] * w.ndim
        shape[:lead] = mask.shape[:lead]
        shape[fa] = mask.shape[-1]
        w = w & mask.reshape(shape)
    cells = d.shape[lead:-1]
    return (d.reshape(d.shape[:lead] + (int(np.prod(cells)), d.shape[-1])),
            w.reshape(w.shape[:lead] + (int(np.prod(cells)),)))


def _estimate(d: np.ndarray, w: np.ndarray) -> fx.Estimate:
    """``effects.estimate`` over the cells in play only (weights 0/1 per cell)."""
    s = d.shape[-1]
    wf = w.astype(float)[..., None]
    d0 = np.where(wf > 0, d, 0.0)  # cells out of play may hold NaN (never run)
    seed_means = (d0 * wf).sum(axis=-2) / np.maximum(wf.sum(axis=-2), 1.0)
    sd = seed_means.std(axis=-1, ddof=1)
    return fx.Estimate(mean=seed_means.mean(axis=-1), se=sd / np.sqrt(s),
                       df=np.full(np.shape(sd), s - 1, dtype=float), sd_seed=sd,
                       cells=d.shape[-2], seeds=s)


def _alive(alive: tuple[np.ndarray, ...], verdict: np.ndarray,
           pairs: list[tuple[int, int]]) -> tuple[np.ndarray, ...]:
    out = [m.copy() for m in alive]
    for j, (i, a) in enumerate(pairs):
        out[i][..., a] &= verdict[..., j] != HURTS
    return tuple(out)


def _needed(alive: tuple[np.ndarray, ...], open_: np.ndarray, pairs: list[tuple[int, int]],
            lead: int) -> np.ndarray:
    """Configs in play that a contrast still open reads (its level or its reference)."""
    k = len(alive)
    levels = tuple(m.shape[-1] for m in alive)

    def on(f: int, mask: np.ndarray) -> np.ndarray:
        shape = list(mask.shape[:lead]) + [1] * k
        shape[lead + f] = levels[f]
        return mask.reshape(shape)

    in_play = np.ones(alive[0].shape[:lead] + levels, dtype=bool)
    for f, mask in enumerate(alive):
        in_play = in_play & on(f, mask)
    want = np.zeros_like(in_play)
    for j, (i, a) in enumerate(pairs):
        sel = np.zeros(alive[i].shape, dtype=bool)
        sel[..., [0, a]] = True
        undecided = open_[..., j].reshape(open_.shape[:lead] + (1,) * k)
        want = want | (on(i, sel) & undecided)
    return in_play & want
