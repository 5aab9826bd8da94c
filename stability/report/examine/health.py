"""A stability verdict per config (stable / marginal / unstable, with the reason) from telemetry.

Everything is read from what the runs already log: each run's ``steps.csv`` (loss, skipped,
scaler_scale, clipped per optimizer step) and its outcome (a monitor abort is ``diverged``).
A run is judged on seven signs (the seventh only for a trainer's run: its LR scheduler
advanced on skipped steps, the ``scheduler_stepped`` column, Lightning #5558); a config takes
the worst verdict of its seeds and lists every sign that fired with how many seeds showed it.
Thresholds live in ``conf/report.yaml`` (``verdict:``), each with the reason for its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import pandas as pd

from stability.core.steplog import COLUMN
from stability.report.decide.table import ConfigTable, StabilityVerdict
from stability.report.options import Thresholds
from stability.tracking.contract import SCHEDULER_STEPPED, SCHEDULER_STEPS_ON_SKIP, Outcome


class Verdict(IntEnum):
    """Ordered so that the worst verdict of a config's seeds is the ``max``."""

    STABLE = 0
    MARGINAL = 1
    UNSTABLE = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Sign:
    """One thing a run did that makes it less than stable."""

    kind: str  # "diverged", "skips", "scale collapse", "backoffs", "spikes", "z-spikes",
    # "clip saturation", "scheduler on skip"
    severity: Verdict
    value: float  # the measured rate or count (for the worst-seed wording)


@dataclass(frozen=True)
class ConfigHealth:
    """The verdict of one config and why."""

    verdict: Verdict
    reason: str  # "" when stable
    seeds_judged: int
    signs: dict[str, list[Sign]] = field(default_factory=dict)


def loss_spikes(loss: pd.Series, t: Thresholds) -> int:
    """Steps whose loss exceeds ``spike_factor`` x the median of the previous ``spike_window``.

    Megatron-LM's check compares with a running history the same way (it uses 10x). Non-finite
    losses are skipped steps, counted by the skip rate, not here.
    """
    finite = pd.to_numeric(loss, errors="coerce").where(lambda s: np.isfinite(s))
    median = finite.rolling(t.spike_window, min_periods=t.spike_min_history).median().shift(1)
    return int(((finite > t.spike_factor * median) & (median > 0)).sum())


def loss_zspikes(loss: pd.Series, t: Thresholds) -> int:
    """Steps whose loss is more than ``zspike_threshold`` standard deviations above the mean
    of the previous ``zspike_window`` finite losses (their z-score).

    OLMo-core's ``StabilityMonitorCallback`` flags spikes this way (128 steps, 6 std). It
    complements the 10x-median check: a loss whose noise is small spikes at far less than 10x.
    A spike found is left out of the windows after it (up to three passes): otherwise one spike
    inflates the next 128 steps' std and hides the spikes that follow it, exactly when they
    recur.
    """
    finite = pd.to_numeric(loss, errors="coerce").where(lambda s: np.isfinite(s))
    spikes = pd.Series(False, index=finite.index)
    for _ in range(3):
        base = finite.where(~spikes)
        roll = base.rolling(t.zspike_window, min_periods=t.zspike_min_history)
        mean, std = roll.mean().shift(1), roll.std().shift(1)
        found = (finite - mean > t.zspike_threshold * std) & (std > 0)
        if not (found & ~spikes).any():
            break
        spikes |= found
    return int(spikes.sum())


def scheduler_steps_on_skip(steps: pd.DataFrame | None, summary: pd.Series) -> int:
    """Skipped steps on which a trainer advanced its LR scheduler (0 for our loop's runs,
    whose ``steps.csv`` has no ``scheduler_stepped``: it never steps on a skipped step)."""
    if steps is not None and SCHEDULER_STEPPED in steps.columns:
        both = (pd.to_numeric(steps[COLUMN.skipped], errors="coerce") == 1) & (
            pd.to_numeric(steps[SCHEDULER_STEPPED], errors="coerce") == 1)
        return int(both.sum())
    value = pd.to_numeric(summary.get(SCHEDULER_STEPS_ON_SKIP, math.nan), errors="coerce")
    return int(value) if pd.notna(value) else 0


