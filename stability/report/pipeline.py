"""``build_report``: fetch the sweep, select on validation, test the winner, plot, write, publish.

Order matters for trust: the winner is fixed from validation numbers before the test split is
opened, and only its runs are evaluated. A figure or the registry failing is written into the
report as a problem instead of ending it; the report folder is complete before anything is
uploaded, so a tracking failure at the end loses nothing.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from stability.core.precision import SIMPLEST_FIRST, Precision
from stability.report import (
    adoption,
    advice,
    compare,
    effects_plot,
    factors,
    fetch,
    health,
    layers,
    lr,
    lr_plot,
    plots,
    publish,
    select,
    spending,
)
from stability.report.decision import margin_of
from stability.report.evaluate import evaluate_winner, load_winner
from stability.report.html import to_html
from stability.report.options import ReportConfig, ReportError
from stability.report.trust import allowed_tasks
from stability.report.winner import decide as decide_winner
from stability.report.write import ReportContext, answer_markdown, render, write_summary
from stability.tracking.contract import Artifact
from stability.tracking.uri import (
    check_reachable,
    client,
    git_commit,
    redact_uri,
    resolve_tracking_uri,
)

log = logging.getLogger(__name__)

ROLE_COLORS = ("tab:red", "tab:blue", "tab:purple", "tab:olive", "tab:cyan")


class NothingToReport(ReportError):
    """The sweep exists but no run finished: there is no winner (exit code 3, not 2)."""


def _outcomes(runs: pd.DataFrame) -> str:
    counts = runs["outcome"].value_counts()
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items())


@dataclass(frozen=True)
class ReportOutcome:
    """Where the report went."""

    folder: Path
    sweep_id: str
    winner: str
    winner_label: str
    report_run_id: str
    model_version: str
    model_created: bool
    elapsed_s: float


def _roles(configs: pd.DataFrame) -> list[tuple[str, str]]:
    """``(role, fingerprint)`` of the plotted configs: winner, baseline, best of each precision."""
    wanted = [("winner", configs.iloc[0]["fingerprint"]), ("baseline", select.baseline(configs))]
    wanted += [(f"best {p}", select.best_of(configs, configs["precision"] == p))
               for p in SIMPLEST_FIRST]
    roles: dict[str, str] = {}
    for role, fp in wanted:
        if fp is not None:
            roles[fp] = f"{roles[fp]} = {role}" if fp in roles else role
    return [(role, fp) for fp, role in roles.items()]


def _series(configs: pd.DataFrame, role: str, fp: str, color: str) -> plots.Series:
    row = configs[configs["fingerprint"] == fp].iloc[0]
    return plots.Series(role, str(row["label"]), color, float(row["max_norm"]))


def draw(c: Any, runs: pd.DataFrame, configs: pd.DataFrame, steps: dict[str, pd.DataFrame],
         recs: list[advice.Recommendation], folder: Path, workers: int, notes: list[str],
         cache: Path, remarks: list[str],
         analysis: factors.FactorAnalysis | None = None,
         lr_found: list[lr.LrCurve] | None = None) -> list[plots.Figure]:
    """Draw from the fetched steps tables; fetch only what a few plotted configs need.

    Beyond ``steps`` that is the val_loss histories of the plotted configs and the
    ``layer_norms.csv`` of their representative runs (downloaded under ``cache``). A figure
    that cannot be drawn adds a line to ``notes`` (problems); one with nothing to draw may
    say why in ``remarks``.
    """
    roles = _roles(configs)
    loss = fetch.loss_name(runs)  # the task's loss, on every loss axis
    series = {fp: _series(configs, role, fp, ROLE_COLORS[i % len(ROLE_COLORS)])
              for i, (role, fp) in enumerate(roles)}
    rep = {fp: select.representative_seed(runs, fp) for fp in series}
    fp16 = configs[configs["precision"] == Precision.FP16]
    scaler_fps: list[str] = []
    if len(fp16):  # the best fp16 config, and the one that skipped most if it skipped at all
        most = fp16.sort_values("skip_count_mean", kind="stable").iloc[-1]
        scaler_fps = list(dict.fromkeys([fp16.iloc[0]["fingerprint"]]
                                        + ([most["fingerprint"]]
                                           if most["skip_count_mean"] > 0 else [])))
    for fp in scaler_fps:
        rep.setdefault(fp, select.representative_seed(runs, fp))
        series.setdefault(fp, _series(configs, "most skips fp16", fp, "tab:orange"))
    rep_ids = {fp: r["run_id"] for fp, r in rep.items() if r is not None}
    finished = runs[runs["fingerprint"].isin([fp for _, fp in roles])
                    & (runs["outcome"] == "finished")]
    histories = fetch.metric_histories(c, finished["run_id"], "val_loss", workers)
    seeds_of = finished.groupby("fingerprint")

    def curves(fp: str) -> dict[int, pd.Series]:
        if fp not in seeds_of.groups:
            return {}
        g = seeds_of.get_group(fp)
        return {int(s): histories[r] for s, r in zip(g["seed"], g["run_id"], strict=True)}

    jobs: list[tuple[str, Callable[[], plots.Figure | None]]] = [
        ("main effects", lambda: effects_plot.main_effects(analysis, folder, loss)
         if analysis is not None else None),
        ("LR sensitivity", lambda: lr_plot.lr_sensitivity(lr_found or [], folder, loss)),
        ("grad norm", lambda: plots.grad_norm(
            [(series[fp], steps[rep_ids[fp]]) for _, fp in roles
             if rep_ids.get(fp) in steps], folder, configs["max_norm"].dropna().unique())),
        ("clip fraction", lambda: plots.clip_fraction(configs, folder)),
        ("validation curves", lambda: plots.val_loss_curves(
            [(series[fp], curves(fp)) for _, fp in roles], folder, loss)),
        ("fp16 scaler", lambda: plots.scaler_scale(
            [(series[fp], steps[rep_ids[fp]]) for fp in scaler_fps
             if rep_ids.get(fp) in steps], folder)),
        ("skipped steps", lambda: plots.skipped_steps(configs, folder)),
        ("heatmap", lambda: plots.heatmap(configs, folder, loss)),
        ("max_norm advice", lambda: plots.max_norm_advice(recs, folder)),
        ("per-layer norms", lambda: layers.figure(
            c, [(series[fp], r) for fp, r in rep.items() if r is not None], steps, folder,
            cache / "layers", workers, remarks)),
    ]
    figures = []
    for name, job in jobs:
        try:
            fig = job()
        except Exception as err:  # one broken figure must not cost the whole report
            # one line on the terminal (the report's Problems say it too); the traceback at debug
            log.warning("figure %s could not be drawn: %s: %s", name, type(err).__name__, err)
            log.debug("figure %s failed", name, exc_info=True)
            notes.append(f"figure '{name}' could not be drawn: {type(err).__name__}: {err}")
            continue
        if fig is not None:
            figures.append(fig)
    return figures


def build_report(cfg: ReportConfig) -> ReportOutcome:
    """Write the review report of one sweep and log it to MLflow.

    Raises:
        ReportError: unknown experiment or sweep id, or no sweep at all.
        TrackingError: the tracking server is not reachable.
    """
    t0 = time.perf_counter()
    uri = resolve_tracking_uri(cfg.tracking_uri)
    check_reachable(uri)
    c = client(uri)
    sweep = fetch.find_sweep(c, cfg.experiment, cfg.sweep_id)
    runs = fetch.fetch_runs(c, sweep, allowed_tasks(cfg.task), cfg.history_workers)
    runs["val_acc_at_best"] = fetch.val_acc_at_best(c, runs, cfg.history_workers)
    configs = select.aggregate(runs, cfg.confidence)
    if not (runs["outcome"] == "finished").any():
        raise NothingToReport(
            f"nothing to recommend: none of the {len(runs)} training runs of sweep "
            f"{sweep.sweep_id!r} finished ({_outcomes(runs)})")
    # The margin scales with the lowest config mean, before anything is chosen from it.
    margin = margin_of(cfg.margin, float(configs.iloc[0]["loss_mean"]))
    analysis = factors.analyse(runs, configs, margin, cfg.alpha, cfg.confidence, cfg.power)
    decided = decide_winner(runs, configs, analysis, margin, cfg.alpha, cfg.cost_tolerance)
    configs = select.put_first(configs, decided.fingerprint)  # row 0 is the winner from here on
    configs = compare.versus_winner(runs, configs, cfg.confidence, cfg.alpha, cfg.power, margin)
    comparisons = compare.comparisons(runs, configs, cfg.confidence, cfg.alpha, cfg.power,
                                      cfg.min_effect, cfg.min_effect_sd, margin)
    winner = configs.iloc[0]
    log.info("winner %s (%s) of %d configs", winner["label"], winner["fingerprint"], len(configs))

    folder = publish.report_folder(Path(cfg.output_dir), sweep.sweep_id)
    commit = git_commit()
    report_run = publish.start_report_run(c, sweep, winner, commit)
    notes: list[str] = []
    remarks: list[str] = []  # figure-section lines: a figure with nothing to draw says why
    try:
        # The report's files are made in a staging folder and moved into ``folder`` (never
        # written through whatever already sits there); only these files are uploaded.
        with tempfile.TemporaryDirectory(prefix="stability-report-") as tmp, \
                tempfile.TemporaryDirectory(prefix=".staging-", dir=folder) as staged:
            cache, staging = Path(tmp), Path(staged)
            judged = runs[runs["outcome"].isin(["finished", "diverged"])]
            unreadable: dict[str, str] = {}
            steps = fetch.steps_tables(c, judged["run_id"], cache / "steps", cfg.history_workers,
                                       dict(zip(judged["run_id"], judged["artifact_uri"],
                                                strict=True)), unreadable)
            notes += [f"run {rid} is unreadable, left out of the stability verdicts: {why}"
                      for rid, why in sorted(unreadable.items())]
            notes += [f"run {r.run_id} is unreadable, counted as not finished: {r.reason}"
                      for r in runs[runs["outcome"] == fetch.UNREADABLE].itertuples()]
            notes += adoption.other_users(c, sweep.parent_run_id, runs)
            notes += select.missing_costs(runs)
            configs = health.judge(runs, configs, steps, cfg.verdict)
            lr_found = lr.curves(runs, configs)
            lr_text = lr.sentences(lr_found, {f.name: f.reference for f in analysis.factors
                                              if f.name != lr.LR})
            recs = advice.recommend(runs, configs, steps, cfg.advice)
            publish.tag_findings(c, report_run, configs, recs)
            test = evaluate_winner(c, runs, str(winner["fingerprint"]), cache / "winner",
                                   cfg.device, cfg.history_workers, allowed_tasks(cfg.task))
            version, created = "", False
            if cfg.register:
                version, created = _register(c, uri, cfg, sweep, runs, winner, test, report_run,
                                             cache / "model", notes)
            figures = draw(c, runs, configs, steps, recs, staging / "plots",
                           cfg.history_workers, notes, cache, remarks, analysis, lr_found) \
                if cfg.plots else []
            spent, sequential = spending.replayed(c, sweep.parent_run_id, runs, configs, notes)
            figures += [f for f in [spending.figure(spent, staging / "plots")]
                        if f is not None] if spent is not None and cfg.plots else []
            elapsed = time.perf_counter() - t0
            write_summary(configs, staging / Artifact.SUMMARY_CSV)
            ctx = ReportContext(sweep, redact_uri(uri), runs, configs, comparisons, test,
                                figures, notes, cfg.confidence, cfg.alpha, report_run, version,
                                elapsed, datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                                commit, recs, remarks, analysis,
                                _model_uri(cfg, version), fetch.loss_name(runs), lr_found,
                                lr_text, spent, sequential, decided)
            markdown = render(ctx)
            (staging / Artifact.REPORT_MD).write_text(markdown)
            (staging / Artifact.REPORT_HTML).write_text(
                to_html(markdown, staging, f"Training-stability report: sweep {sweep.sweep_id}"))
            own_files = [Artifact.SUMMARY_CSV, Artifact.REPORT_MD, Artifact.REPORT_HTML,
                         *(f"plots/{f.file}" for f in figures)]
            publish.install(staging, folder, own_files)
        metrics = publish.summary_metrics(test) | {
            "winner_best_val_loss_mean": float(winner["loss_mean"]),
            "configs": float(len(configs)), "training_runs": float(len(runs)),
            "report_elapsed_s": time.perf_counter() - t0}
        publish.finish_report_run(c, report_run, folder, metrics, own_files)
        publish.annotate_parent(c, sweep, report_run, configs.iloc[0], answer_markdown(ctx),
                                _model_uri(cfg, version))
    except BaseException as err:
        publish.fail_report_run(c, report_run, err)
        raise
    return ReportOutcome(folder, sweep.sweep_id, str(winner["fingerprint"]), str(winner["label"]),
                         report_run, version, created, time.perf_counter() - t0)


def _model_uri(cfg: ReportConfig, version: str) -> str:
    return f"models:/{cfg.registered_model}@{publish.CHAMPION}" if version else ""


def _register(c: Any, uri: str, cfg: ReportConfig, sweep: fetch.Sweep, runs: pd.DataFrame,
              winner: pd.Series, test: Any, report_run: str, workdir: Path,
              notes: list[str]) -> tuple[str, bool]:
    mine = runs[(runs["fingerprint"] == winner["fingerprint"]) & (runs["outcome"] == "finished")]
    if mine.empty:
        notes.append("no finished run of the winner: nothing registered")
        return "", False
    best = mine.sort_values(["best_val_loss", "seed"]).iloc[0]  # chosen on validation
    try:
        loadable = load_winner(c, str(best["run_id"]), workdir, str(winner["fingerprint"]),
                               allowed_tasks(cfg.task))
        return publish.register_winner(c, uri, cfg.registered_model, sweep, winner, best, test,
                                       report_run, loadable, notes)
    except Exception as err:  # the report stands without a registry entry
        log.warning("model not registered: %s: %s", type(err).__name__, err)  # one line
        log.debug("model registration failed", exc_info=True)
        notes.append(f"Model Registry: {type(err).__name__}: {err}")
        return "", False
