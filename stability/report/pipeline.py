"""``build_report``: fetch → select on validation → sealed test → sections → render → publish.

Order matters for trust: the winner is fixed from validation numbers before the test split is
opened, and only its runs are evaluated. The frozen ``Study`` is assembled once from those
stages; every block of report.md is a section that reads it (``sections.SECTIONS``). A figure
or the registry failing is written into the report as a problem instead of ending it; the
report folder is complete before anything is uploaded, so a tracking failure at the end loses
nothing.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from stability.design.margin import Margin
from stability.report import (
    adoption,
    advice,
    compare,
    describe,
    factors,
    fetch,
    health,
    lr,
    memory,
    publish,
    select,
    steps_csv,
)
from stability.report.evaluate import evaluate_winner, load_winner
from stability.report.html import to_html
from stability.report.options import ReportConfig, ReportError
from stability.report.render import Header, render, write_sections, write_summary
from stability.report.sections import spending
from stability.report.sections.answer import answer_markdown, first_screen
from stability.report.study import Study
from stability.report.table import ConfigRow, ConfigTable, VersusWinner
from stability.report.trust import allowed_tasks
from stability.report.winner import Decision
from stability.report.winner import decide as decide_winner
from stability.tracking.contract import Artifact
from stability.tracking.uri import (
    check_reachable,
    client,
    git_commit,
    redact_uri,
    resolve_tracking_uri,
)

log = logging.getLogger(__name__)


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
    answer: str = ""  # the first screen as plain text (sections.answer.first_screen)


@dataclass(frozen=True)
class _Selected:
    """What validation decided, before the test split is opened."""

    margin: float
    analysis: factors.FactorAnalysis
    decided: Decision
    configs: pd.DataFrame  # select.aggregate, the winner first
    versus: tuple[VersusWinner, ...]  # each config against the winner, in that order
    comparisons: list[compare.Comparison]


def _fetch(c: Any, cfg: ReportConfig,
           set_aside: list[str]) -> tuple[fetch.Sweep, pd.DataFrame, pd.DataFrame]:
    """The sweep, its runs and their config table (ranked on validation); a line into
    ``set_aside`` per run tagged with the sweep's id that is not the sweep's own."""
    sweep = fetch.find_sweep(c, cfg.experiment, cfg.sweep_id)
    runs = fetch.fetch_runs(c, sweep, allowed_tasks(cfg.task), cfg.history_workers, set_aside)
    runs["val_acc_at_best"] = fetch.val_acc_at_best(c, runs, cfg.history_workers)
    configs = select.aggregate(runs, cfg.confidence)
    if not (runs["outcome"] == "finished").any():
        raise NothingToReport(
            f"nothing to recommend: none of the {len(runs)} training runs of sweep "
            f"{sweep.sweep_id!r} finished ({_outcomes(runs)})")
    return sweep, runs, configs


def _select(runs: pd.DataFrame, configs: pd.DataFrame, cfg: ReportConfig) -> _Selected:
    """Choose the winner on validation and compare it with the rest, paired by seed."""
    # The margin scales with the lowest config mean, before anything is chosen from it.
    margin = Margin.parse(cfg.margin).of(float(configs.iloc[0]["loss_mean"]))
    analysis = factors.analyse(runs, configs, margin, cfg.alpha, cfg.confidence, cfg.power)
    decided = decide_winner(runs, configs, analysis, margin, cfg.alpha, cfg.cost_tolerance)
    configs = select.put_first(configs, decided.fingerprint)  # row 0 is the winner from here on
    versus = compare.versus(runs, configs, cfg.confidence, cfg.alpha, cfg.power, margin)
    comparisons = compare.comparisons(runs, configs, cfg.confidence, cfg.alpha, cfg.power,
                                      cfg.min_effect, cfg.min_effect_sd, margin)
    return _Selected(margin, analysis, decided, configs, versus, comparisons)


def _steps(c: Any, cfg: ReportConfig, runs: pd.DataFrame, dest: Path,
           notes: list[str]) -> dict[str, pd.DataFrame]:
    """The judged runs' ``steps.csv``; a run that cannot be read is a line in ``notes``."""
    judged = runs[runs["outcome"].isin(["finished", "diverged"])]
    unreadable: dict[str, str] = {}
    steps = steps_csv.steps_tables(c, judged["run_id"], dest, cfg.history_workers,
                               dict(zip(judged["run_id"], judged["artifact_uri"], strict=True)),
                               unreadable)
    notes += [f"run {rid} is unreadable, left out of the stability verdicts: {why}"
              for rid, why in sorted(unreadable.items())]
    notes += [f"run {r.run_id} is unreadable, counted as not finished: {r.reason}"
              for r in runs[runs["outcome"] == fetch.UNREADABLE].itertuples()]
    notes += select.missing_costs(runs)
    return steps


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
    set_aside: list[str] = []
    sweep, runs, configs = _fetch(c, cfg, set_aside)
    runs, configs, over = memory.within_budget(runs, configs, cfg.memory_budget_mb,
                                               cfg.confidence)
    set_aside += over
    chosen = _select(runs, configs, cfg)
    winner = chosen.configs.iloc[0]
    log.info("winner %s (%s) of %d configs", winner["label"], winner["fingerprint"],
             len(chosen.configs))

    folder = publish.report_folder(Path(cfg.output_dir), sweep.sweep_id)
    commit = git_commit()
    report_run = publish.start_report_run(c, sweep, winner, commit)
    notes: list[str] = list(set_aside)
    try:
        # The report's files are made in a staging folder and moved into ``folder`` (never
        # written through whatever already sits there); only these files are uploaded.
        with tempfile.TemporaryDirectory(prefix="stability-report-") as tmp, \
                tempfile.TemporaryDirectory(prefix=".staging-", dir=folder) as staged:
            cache, staging = Path(tmp), Path(staged)
            steps = _steps(c, cfg, runs, cache / "steps", notes)
            notes += adoption.other_users(c, sweep.parent_run_id, runs)
            # Each config's row, once, from what selection and the stability check found.
            table = ConfigTable.assemble(chosen.configs, chosen.versus,
                                         health.verdicts(runs, chosen.configs, steps, cfg.verdict))
            configs = table.frame()  # for the analyses that read a DataFrame
            lr_found = lr.curves(runs, configs)
            lr_text = lr.sentences(lr_found, {f.name: f.reference
                                              for f in chosen.analysis.factors if f.name != lr.LR})
            recs = advice.recommend(runs, configs, steps, cfg.advice, table.winner)
            publish.tag_findings(c, report_run, table.winner, recs)
            # The sealed test: opened once, after selection, for the winner's seeds only.
            test = evaluate_winner(c, runs, str(winner["fingerprint"]), cache / "winner",
                                   cfg.device, cfg.history_workers, allowed_tasks(cfg.task))
            version, created = "", False
            if cfg.register:
                version, created = _register(c, uri, cfg, sweep, runs, table.winner, test,
                                             report_run, cache / "model", notes)
            replay_notes: list[str] = []
            spent, sequential = spending.replayed(c, sweep.parent_run_id, runs, configs,
                                                  replay_notes)
            study = Study(sweep=sweep, tracking_uri=redact_uri(uri), options=cfg, client=c,
                          cache=cache, runs=runs, configs=table, steps=steps,
                          loss_name=fetch.loss_name(runs), margin=chosen.margin,
                          analysis=chosen.analysis, decision=chosen.decided,
                          comparisons=tuple(chosen.comparisons), advice=tuple(recs),
                          lr_curves=tuple(lr_found), lr_sentences=tuple(lr_text),
                          spending=spent, sequential=sequential, test=test,
                          model_version=version, model_uri=_model_uri(cfg, version))
            written = write_sections(study, staging / "plots" if cfg.plots else None)
            header = Header(report_run, version, time.perf_counter() - t0,
                            datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), commit)
            write_summary(table, staging / Artifact.SUMMARY_CSV)
            markdown = render(study, written, header, [*notes, *written.notes, *replay_notes])
            answer = "\n".join(first_screen(study, plain=True))
            (staging / Artifact.REPORT_MD).write_text(markdown)
            (staging / Artifact.REPORT_HTML).write_text(
                to_html(markdown, staging, f"Training-stability report: sweep {sweep.sweep_id}"))
            own_files = [Artifact.SUMMARY_CSV, Artifact.REPORT_MD, Artifact.REPORT_HTML,
                         *(f"plots/{f.file}" for f in written.figures)]
            publish.install(staging, folder, own_files)
        metrics = publish.summary_metrics(test) | {
            "winner_best_val_loss_mean": float(winner["loss_mean"]),
            "configs": float(len(table)), "training_runs": float(len(runs)),
            "report_elapsed_s": time.perf_counter() - t0}
        publish.finish_report_run(c, report_run, folder, metrics, own_files)
        describe.describe_report_run(c, sweep, report_run, table.winner.label,
                                     "\n".join(first_screen(study)))
        publish.annotate_parent(c, sweep, report_run, table.winner, answer_markdown(study),
                                study.model_uri)
    except BaseException as err:
        publish.fail_report_run(c, report_run, err)
        raise
    return ReportOutcome(folder, sweep.sweep_id, str(winner["fingerprint"]), str(winner["label"]),
                         report_run, version, created, time.perf_counter() - t0, answer)


def _model_uri(cfg: ReportConfig, version: str) -> str:
    return f"models:/{cfg.registered_model}@{publish.CHAMPION}" if version else ""


def _register(c: Any, uri: str, cfg: ReportConfig, sweep: fetch.Sweep, runs: pd.DataFrame,
              winner: ConfigRow, test: Any, report_run: str, workdir: Path,
              notes: list[str]) -> tuple[str, bool]:
    mine = runs[(runs["fingerprint"] == winner.fingerprint) & (runs["outcome"] == "finished")]
    if mine.empty:
        notes.append("no finished run of the winner: nothing registered")
        return "", False
    best = mine.sort_values(["best_val_loss", "seed"]).iloc[0]  # chosen on validation
    try:
        loadable = load_winner(c, str(best["run_id"]), workdir, winner.fingerprint,
                               allowed_tasks(cfg.task))
        return publish.register_winner(c, uri, cfg.registered_model, sweep, winner, best, test,
                                       report_run, loadable, notes)
    except Exception as err:  # the report stands without a registry entry
        log.warning("model not registered: %s: %s", type(err).__name__, err)  # one line
        log.debug("model registration failed", exc_info=True)
        notes.append(f"Model Registry: {type(err).__name__}: {err}")
        return "", False
