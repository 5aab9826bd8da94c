"""The benchmark's outputs: targets checked, ``bench.json``, ``accum-curve.json``, Markdown.

Every table is data first (a header of ``Column`` and rows of cells, built from the result's
figures) and rendered by one function, ``render``: no table layout is spelled out by hand.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.machine import describe
from benchmarks.spec import FLOORS, TARGETS

VARIANT_LABELS = {
    "bare": "Bare PyTorch loop (inline: backward, clip_grad_norm_, step)",
    "instrumented": "Instrumented: TrainStep + per-step telemetry + steps.csv flushed per row",
    "instrumented_per_layer": "Instrumented + per-layer norms (`telemetry.per_layer`: one "
                              "`_foreach_norm` a step, `layer_norms.csv`)",
    "tracked_server": "Instrumented + per-layer norms + every per-step metric to a real "
                      "`mlflow server`",
    "tracked_sqlite": "Instrumented + per-layer norms + every per-step metric to the embedded "
                      "SQLite store (rows, one transaction a flush: `DirectMetrics`)",
    "tracked_sqlite_log_batch": "The same on the embedded SQLite store through MLflow's "
                                "`log_batch` (the path before `DirectMetrics`)",
}
VARIANT_TARGETS = {"instrumented": "instrumented_ratio", "tracked_server": "tracked_ratio",
                   "tracked_sqlite": "tracked_sqlite_ratio"}
# The per-layer variant's target is relative to instrumented, not bare (the cost table shows
# the paired ratio it is checked on).
TABLE_TARGETS = VARIANT_TARGETS | {"instrumented_per_layer": "per_layer_ratio"}
PER_LAYER_METRICS = {"epoch_s": "wall s/epoch", "step_cpu_s": "CPU per optimizer step",
                     "run_cpu_s": "CPU s/run"}


def _target(name: str, label: str, value: float | None, limit: float, unit: str = "x",
            cpu_value: float | None = None, floor: bool = False) -> dict[str, Any]:
    finite = value is not None and math.isfinite(value)
    met = finite and (value >= limit if floor else value <= limit)
    out = {"name": name, "label": label, "value": value, "target": limit, "unit": unit,
           "met": met, "floor": floor}
    if cpu_value is not None:
        out["cpu_value"] = cpu_value
        out["cpu_met"] = math.isfinite(cpu_value) and cpu_value <= limit
    return out


def check_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured target: value, limit and whether it is met (wall; CPU beside it)."""
    out = []
    if "overhead" in result:
        v = result["overhead"]["variants"]
        for variant, name in VARIANT_TARGETS.items():
            out.append(_target(name, f"{variant} / bare, wall s/epoch",
                               v[variant]["epoch_s"]["ratio_vs_bare"], TARGETS[name],
                               cpu_value=v[variant]["step_cpu_s"]["ratio_vs_bare"]))
        pl = result["overhead"]["per_layer_vs_instrumented"]
        out.append(_target("per_layer_ratio", "instrumented + per-layer / instrumented, wall "
                           "s/epoch", pl["epoch_s"]["ratio"], TARGETS["per_layer_ratio"],
                           cpu_value=pl["step_cpu_s"]["ratio"]))
        out.append(_target("tracked_sqlite_cpu_run", "tracked_sqlite / bare, CPU s/run",
                           v["tracked_sqlite"]["run_cpu_s"]["ratio_vs_bare"],
                           TARGETS["tracked_sqlite_cpu_run"]))
        out.append(_target("fixed_cost_s", "fixed cost per run, server (s)",
                           result["overhead"]["fixed_cost_s"]["server"]["median"],
                           TARGETS["fixed_cost_s"], "s"))
    if "memory" in result:
        for variant in (v for v in result["memory"] if v != "bare"):
            out.append(_target(f"memory_ratio_{variant}", f"peak RSS {variant} / bare",
                               result["memory"][variant]["ratio_vs_bare"],
                               TARGETS["memory_ratio"]))
    if "study" in result:
        s = result["study"]
        out.append(_target("study_ratio", "study wall / ideal",
                           s.get("command_ratio", s["parent_ratio"]), TARGETS["study_ratio"]))
    if "scale" in result:
        sc = result["scale"]
        out.append(_target("ingest_points_per_s", f"ingest, {sc['ingest']['writers']} writers, "
                           "per-step points/s", sc["ingest"]["step_points_per_s"],
                           FLOORS["ingest_points_per_s"], "points/s", floor=True))
        if sc["spec"]["runs"] == 2400:  # the target is set at 10x the default study
            out.append(_target("report_10x_s", "the report of 2400 runs, wall s",
                               sc["report"]["wall_s"], TARGETS["report_10x_s"], "s"))
    return out


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented, strict JSON: a value that could not be measured is null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite_or_none(payload), indent=2, allow_nan=False) + "\n")


