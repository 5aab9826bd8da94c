"""The ``scale`` part's outputs: its goals checked, docs-ready tables and the growth figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

# The goals of issue 12 section 2, in one place so the JSON, the tables and the docs agree.
GOALS = {
    "ingest_points_per_s": 50_000,  # per-step points/s on PostgreSQL with 8 writers, at least
    "report_s": 300.0,  # the report at the largest size, at most
    "report_marginal_growth": 1.25,  # s/run of the last step over s/run of the one before
    "runs_page_s": 5.0,  # the runs page until the sweep is listed, at most
}
LABELS = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def _window(size: dict[str, Any], writers: int) -> dict[str, Any] | None:
    return next((w for w in size["ingest"] if w["writers"] == writers), None)


def marginal_growth(sizes: list[dict[str, Any]]) -> float | None:
    """Report seconds per added run between the last two sizes over the same between the two
    before (1.0: linear in runs); None with fewer than three sizes."""
    if len(sizes) < 3:
        return None
    (r1, t1), (r2, t2), (r3, t3) = [(s["runs"], s["report"]["wall_s"]) for s in sizes[-3:]]
    before = (t2 - t1) / (r2 - r1)
    return ((t3 - t2) / (r3 - r2)) / before if before > 0 else math.inf


def targets(scale: dict[str, Any], size_writers: int) -> list[dict[str, Any]]:
    """Each goal per store: value, limit, direction and whether it is met (None: not
    measured, e.g. linearity with fewer than three sizes)."""
    out = []

    def add(name: str, store: str, label: str, value: float | None, limit: float,
            at_least: bool = False) -> None:
        met = None if value is None else math.isfinite(value) and (
            value >= limit if at_least else value <= limit)
        out.append({"name": f"{name}_{store}", "label": f"{label} ({LABELS[store]})",
                    "value": value, "target": limit, "at_least": at_least, "met": met})

    for store, r in scale["stores"].items():
        last = r["sizes"][-1]
        first = next((s for s in r["sizes"] if _window(s, size_writers)), r["sizes"][0])
        w = _window(first, size_writers)
        add("ingest_points_per_s", store, f"ingest, {size_writers} writers, per-step points/s "
            f"({first['runs']} runs in the store)", w["step_points_per_s"] if w else None,
            GOALS["ingest_points_per_s"], at_least=True)
        add("report_s", store, f"report wall s at {last['runs']} runs",
            last["report"]["wall_s"], GOALS["report_s"])
        add("report_marginal_growth", store, "report s/run growth, last size step vs the one "
            "before (1 = linear)", marginal_growth(r["sizes"]), GOALS["report_marginal_growth"])
        add("runs_page_s", store, f"runs page (cold) s at {last['runs']} runs",
            last["ui"]["runs_page_cold_s"], GOALS["runs_page_s"])
    return out


def _f(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def growth_table(scale: dict[str, Any], size_writers: int) -> list[str]:
    """One row per store and size: ingest, report, UI, resume."""
    lines = [f"| Store | Runs | Store MB | Ingest, {size_writers} writers (points/s; server + "
             "DB cores) | Report wall s (build_report s) | Runs page cold / warm s | Grouped "
             "view s | Metric chart s | finished_points s | Resumed sweep s (plan / open / "
             "total) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for store, r in scale["stores"].items():
        for s in r["sizes"]:
            w = _window(s, size_writers)
            cores = (w["cpu"].get("server_cores", 0) + w["cpu"].get("postgres_cores", 0)) if w \
                else None
            u, res, rep = s["ui"], s["resume"], s["report"]
            ingest = f"{_f(w['step_points_per_s'], 0)} ({_f(cores, 2)})" if w else "n/a"
            lines.append(
                f"| {LABELS[store]} | {s['runs']} | {_f(s['store_mb_after'], 0)} | {ingest} | "
                f"{_f(rep['wall_s'])} ({_f(rep['build_report_s'])}) | "
                f"{_f(u['runs_page_cold_s'])} / {_f(u['runs_page_warm_s'])} | "
                f"{_f(u['grouped_s'])} | {_f(u['chart_s'])} | "
                f"{_f(res['finished_points_s'], 2)} | {_f(res['sweep_until_planned_s'])} / "
                f"{_f(res['sweep_open_s'])} / {_f(res['sweep_wall_s'])} |")
    return lines


def ingest_table(scale: dict[str, Any]) -> list[str]:
    """Every ingest window: writers, points/s and where the CPU went."""
    lines = ["| Store | Runs in store | Writers | Per-step points/s | Runs started | Server "
             "cores | PostgreSQL cores | Writers cores | Machine busy cores (all users) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for store, r in scale["stores"].items():
        rows = [(s["runs"], str(w["writers"]), w) for s in r["sizes"] for w in s["ingest"]]
        if "two_workers" in r:
            rows.append((r["sizes"][-1]["runs"], f"{r['two_workers']['writers']}, server with "
                         "2 workers", r["two_workers"]))
        for runs, writers, w in rows:
            c = w["cpu"]
            lines.append(f"| {LABELS[store]} | {runs} | {writers} | "
                         f"{_f(w['step_points_per_s'], 0)} | {w['runs_started']} | "
                         f"{_f(c.get('server_cores'), 2)} | "
                         f"{_f(c.get('postgres_cores'), 2) if 'postgres_cores' in c else '-'}"
                         f" | {_f(c.get('writers_cores'), 2)} | "
                         f"{_f(c.get('machine_busy_cores'), 2)} |")
    for store, r in scale["stores"].items():
        cost = r["sizes"][0].get("store_cost")
        if cost:
            lines += ["", f"{LABELS[store]}: MLflow's SQL store alone (`SqlAlchemyStore."
                      f"log_batch` of 1000 per-step points, in process) "
                      f"{cost['us_per_point_wall']:.0f} us a point wall, "
                      f"{cost['us_per_point_cpu']:.0f} us CPU in the caller"
                      + (f" + {cost['postgres_us_per_point_cpu']:.0f} us in PostgreSQL"
                         if store == "postgres" else "")
                      + "; the server's CPU per point in the 8-writer window: "
                      + _server_us(r["sizes"][0]) + "."]
    return lines


def _server_us(size: dict[str, Any]) -> str:
    w = _window(size, 8) or size["ingest"][-1]
    rate = w["step_points_per_s"]
    return f"{1e6 * w['cpu'].get('server_cores', 0) / rate:.0f} us" if rate else "n/a"


def goals_table(goals: list[dict[str, Any]]) -> list[str]:
    """Goal / measured / met."""
    lines = ["| Goal | Measured | Limit | |", "|---|---:|---:|---|"]
    for g in goals:
        sign = "≥" if g["at_least"] else "≤"
        verdict = "n/a" if g["met"] is None else "met" if g["met"] else "**not met**"
        lines.append(f"| {g['label']} | {_f(g['value'], 2)} | {sign} {g['target']:,} | "
                     f"{verdict} |")
    return lines


def markdown(scale: dict[str, Any], size_writers: int) -> list[str]:
    """The part's tables, docs-ready."""
    goals = targets(scale, size_writers)
    per_run = ", ".join(f"{k} runs: {v:,.0f}" for k, v in scale["shape"]["step_points_per_run"]
                        .items())
    return ["Scale: per-step points per run (mean) " + per_run + f"; `python experiments/"
            f"sweep.py -m` start-up (one-point dry run) {scale['sweep_startup_s']:.1f} s.", "",
            *growth_table(scale, size_writers), "", *ingest_table(scale), "",
            *goals_table(goals)]


