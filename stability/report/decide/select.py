"""Per-config aggregation over seeds and the selection rule.

A config is everything but the seed (``stability.fingerprint``). A seed that did not finish
(diverged, failed, killed, still running) counts as +inf validation loss for its config, so
the mean of such a config is +inf: a config cannot win by losing its bad seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from stability.core.cost import RUN_COST_METRICS
from stability.core.identity import config_label
from stability.core.precision import Precision
from stability.design.factors import (
    ACCUM_STEPS,
    CLIP_ENABLED,
    CLIP_METHOD,
    MAX_NORM,
    PRECISION,
    PRECISION_NAME,
    TIE_BREAK,
    Params,
    kind,
    label_keys,
    tie_break,
)
from stability.stats.paired import mean_ci

TIE_DECIMALS = 10  # means equal to 1e-10 are a tie (summation order changes the last bits)
SIMPLER = ", ".join(k.simpler for k in TIE_BREAK)  # the simplicity order, in words
# What decides the config to train with ("chosen"), in order; the ranking ("lowest mean") is
# descriptive. One text: report.md's "Selection rule", the report run's tag, the model version.
DECISION_RULE = (
    "chosen = decided factor by factor from every run, seeds as blocks, in this order: "
    "(1) validation: the levels within the margin of the factor's best in best_val_loss "
    "(shown by multiple comparisons with the best; where none is shown, those within it of "
    "every other level one comparison at a time; where none is, the lowest estimate); (2) "
    "cost: the cheapest of them in training time on the measured device (a difference not "
    "shown beyond the run-to-run spread and report.cost_tolerance counts as none); (3) "
    "simplicity: then the "
    f"simplest ({SIMPLER}); (4) stability: a config judged marginal or unstable gives way to "
    "the next config in this order that is stable and fully finished and whose levels all "
    "pass (1), named in the answer (none: it stays, and the answer says so); a config with an "
    "unfinished seed is never chosen. The sealed test plays no part"
)
RANKING_RULE = (
    "lowest mean (rank 1) = lowest mean best_val_loss over seeds (validation split only); a "
    "seed that did not finish (diverged, failed, killed) counts as +inf, so a config cannot "
    "rank first by losing seeds; ties (means equal to 1e-10): fewer unfinished seeds, then the "
    f"simpler config: {SIMPLER}; then the fingerprint, alphabetically"
)
SELECTION_RULE = f"{DECISION_RULE}. {RANKING_RULE}"
LABEL_KEYS = label_keys()  # the params a config's label names (the design's factors' keys)
IGNORED_KEYS = ("tracking.", "output_dir", "device")


def effective_loss(runs: pd.DataFrame) -> pd.Series:
    """``best_val_loss`` of finished runs; +inf for any run that did not finish (or is NaN)."""
    loss = pd.to_numeric(runs.get("best_val_loss", pd.Series(math.nan, index=runs.index)),
                         errors="coerce").astype(float)
    ok = (runs["outcome"] == "finished") & np.isfinite(loss)
    return loss.where(ok, math.inf)


def train_seconds(runs: pd.DataFrame) -> pd.Series:
    """Training seconds of each run: median step CPU time x optimizer steps, else median step
    wall time x optimizer steps, else its wall time.

    CPU time where the run measured it (CPU runs, ``core.cost``): it counts the work, not the
    load of a shared machine. The product leaves out what every config pays alike (imports,
    data, validation, a worker's cold start); runs from before the cost metrics existed fall
    back to ``wall_time_s``, and the report names them (``missing_costs``).
    """
    def col(name: str) -> pd.Series:
        return pd.to_numeric(runs[name], errors="coerce") if name in runs \
            else pd.Series(math.nan, index=runs.index)

    cpu = col("step_cpu_median_s") * col("optimizer_steps")
    steps = col("step_time_median_s") * col("optimizer_steps")
    return cpu.where(np.isfinite(cpu), steps.where(np.isfinite(steps), col("wall_time_s")))


NAMED_AT_MOST = 5  # runs named in a missing-metric line; the rest are counted


def missing_costs(runs: pd.DataFrame) -> list[str]:
    """One line per cost metric (``core.cost.RUN_COST_METRICS``) that finished runs lack,
    naming them: every loop records them, so a run without one is older or hand-tracked, and
    its training time is its ``wall_time_s`` (mostly cold start), not steps x step time."""
    done = runs[runs["outcome"] == "finished"] if "outcome" in runs else runs
    lines = []
    for name in RUN_COST_METRICS:
        values = (pd.to_numeric(done[name], errors="coerce") if name in done
                  else pd.Series(math.nan, index=done.index))
        lacking = done[~np.isfinite(values.astype(float))]
        if name == "peak_memory_mb" or lacking.empty:
            continue  # peak memory is absent where it cannot be measured (core/cost.py)
        names = (lacking["run_name"] if "run_name" in lacking else lacking["run_id"]).astype(str)
        shown = ", ".join(f"`{n}`" for n in names.iloc[:NAMED_AT_MOST])
        more = f" and {len(names) - NAMED_AT_MOST} more" if len(names) > NAMED_AT_MOST else ""
        why = (": their training time is their wall_time_s (cold start included)"
               if name == "step_time_median_s" else "")
        lines.append(f"{len(names)} finished run(s) lack `{name}`{why}: {shown}{more}")
    return lines


def base_label(row: pd.Series) -> str:
    """A readable config name, e.g. ``fp16 clip=1 acc=4``: the run name without the seed."""
    return config_label(row)


def config_labels(first: pd.DataFrame) -> pd.Series:
    """Labels for one row per config; configs sharing a label get the keys that tell them apart."""
    labels = first.apply(base_label, axis=1)
    params = [c for c in first.columns if "." in c and c not in LABEL_KEYS
              and not c.startswith(IGNORED_KEYS)]
    for _, group in first.groupby(labels):
        if len(group) < 2:
            continue
        differing = [c for c in params if group[c].astype(str).nunique() > 1]
        for i, row in group.iterrows():
            labels[i] += "".join(f" {c}={row[c]}" for c in differing)
    return labels


def _stats_columns(prefix: str, values: pd.Series, confidence: float) -> dict[str, float]:
    ci = mean_ci(values.dropna().tolist(), confidence)
    return {f"{prefix}_mean": ci.mean, f"{prefix}_std": ci.std, f"{prefix}_ci_low": ci.low,
            f"{prefix}_ci_high": ci.high}


def _mean_std(prefix: str, values: pd.Series | None) -> dict[str, float]:
    v = pd.to_numeric(values, errors="coerce").dropna() if values is not None else pd.Series()
    return {f"{prefix}_mean": float(v.mean()) if len(v) else math.nan,
            f"{prefix}_std": float(v.std(ddof=1)) if len(v) > 1 else math.nan}


def aggregate(runs: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """One row per config, ranked by the selection rule (row 0 is the winner).

    Args:
        runs: one row per training run (``fetch.fetch_runs``), optionally with a
            ``val_acc_at_best`` column.
        confidence: level of the confidence intervals.

    Returns:
        Columns: identity (``fingerprint``, ``label``, config keys), seed counts
        (``seeds``, ``seeds_finished``, ``seeds_diverged``, ``seeds_failed``, ``seeds_missing``,
        ``flag``), ``loss_*`` and ``acc_*`` (mean, std, CI), mean/std of clip fraction, skip
        count, fp16 underflow fraction and wall time, and ``rank``.
    """
    runs = runs.assign(eff_loss=effective_loss(runs))
    all_seeds = set(runs["seed"])
    first = runs.drop_duplicates("fingerprint").set_index("fingerprint")
    labels = config_labels(first.reset_index()).set_axis(first.index)
    rows = []
    for fp, g in runs.groupby("fingerprint", sort=False):
        f0 = first.loc[fp]
        missing = sorted(all_seeds - set(g["seed"]))
        finished = g[g["outcome"] == "finished"]
        row = {
            "fingerprint": fp,
            "label": labels[fp],
            "precision": f0.get(PRECISION_NAME, ""),
            "clip_enabled": bool(f0.get(CLIP_ENABLED, False)),
            "clip_method": f0.get(CLIP_METHOD, "norm"),
            "max_norm": float(f0[MAX_NORM]) if f0.get(CLIP_ENABLED, False)
            and f0.get(CLIP_METHOD, "norm") == "norm" else math.nan,
            "accum_steps": int(f0.get(ACCUM_STEPS, 1)),
            "seeds": len(g),
            "seeds_finished": len(finished),
            "seeds_diverged": int((g["outcome"] == "diverged").sum()),
            "seeds_failed": int((~g["outcome"].isin(["finished", "diverged"])).sum()),
            "seeds_missing": len(missing),
            "seed_list": " ".join(str(s) for s in sorted(g["seed"])),
        }
        flags = []
        if missing:
            flags.append(f"missing seeds {' '.join(map(str, missing))}")
        if len(g) - len(finished):
            flags.append(f"{len(g) - len(finished)} seed(s) did not finish")
        row["flag"] = "; ".join(flags)
        row |= _stats_columns("loss", g["eff_loss"], confidence)
        acc = finished.get("val_acc_at_best", pd.Series(dtype=float))
        row |= _stats_columns("acc", pd.to_numeric(acc, errors="coerce"), confidence)
        for prefix, col in (("clip_fraction", "clip_fraction"), ("skip_count", "skip_count"),
                            ("underflow", "fp16_underflow_fraction"),
                            ("wall_time_s", "wall_time_s")):
            row |= _mean_std(prefix, g.get(col))
        # A worker's first run also pays its cold start (imports, first kernels): the median
        # over seeds is the typical run, the mean is not.
        wall = pd.to_numeric(g.get("wall_time_s"), errors="coerce").dropna() \
            if "wall_time_s" in g else pd.Series(dtype=float)
        row["wall_time_s_median"] = float(wall.median()) if len(wall) else math.nan
        for name, values in (("train_seconds", train_seconds(g)),
                             ("peak_memory_mb", pd.to_numeric(g["peak_memory_mb"],
                                                              errors="coerce")
                              if "peak_memory_mb" in g else None)):
            v = values.dropna() if values is not None else pd.Series(dtype=float)
            row[name] = float(v.median()) if len(v) else math.nan
        row["wall_time_s_max"] = float(wall.max()) if len(wall) else math.nan
        rows.append(row)
    return rank(pd.DataFrame(rows), {str(fp): first.loc[fp] for fp in first.index})


def rank(configs: pd.DataFrame, params: Mapping[str, Params]) -> pd.DataFrame:
    """Sort by the selection rule (``SELECTION_RULE``) and number the ranks from 1.

    Args:
        configs: one row per config (``fingerprint``, ``loss_mean``, seed counts).
        params: each config's params by fingerprint: the tie-break's levels
            (``design.factors.tie_break``).
    """
    simpler = tie_break(params)
    key = pd.DataFrame({
        "loss": configs["loss_mean"].fillna(math.inf).round(TIE_DECIMALS),
        "unfinished": configs["seeds_diverged"] + configs["seeds_failed"],
        **{k.name: [simpler[str(fp)][i] for fp in configs["fingerprint"]]
           for i, k in enumerate(TIE_BREAK)},
        "fingerprint": configs["fingerprint"],
    }, index=configs.index)
    order = key.sort_values(list(key.columns), kind="stable").index
    out = configs.loc[order].reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out


def put_first(configs: pd.DataFrame, fingerprint: str | None) -> pd.DataFrame:
    """``configs`` with the decided winner as row 0, the others in rank order (by mean).

    ``rank`` keeps the lowest-mean order; None (nothing decided) leaves the ranking as it is.
    """
    if fingerprint is None or fingerprint not in set(configs["fingerprint"]):
        return configs
    first = configs["fingerprint"] == fingerprint
    return pd.concat([configs[first], configs[~first]]).reset_index(drop=True)


def best_of(configs: pd.DataFrame, mask: pd.Series) -> str | None:
    """Fingerprint of the best-ranked config where ``mask`` holds (``configs`` is ranked)."""
    hit = configs[mask]
    return str(hit.iloc[0]["fingerprint"]) if len(hit) else None


def best_of_each_precision(configs: pd.DataFrame) -> list[tuple[str, str | None]]:
    """``(precision, its best-ranked config)`` for each precision a loop knows, simplest first
    (the design's ``known`` levels of precision); None where no config has it."""
    return [(p, best_of(configs, configs["precision"] == p)) for p in kind(PRECISION).known]


def baseline(configs: pd.DataFrame) -> str | None:
    """The baseline: fp32, clip off, accum 1 (the best-ranked one if other keys vary)."""
    return best_of(configs, (configs["precision"] == Precision.FP32) & ~configs["clip_enabled"]
                   & (configs["accum_steps"] == 1))


def per_seed(runs: pd.DataFrame, fingerprint: str) -> dict[int, float]:
    """``{seed: effective loss}`` of one config (+inf for seeds that did not finish)."""
    g = runs[runs["fingerprint"] == fingerprint]
    return dict(zip(g["seed"].astype(int), effective_loss(g), strict=True))


def representative_seed(runs: pd.DataFrame, fingerprint: str) -> pd.Series | None:
    """The run of a config whose best validation loss is its seeds' median (lower seed on ties).

    Only finished runs qualify; ``None`` if the config has none.
    """
    g = runs[(runs["fingerprint"] == fingerprint) & (runs["outcome"] == "finished")]
    if g.empty:
        return None
    loss = effective_loss(g)
    order = g.assign(_l=loss).sort_values(["_l", "seed"])
    return order.iloc[(len(order) - 1) // 2]