def _limit(t: dict[str, Any] | None) -> str:
    if t is None:
        return ""
    if t.get("floor"):
        return f"≥ {t['target']:,.0f} {t['unit']}"
    return f"≤ {t['target']} s" if t["unit"] == "s" else f"≤ {t['target']:.2f}"


def _status(t: dict[str, Any] | None) -> str:
    if t is None:
        return ""
    status = "met" if t["met"] else "**not met**"
    if "cpu_met" in t and t["cpu_met"] != t["met"]:
        status += f" (CPU: {'met' if t['cpu_met'] else 'not met'})"
    return status


def _ratio(stats: dict[str, Any]) -> str:
    """Paired ratio with the quartiles of the per-round ratios, e.g. ``1.021 (1.01-1.03)``."""
    per_round = stats.get("ratio_vs_bare_per_round", [])
    text = f"{stats['ratio_vs_bare']:.3f}"
    if len(per_round) >= 2:
        q = statistics.quantiles(per_round, n=4, method="inclusive")
        text += f" ({q[0]:.2f}–{q[2]:.2f})"
    return text


def _paired(stats: dict[str, Any]) -> str:
    """A paired ratio to another variant with the quartiles of its rounds."""
    return _ratio({"ratio_vs_bare": stats["ratio"],
                   "ratio_vs_bare_per_round": stats["per_round"]})


class Column(NamedTuple):
    """A table column: its title and whether its cells are numbers (right-aligned)."""

    title: str
    number: bool = False


Table = tuple[list[Column], list[list[str]]]


def render(table: Table) -> list[str]:
    """A Markdown table of ``table``'s header and rows (pipes in cells escaped)."""
    columns, rows = table
    cells = [[c.title for c in columns], ["---:" if c.number else "---" for c in columns]]
    cells += [[str(x).replace("|", "\\|") for x in row] for row in rows]
    return ["| " + " | ".join(row) + " |" for row in cells]


