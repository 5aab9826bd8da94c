"""Stability in the decision (issue 59, item 2): a marginal or unstable choice gives way to a
stable twin that passes the validation step, and the answer names both; with none, it stays
and says why."""

from __future__ import annotations

import numpy as np
import pandas as pd

from stability.design import factors as vocabulary
from stability.report.decide import factors, winner
from stability.report.decide.select import aggregate
from stability.report.decide.steady import prefer_stable, sentence
from stability.report.decide.table import StabilityVerdict
from stability.report.present import answer_table
from stability.report.present.reasons import first_levels, why

STABLE = StabilityVerdict("stable", "")
SPIKY = StabilityVerdict("marginal", "up to 5 loss spike(s) (1/5 seeds)")


def study(effects: dict[str, float], seeds: int = 5) -> pd.DataFrame:
    """Clip off / max_norm 5 / max_norm 10 x fp32 / fp16, equal cost, planted loss effects."""
    rng = np.random.default_rng(3)
    rows = []
    for clip in (None, 5.0, 10.0):
        for precision in ("fp32", "fp16"):
            fp = f"{precision}-{clip}"
            for s in range(seeds):
                rows.append({"run_id": f"{fp}-{s}", "fingerprint": fp, "seed": s,
                             "outcome": "finished",
                             "best_val_loss": 0.10 + effects.get(fp, 0.0) + rng.normal(0, 1e-4),
                             "precision.name": precision, "clip.enabled": clip is not None,
                             "clip.method": "norm", "clip.max_norm": clip or 1.0,
                             "train.accum_steps": 1, "wall_time_s": 99.0,
                             "step_time_median_s": 0.01, "optimizer_steps": 100,
                             "peak_memory_mb": 300.0})
    return pd.DataFrame(rows)


def decided(runs: pd.DataFrame, margin: float = 0.005):
    configs = aggregate(runs)
    an = factors.analyse(runs, configs, margin)
    return configs, an, winner.decide(runs, configs, an, winner.Settings(margin=margin))


def test_a_marginal_choice_gives_way_to_its_stable_twin_and_the_answer_names_both() -> None:
    runs = study({"fp16-None": 0.05, "fp16-5.0": 0.05, "fp16-10.0": 0.05})
    configs, an, dec = decided(runs)
    assert dec.fingerprint == "fp32-None"  # validation, cost, simplicity: clip off, fp32
    verdicts = {fp: STABLE for fp in configs["fingerprint"]} | {"fp32-None": SPIKY}
    new, steadied = prefer_stable(runs, configs, dec, verdicts)
    assert steadied is not None and steadied.swapped
    assert new.fingerprint == "fp32-5.0"  # the next in the rule's order (simplicity), stable
    assert steadied.first_fingerprint == "fp32-None" and steadied.verdict == SPIKY
    line = sentence(steadied, "+0.0000")
    assert "`fp32 noclip acc=1`, is marginal (up to 5 loss spike(s)" in line
    assert "`fp32 clip=5 acc=1`, the next config in the rule's order, is stable" in line
    clip = next(c for c in new.choices if c.factors == (vocabulary.CLIP,))
    k = new.choices.index(clip)
    first = first_levels(new, steadied)[k]
    assert clip.levels[first] == ("off",) and clip.levels[clip.chosen] == ("max_norm 5",)
    assert why(new, clip, clip.chosen, first, steadied).startswith("stability: the first choice")
    assert why(new, clip, first, first, steadied).startswith("stability: its config")
    rows = answer_table.rows(new, an, None, steadied)
    assert any(r[1] == "→ max_norm 5" and r[-1].startswith("stability") for r in rows)


def test_without_a_stable_twin_that_passes_validation_the_choice_stays_and_says_so() -> None:
    runs = study({"fp16-None": 0.05, "fp16-5.0": 0.05, "fp16-10.0": 0.05})
    configs, _, dec = decided(runs)
    # every fp32 config marginal; the stable fp16 ones are 0.05 worse: past the margin
    verdicts = {fp: (SPIKY if fp.startswith("fp32") else STABLE) for fp in configs["fingerprint"]}
    new, steadied = prefer_stable(runs, configs, dec, verdicts)
    assert new is dec and steadied is not None and not steadied.swapped
    assert sentence(steadied).startswith("Stability did not decide: the chosen config is "
                                         "marginal (up to 5 loss spike(s)")


def test_a_stable_choice_is_left_alone() -> None:
    runs = study({})
    configs, _, dec = decided(runs)
    new, steadied = prefer_stable(runs, configs, dec,
                                  {fp: STABLE for fp in configs["fingerprint"]})
    assert new is dec and steadied is None and sentence(steadied) == ""
