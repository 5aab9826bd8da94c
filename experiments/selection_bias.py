"""How much "best validation loss" flatters each config: its checkpoint on fresh data.

A run's best validation loss is the minimum over its epochs: the checkpoint kept is the one the
validation split liked best, so the number is biased low by its own selection, and more for a
config whose validation loss jumps more between epochs. Whether that bias is fair across configs
is measurable on a task whose data can be drawn afresh: each run's kept checkpoint
(``checkpoints/best.pt``) is evaluated on a new validation split from another data seed (the
same distribution, never seen in training or selection), and ``optimism = fresh loss - own
validation loss`` (> 0: the kept checkpoint flattered) is compared across the levels of each
factor.

    python experiments/selection_bias.py MULTIRUN_DIR [--data-seed 4242]

reads every job folder of a finished sweep of the default task (``config.yaml``,
``checkpoints/best.pt``) and prints the mean optimism per level of each factor with its
seed-blocked 95% interval (docs/report.md, "The selection metric"). The sealed test split is
not read.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd
import torch
import yaml
from scipy import stats

from stability.core.batches import EvalSettings, evaluate_task, task_of
from stability.core.config import to_run_config


def losses(job: Path, data_seed: int) -> dict[str, object] | None:
    """One job's kept checkpoint on its own validation split and on one drawn afresh."""
    best = job / "checkpoints" / "best.pt"
    if not best.exists():
        return None
    raw = yaml.safe_load((job / "config.yaml").read_text())
    cfg = to_run_config(raw)
    state = torch.load(best, map_location="cpu", weights_only=True)
    out: dict[str, object] = {
        "clip": f"max_norm {cfg.clip.max_norm:g}" if cfg.clip.enabled else "off",
        "accum": cfg.train.accum_steps, "precision": cfg.precision.name, "seed": cfg.seed}
    for name, seed in (("own", raw["data"]["seed"]), ("fresh", data_seed)):
        raw["data"]["seed"] = seed
        run = to_run_config(raw)
        task = task_of(run)
        model = task.model()
        model.load_state_dict(state)
        _, val = task.train_val()
        out[name] = evaluate_task(task, model, val, EvalSettings.of(run, "cpu"))["loss"]
    return out


def by_level(frame: pd.DataFrame, factor: str) -> pd.DataFrame:
    """Mean optimism per level and its difference from the first level, seeds as blocks."""
    rows = []
    ref = frame[factor].iloc[0] if factor != "clip" else "off"
    levels = sorted(frame[factor].unique(), key=lambda v: (v != ref, str(v)))
    per_seed = frame.groupby([factor, "seed"])["optimism"].mean().unstack("seed")
    for lv in levels:
        d = per_seed.loc[lv] - per_seed.loc[levels[0]]
        n = int(d.notna().sum())
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n) if n > 1 else math.nan
        rows.append({"factor": factor, "level": lv,
                     "optimism": frame.loc[frame[factor] == lv, "optimism"].mean(),
                     "vs first": d.mean(), "95% half-width": half})
    return pd.DataFrame(rows)


def main() -> None:
    """Print the optimism of every factor level."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("multirun", type=Path, help="a sweep's folder (multirun/<date>/<time>)")
    parser.add_argument("--data-seed", type=int, default=4242)
    args = parser.parse_args()
    rows = [r for job in sorted(p for p in args.multirun.iterdir() if p.is_dir())
            for r in [losses(job, args.data_seed)] if r is not None]
    frame = pd.DataFrame(rows)
    frame["optimism"] = frame["fresh"] - frame["own"]  # > 0: the kept checkpoint flattered
    print(f"{len(frame)} runs; mean optimism {frame['optimism'].mean():+.4f} "
          f"(SD {frame['optimism'].std():.4f})")
    with pd.option_context("display.float_format", "{:+.4f}".format, "display.width", 120):
        for factor in ("clip", "accum", "precision"):
            print(by_level(frame, factor).to_string(index=False))


if __name__ == "__main__":
    main()