def _unexplained_skips(steps: pd.DataFrame, scale: np.ndarray, scaled: bool) -> np.ndarray:
    """Skipped steps that are not a dynamic loss scaler at work (booleans per step).

    A GradScaler keeps its scale as high as the gradients allow: it grows after every
    ``growth_interval`` clean steps and an overflow then skips one step and halves it. Each such
    skip is matched by a halving of the next step's scale, and their count is exactly the
    growths plus the net descent from the initial scale, so a skip count alone says nothing a
    collapsing scale does not (the ``scale collapse`` and ``backoffs`` signs judge that). What
    remains is a symptom: a skip without a scaler (bf16, fp32), a non-finite loss (the forward
    pass overflowed: ``skip_reason`` ``nonfinite_loss``), or a skip the scale did not answer.
    """
    skipped = steps[COLUMN.skipped].astype(float).to_numpy() == 1
    if not scaled:
        return skipped
    reason = steps.get(COLUMN.skip_reason, pd.Series("", index=steps.index)).astype(str).to_numpy()
    halved = np.zeros(len(scale), dtype=bool)
    halved[:-1] = scale[1:] < scale[:-1]
    halved[-1] = True  # the last step's update is not in the table: its skip is given the benefit
    return skipped & ~(halved & (reason != "nonfinite_loss"))