def plot(scale: dict[str, Any], path: Path) -> None:
    """Growth curves: ingest vs writers, report, UI and resume vs runs, one line per store
    (runs and writers on log axes, seconds and points/s linear from 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for store, r in scale["stores"].items():
        label, sizes = LABELS[store], r["sizes"]
        runs = [s["runs"] for s in sizes]
        first = sizes[0]["ingest"]
        axes[0][0].plot([w["writers"] for w in first], [w["step_points_per_s"] for w in first],
                        "o-", label=f"{label}, {sizes[0]['runs']} runs in store")
        axes[0][1].plot(runs, [s["report"]["wall_s"] for s in sizes], "o-", label=label)
        for key, style in (("runs_page_cold_s", "o-"), ("chart_s", "s--")):
            axes[1][0].plot(runs, [s["ui"][key] for s in sizes], style,
                            label=f"{label}: {key.removesuffix('_s').replace('_', ' ')}")
        for key, style in (("sweep_wall_s", "o-"), ("finished_points_s", "s--")):
            axes[1][1].plot(runs, [s["resume"][key] for s in sizes], style,
                            label=f"{label}: {key.removesuffix('_s').replace('_', ' ')}")
    axes[0][0].text(0.02, 0.95, f"goal: {GOALS['ingest_points_per_s']:,} (8 writers, "
                    "PostgreSQL), off this scale", transform=axes[0][0].transAxes, fontsize=7,
                    va="top")
    axes[0][1].axhline(GOALS["report_s"], color="grey", ls=":", label="goal")
    axes[1][0].axhline(GOALS["runs_page_s"], color="grey", ls=":", label="goal (runs page)")
    from matplotlib.ticker import NullFormatter

    first = next(iter(scale["stores"].values()))["sizes"]
    ticks = {"writers": [w["writers"] for w in first[0]["ingest"]],
             "runs": [s["runs"] for s in first]}
    titles = [("Ingest (per-step points/s)", "writers"), ("Report wall (s)", "runs"),
              ("MLflow UI (s)", "runs"), ("Resume bookkeeping (s)", "runs")]
    for ax, (title, xlabel) in zip(axes.flat, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_xscale("log")
        ax.set_xticks(ticks[xlabel], [str(t) for t in ticks[xlabel]])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(bottom=0)  # linear: a window that logged nothing shows as 0
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left" if ax is axes[0][0] else "best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