def _overhead_table(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> Table:
    v = r["overhead"]["variants"]
    columns = [Column("Variant"), *(Column(t, True) for t in (
        "Wall ms/epoch", "vs bare", "CPU ms/optimizer step", "vs bare", "CPU s/run", "vs bare",
        "Target (wall)")), Column("")]
    rows = []
    for name, label in VARIANT_LABELS.items():
        e, c, run = v[name]["epoch_s"], v[name]["step_cpu_s"], v[name]["run_cpu_s"]
        t = targets.get(TABLE_TARGETS.get(name, ""))
        limit = _limit(t) + (" × instrumented" if t and t["name"] == "per_layer_ratio" else "")
        rows.append([label, f"{e['median'] * 1e3:.1f}", _ratio(e), f"{c['median'] * 1e3:.2f}",
                     _ratio(c), f"{run['median']:.2f}", _ratio(run), limit, _status(t)])
    return columns, rows


def _overhead_costs(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> list[list[str]]:
    o = r["overhead"]
    pl, t = o["per_layer_vs_instrumented"], targets.get("per_layer_ratio")
    values = "; ".join(f"{what} {_paired(pl[m])}" for m, what in PER_LAYER_METRICS.items())
    rows = [["Per-layer gradient norms: instrumented + per-layer / instrumented (paired)",
             values, f"{_limit(t)} × instrumented", _status(t)]]
    t = targets.get("tracked_sqlite_cpu_run")
    rows.append(["Embedded SQLite store: CPU s/run vs bare (paired)",
                 _ratio(o["variants"]["tracked_sqlite"]["run_cpu_s"]), _limit(t), _status(t)])
    dv = o.get("sqlite_direct_vs_log_batch")
    if dv:
        values = "; ".join(f"{what} {_paired(dv[m])}" for m, what in PER_LAYER_METRICS.items())
        rows.append(["Embedded SQLite store: rows (`DirectMetrics`) / MLflow's `log_batch` "
                     "(paired, same run)", values, "", ""])
    sw = o.get("store_write")
    if sw:
        us = sw["cpu_us_per_point"]
        rows.append([f"Writing one metric point into the SQLite store, process CPU "
                     f"({sw['rounds']} paired rounds of {sw['points_per_round']}): MLflow's "
                     "`log_batch` / `DirectMetrics`", f"{us['mlflow']:.0f} µs / "
                     f"{us['direct']:.1f} µs ({sw['mlflow_over_direct']:.1f}×)", "", ""])
    for store, fixed in o["fixed_cost_s"].items():
        t = targets.get("fixed_cost_s") if store == "server" else None
        rows.append([f"Fixed cost per run in a sweep worker, {store} store (run creation, "
                     "params, setup, checkpoints, artifacts, teardown)",
                     f"{fixed['median']:.3f} s", _limit(t), _status(t)])
    return rows


def _memory_costs(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for variant, m in r["memory"].items():
        t = targets.get(f"memory_ratio_{variant}")
        loaded = ", ".join(m.get("loaded", [])) or "none"
        rows.append([f"Peak RSS, {variant} ({m['rss_after_imports_mib']:.0f} MiB after imports, "
                     f"{m['import_s']:.1f} s to import; of pandas, pyarrow, scipy, sqlalchemy & "
                     f"co. loaded: {loaded})",
                     f"{m['peak_rss_mib']:.0f} MiB = {m['ratio_vs_bare']:.3f} × bare",
                     _limit(t), _status(t)])
    return rows


def _study_costs(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> list[list[str]]:
    s, t = r["study"], targets["study_ratio"]
    what = "timed command" if "command_wall_s" in s else "parent run"
    wall = s.get("command_wall_s", s["parent_wall_s"])
    b = s["breakdown"]
    rows = [[f"Study {s['sweep_id']}: {s['runs']} runs, {s['epochs_total']} epochs on "
             f"{s['cores']} cores: wall ({what}) {wall:.0f} s vs ideal {s['ideal_s']:.0f} s "
             "(bare training time / cores)", f"{t['value']:.3f} × ideal", _limit(t), _status(t)],
            [f"Same study vs the pooled ideal {s['pooled_ideal_s']:.0f} s (bare runs in the "
             f"sweep's start order, each on the first of {s['cores']} cores to free)",
             f"{wall / s['pooled_ideal_s']:.3f} × pooled", "", ""],
            [f"Where it went: training {b['train_inflation']:.2f} × bare (sum of `run.train` "
             f"walls {b['train_wall_s_sum']:.0f} s), tracking outside training "
             f"{b['tracking_outside_train_s_per_run']:.2f} s/run, startup {b['startup_s']:.1f} "
             f"s, gap between a worker's runs {b['job_gap_s_per_run']:.2f} s/run, cores busy "
             f"{b['busy_core_share']:.0%}, teardown {b['teardown_s']:.1f} s", "", "", ""]]
    if "saturated_ideal_s" in s:
        ratio = s.get("command_ratio_saturated", s["parent_ratio_saturated"])
        rows.append([f"Same study vs the saturated ideal {s['saturated_ideal_s']:.0f} s (the bare "
                     f"loop timed with {s['cores']} copies at once: the machine's own core "
                     f"contention {s['core_contention']:.2f} × one copy alone); training "
                     f"{s['train_inflation_saturated']:.2f} × saturated bare",
                     f"{ratio:.3f} × saturated", "", ""])
    for i, run in enumerate(s.get("repeats", []), 1):
        b = run["breakdown"]
        rows.append([f"Study run {i}/{len(s['repeats'])} ({run['sweep_id']}): wall "
                     f"{run['command_wall_s']:.0f} s vs ideal {run['ideal_s']:.0f} s, pooled "
                     f"ideal {run['pooled_ideal_s']:.0f} s; training {b['train_inflation']:.2f}"
                     f" × bare, cores busy {b['busy_core_share']:.0%}, gap "
                     f"{b['job_gap_s_per_run']:.2f} s/run", f"{run['command_ratio']:.3f} × ideal",
                     "", ""])
    return rows


def _scale_costs(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> list[list[str]]:
    sc = r["scale"]
    ing, rep, sweep = sc["ingest"], sc["report"], sc["sweep"]
    t = targets.get("ingest_points_per_s")
    server = (f"; server {ing['server_cores']:.2f} cores, {ing['server_cpu_us_per_point']:.0f} "
              "µs CPU a point" if ing.get("server_cpu_us_per_point") else "")
    rows = [[f"Ingest into the tracking server ({sc['store']}), {ing['writers']} writers, "
             f"`MlflowClient.log_batch` of 1,000 per-step points, {ing['window_s']:.0f} s window",
             f"{ing['step_points_per_s']:,.0f} points/s{server}", _limit(t), _status(t)]]
    t = targets.get("report_10x_s")
    rows.append([f"The report of a {sweep['runs']}-run sweep (`python experiments/report.py`; "
                 f"the runs written with `MlflowClient`, {sweep['write_ms_per_run']:.0f} ms a run)",
                 f"{rep['wall_s']:.1f} s ({rep['build_report_s']:.1f} s inside the report, "
                 f"{rep['ms_per_run']:.0f} ms a run)", _limit(t), _status(t)])
    return rows


def _cost_table(r: dict[str, Any], targets: dict[str, dict[str, Any]]) -> Table:
    columns = [Column("Measure"), Column("Value", True), Column("Target", True), Column("")]
    rows: list[list[str]] = []
    for part, costs in (("overhead", _overhead_costs), ("memory", _memory_costs),
                        ("study", _study_costs), ("scale", _scale_costs)):
        if part in r:
            rows += costs(r, targets)
    return columns, rows


def _precision_table(r: dict[str, Any]) -> Table:
    columns = [Column("Precision"), *(Column(t, True) for t in (
        "Bare s/epoch", "vs fp32", "Instrumented s/epoch", "Instrumented / bare (wall)",
        "Instrumented / bare (CPU per step)"))]
    rows = [[prec, f"{p['bare']['epoch_s']['median']:.3f}",
             f"{p['bare']['epoch_s']['ratio_vs_bare_fp32']:.2f}",
             f"{p['instrumented']['epoch_s']['median']:.3f}", f"{p['instrumented_ratio']:.3f}",
             f"{p['instrumented_cpu_ratio']:.3f}"] for prec, p in r["precision"].items()]
    return columns, rows


def _accum_table(r: dict[str, Any]) -> Table:
    a = r["accum"]
    columns = [Column(t, True) for t in (
        "accum_steps", "Effective batch", "Samples/s", "vs accum 1 (paired)",
        "Median ms / optimizer step", "Grad syncs / optimizer step (DDP, counted)",
        "Mean loss (last epoch)")]
    rows = [[str(p["accum_steps"]), str(p["effective_batch"]), f"{p['samples_per_s']:.0f}",
             f"{p['speedup_vs_1']:.3f}", f"{p['ms_per_optimizer_step']:.1f}",
             f"{a['grad_syncs'][str(p['accum_steps'])]['hook']:g}", f"{p['mean_loss']:.4f}"]
            for p in a["curve"]]
    return columns, rows


def _cpu_during(r: dict[str, Any]) -> str:
    during = r["machine_after"].get("cpu_seconds_during") or {}
    if not during or not r["seconds"]:
        return ""
    cores = r["machine"]["logical_cores"] or 1
    busy = during["busy_s"] / (r["seconds"] * cores)
    return (f"; during the run the cores were {busy:.0%} busy (this benchmark's one core "
            f"included) and {during['steal_s']:.1f} s were stolen by the hypervisor")


def markdown(r: dict[str, Any]) -> str:
    """The docs-ready tables of one benchmark run."""
    targets = {t["name"]: t for t in r["targets"]}
    sp = r["spec"]
    lines = [
        f"Measured {r['finished']} with `{r['command']}` ({r['seconds']:.0f} s).",
        "",
        f"Machine: {describe(r['machine'])} at the start; "
        f"{' / '.join(str(x) for x in r['machine_after']['load_avg_1_5_15'])} at the end"
        f"{_cpu_during(r)}.",
    ]
    if set(r["parts"]) - {"scale"}:  # the training settings; scale trains nothing
        lines += [
            "",
            f"Settings: {sp['precision']}, clipping on (global norm {sp['max_norm']}), "
            f"accum_steps {sp['accum_steps']}, micro-batch 64, {sp['num_samples']} sequences "
            f"(70% train), one torch thread; {sp['reps']} interleaved repetitions of "
            f"{sp['epochs']} epochs each (the first epoch of each is a dropped warm-up when "
            "there are two or more); medians.",
        ]
    if "overhead" in r:
        lines += ["", *render(_overhead_table(r, targets))]
    if {"overhead", "memory", "study", "scale"} & set(r):
        lines += ["", *render(_cost_table(r, targets))]
    if "precision" in r:
        lines += ["", f"Per precision on this device (same settings, {sp['reps']} repetitions "
                  f"of {min(sp['precision_epochs'], sp['epochs'])} epochs):", "",
                  *render(_precision_table(r))]
    if "accum" in r:
        lines += ["", "Accumulation throughput curve (micro-batch 64, `TrainStep` on the plain "
                  "model; gradient syncs counted by a comm hook on a world-size-1 DDP model):",
                  "", *render(_accum_table(r)), "", f"The paired speedup is within 5% of its "
                  f"best from accum_steps={r['accum']['flattens_at']} on: the curve flattens "
                  "there."]
    return "\n".join(lines) + "\n"