def run_signs(steps: pd.DataFrame | None, outcome: str, clip_enabled: bool,
              summary: pd.Series, t: Thresholds) -> list[Sign]:
    """The signs one run shows, from its steps table (or its summary metrics if it has none)."""
    signs: list[Sign] = []
    if outcome == Outcome.DIVERGED:
        signs.append(Sign("diverged", Verdict.UNSTABLE, 1.0))
    if steps is not None and len(steps):
        scale = pd.to_numeric(steps[COLUMN.scaler_scale], errors="coerce").to_numpy(dtype=float)
        # GradScaler starts at 2^16 on purpose and halves (skipping the step) until the scale
        # fits: those first steps are the scaler working, not instability.
        scaled = bool(np.isfinite(scale).all() and scale.max() > 1.0)
        settle = min(t.settle_steps, len(steps) // 2) if scaled else 0
        skip_rate = float(_unexplained_skips(steps, scale, scaled)[settle:].mean())
        clip_rate = float(steps[COLUMN.clipped].astype(float).mean())
        spikes = loss_spikes(steps[COLUMN.loss], t)
        zspikes = loss_zspikes(steps[COLUMN.loss], t)
        scale = scale[settle:]
    else:  # no steps.csv: what the summary says (backoffs and spikes cannot be judged)
        n = float(summary.get("optimizer_steps", math.nan))  # (settling cannot be told apart)
        skip_rate = float(summary.get("skip_count", math.nan)) / n if n else math.nan
        clip_rate = float(summary.get("clip_fraction", math.nan))
        scale, spikes, zspikes = np.array([]), 0, 0
    if skip_rate > t.skip_rate_unstable:
        signs.append(Sign("skips", Verdict.UNSTABLE, skip_rate))
    elif skip_rate > t.skip_rate_marginal:
        signs.append(Sign("skips", Verdict.MARGINAL, skip_rate))
    if len(scale) > 1 and np.isfinite(scale).all() and np.ptp(scale) > 0:
        backoff_rate = float((np.diff(scale) < 0).sum()) / len(scale)
        net = math.log2(scale.max() / scale[-1])  # halvings never won back by the end
        if scale.min() <= t.scale_floor or net >= t.net_backoffs_unstable:
            signs.append(Sign("scale collapse", Verdict.UNSTABLE, float(scale.min())))
        elif backoff_rate > t.backoff_rate_marginal:
            signs.append(Sign("backoffs", Verdict.MARGINAL, backoff_rate))
    if spikes:
        signs.append(Sign("spikes", Verdict.UNSTABLE if spikes >= t.spikes_unstable
                          else Verdict.MARGINAL, float(spikes)))
    # One or two 6-sigma steps are the ordinary tail of a small batch's loss (a batch of 64 that
    # drew a few hard examples): only spikes that recur are a sign (docs/report.md).
    if zspikes >= t.zspikes_marginal:
        signs.append(Sign("z-spikes", Verdict.UNSTABLE if zspikes >= t.zspikes_unstable
                          else Verdict.MARGINAL, float(zspikes)))
    if clip_enabled and clip_rate >= t.clip_saturation:
        signs.append(Sign("clip saturation", Verdict.MARGINAL, clip_rate))
    # The schedule ran ahead of the updates: every such step shortened the run's schedule.
    sched = scheduler_steps_on_skip(steps, summary)
    if sched:
        signs.append(Sign("scheduler on skip", Verdict.MARGINAL, float(sched)))
    return signs


def _wording(kind: str, signs: list[Sign], t: Thresholds) -> str:
    worst = max(s.value for s in signs)
    return {
        "diverged": "diverged (the skip-rate monitor aborted the run)",
        "skips": f"skipped up to {worst:.1%} of steps",
        "scale collapse": f"fp16 loss scale collapsed (down to {min(s.value for s in signs):g}, "
                          f"floor {t.scale_floor:g}, or {t.net_backoffs_unstable}+ halvings not "
                          "won back)",
        "backoffs": f"scale backoffs in up to {worst:.0%} of steps",
        "spikes": f"up to {int(worst)} loss spike(s) above {t.spike_factor:g}x the running median",
        "z-spikes": f"up to {int(worst)} loss spike(s) more than {t.zspike_threshold:g} std above "
                    f"the mean of the previous {t.zspike_window} steps",
        "clip saturation": f"clipped {worst:.0%} of steps (max_norm below the typical norm)",
        "scheduler on skip": f"scheduler advanced on up to {int(worst)} skipped step(s) "
                             "(the trainer steps its LR schedule on steps it skipped)",
    }[kind]


def judge_config(runs: pd.DataFrame, steps: dict[str, pd.DataFrame], clip_enabled: bool,
                 t: Thresholds) -> ConfigHealth:
    """Worst verdict over the seeds of one config; failed or killed seeds are not judged."""
    judged = runs[runs["outcome"].isin([Outcome.FINISHED, Outcome.DIVERGED])]
    by_kind: dict[str, list[Sign]] = {}
    worst = Verdict.STABLE
    for _, row in judged.iterrows():
        for sign in run_signs(steps.get(row["run_id"]), row["outcome"], clip_enabled, row, t):
            by_kind.setdefault(sign.kind, []).append(sign)
            worst = max(worst, sign.severity)
    n = len(judged)
    parts = [f"{_wording(k, s, t)} ({len(s)}/{n} seeds)" for k, s in
             sorted(by_kind.items(), key=lambda kv: -max(x.severity for x in kv[1]))]
    return ConfigHealth(worst, "; ".join(parts), n, by_kind)


def verdicts(runs: pd.DataFrame, configs: pd.DataFrame, steps: dict[str, pd.DataFrame],
             t: Thresholds) -> tuple[StabilityVerdict, ...]:
    """Each config's verdict (stable / marginal / unstable) and reason, in ``configs``' order."""
    out = []
    for fp, clip in zip(configs["fingerprint"], configs["clip_enabled"], strict=True):
        h = judge_config(runs[runs["fingerprint"] == fp], steps, bool(clip), t)
        out.append(StabilityVerdict(str(h.verdict), h.reason) if h.seeds_judged
                   else StabilityVerdict("not judged", "no seed finished or diverged"))
    return tuple(out)


def judge(runs: pd.DataFrame, configs: pd.DataFrame, steps: dict[str, pd.DataFrame],
          t: Thresholds) -> pd.DataFrame:
    """``configs`` plus ``stability`` and ``stability_reason`` (``verdicts``) as columns."""
    found = verdicts(runs, configs, steps, t)
    return configs.assign(stability=[v.stability for v in found],
                          stability_reason=[v.stability_reason for v in found])


def summary_sentence(configs: ConfigTable, named: int = 5) -> str:
    """"The chosen config is stable; 2 fp16 configs are marginal: `a` (clipped 95% of steps), ...".

    Each config is named with its own reason (configs sharing one are listed together, at most
    ``named`` labels per reason, then a count), so no config is given a reason of another's.
    """
    w = configs.winner
    text = f"the chosen config is {w.stability}" + (f" ({w.stability_reason})"
                                                    if w.stability_reason else "")
    groups = []
    for verdict in ("unstable", "marginal"):
        by_precision: dict[str, dict[str, list[str]]] = {}
        for r in configs.others:
            if r.stability == verdict:
                reason = r.stability_reason.split(" (")[0]
                by_precision.setdefault(r.precision, {}).setdefault(reason, []).append(r.label)
        for precision, reasons in by_precision.items():
            n = sum(len(labels) for labels in reasons.values())
            parts = []
            for reason, labels in sorted(reasons.items()):
                shown = ", ".join(f"`{label}`" for label in labels[:named])
                more = f" and {len(labels) - named} more" if len(labels) > named else ""
                parts.append(f"{shown}{more} ({reason})")
            groups.append(f"{n} {precision} config{'s are' if n > 1 else ' is'} "
                          f"{verdict}: {', '.join(parts)}")
    stable = sum(r.stability == "stable" for r in configs.others)
    others = len(configs) - 1
    tail = (f"{'; '.join(groups)}; {stable} of {others} others stable" if groups
            else f"so {'is the other config' if others == 1 else f'are the other {others} configs'}"
            if others else "it is the only config")
    return f"{text[0].upper()}{text[1:]}; {tail}."
