"""``build_report``: fetch → evidence → decide → steady → examine → sealed test → present → publish.

Each stage returns one frozen record (``stages``: ``Fetched``, ``Evidence``, ``Decided``,
``Findings``; then ``WinnerTestResult`` and ``Registered``). Order matters for trust: the
winner is fixed from validation numbers before the test split is opened, and only its runs are
evaluated. The frozen ``Study`` holds the records; every block of report.md is a section that
reads it (``sections.SECTIONS``, rendered by ``render``). A figure or the registry failing is
written into the report as a problem instead of ending it; the report folder is complete
before anything is uploaded, so a tracking failure at the end loses nothing.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stability.report import stages
from stability.report.decide.table import ConfigRow
from stability.report.evidence.trust import allowed_tasks
from stability.report.options import ReportConfig
from stability.report.present.html import to_html
from stability.report.present.render import Header, render, write_sections, write_summary
from stability.report.present.sections.answer import answer_markdown, first_screen
from stability.report.present.study import Registered, Study
from stability.report.publish import describe, publish
from stability.report.sealed.evaluate import WinnerTestResult, evaluate_winner, load_winner
from stability.report.stages import NothingToReport
from stability.tracking.contract import Artifact
from stability.tracking.uri import (
    check_reachable,
    client,
    git_commit,
    redact_uri,
    resolve_tracking_uri,
)

__all__ = ["NothingToReport", "ReportOutcome", "build_report"]

log = logging.getLogger(__name__)


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
class _ReportRun:
    """The report run being written and its places.

    Attributes:
        run_id: the report run (it logs and registers the winner's model).
        folder: the report folder; its ledger names the versions its reports registered.
        scratch: the report's scratch folder for downloads.
    """

    run_id: str
    folder: Path
    scratch: Path


@dataclass(frozen=True)
class _Presented:
    """What ``_present`` wrote into the staging folder."""

    own_files: tuple[str, ...]
    answer: str  # the first screen as plain text


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
    fetched = stages.fetch_sweep(c, cfg)
    evidence = stages.weigh(c, fetched, cfg)
    decided = stages.decide(fetched, evidence, cfg)
    fetched, evidence, decided = stages.settle_loadable(c, cfg, fetched, evidence, decided)
    scratch = tempfile.TemporaryDirectory(prefix="stability-report-")
    cache = Path(scratch.name)
    try:  # the verdicts read every judged run's steps: stability is the rule's last criterion
        stepped = stages.read_steps(c, cfg, fetched, cache / "steps")
        decided = stages.steady(fetched, evidence, decided, stepped, cfg)
    except BaseException:
        scratch.cleanup()
        raise
    winner = decided.winner
    log.info("chosen %s (%s) of %d configs", winner["label"], winner["fingerprint"],
             len(decided.configs))

    sweep = fetched.sweep
    folder = publish.report_folder(Path(cfg.output_dir), sweep.sweep_id)
    commit = git_commit()
    report_run = publish.start_report_run(c, sweep, winner, commit)
    try:
        # The report's files are made in a staging folder and moved into ``folder`` (never
        # written through whatever already sits there); only these files are uploaded.
        with scratch, tempfile.TemporaryDirectory(prefix=".staging-", dir=folder) as staged:
            staging = Path(staged)
            findings = stages.examine(c, cfg, fetched, evidence, decided, cache, stepped)
            publish.tag_findings(c, report_run, findings.configs.winner, list(findings.advice))
            test = _sealed_test(c, cfg, fetched, decided, cache / "winner")
            here = _ReportRun(run_id=report_run, folder=folder, scratch=cache)
            registered = (_register(c, uri, cfg, fetched, findings.configs.winner, test, here)
                          if cfg.register else Registered())
            study = Study(options=cfg, tracking_uri=redact_uri(uri), fetched=fetched,
                          evidence=evidence, decided=decided, findings=findings, test=test,
                          registered=registered)
            presented = _present(study, staging, report_run, commit, t0)
            publish.install(staging, folder, list(presented.own_files))
        metrics = publish.summary_metrics(test) | {
            "winner_best_val_loss_mean": float(winner["loss_mean"]),
            "configs": float(len(findings.configs)), "training_runs": float(len(fetched.runs)),
            "report_elapsed_s": time.perf_counter() - t0}
        publish.finish_report_run(c, report_run, folder, metrics, list(presented.own_files))
        chosen = study.findings.configs.winner
        describe.describe_report_run(c, sweep, report_run, chosen.label,
                                     "\n".join(first_screen(study)))
        publish.annotate_parent(c, sweep, report_run, chosen, answer_markdown(study),
                                study.registered.uri)
    except BaseException as err:
        publish.fail_report_run(c, report_run, err)
        raise
    return ReportOutcome(folder=folder, sweep_id=sweep.sweep_id, winner=str(winner["fingerprint"]),
                         winner_label=str(winner["label"]), report_run_id=report_run,
                         model_version=registered.version, model_created=registered.created,
                         elapsed_s=time.perf_counter() - t0, answer=presented.answer)


def _sealed_test(c: Any, cfg: ReportConfig, fetched: stages.Fetched, decided: stages.Decided,
                 dest: Path) -> WinnerTestResult:
    """The sealed test: opened once, after the winner is fixed, for the winner's seeds only."""
    return evaluate_winner(c, fetched.runs, str(decided.winner["fingerprint"]), dest, cfg.device,
                           cfg.history_workers, allowed_tasks(cfg.task))


def _present(study: Study, staging: Path, report_run: str, commit: str,
             t0: float) -> _Presented:
    """Draw the sections and write summary.csv, report.md and report.html into ``staging``."""
    cfg = study.options
    written = write_sections(study, staging / "plots" if cfg.plots else None)
    header = Header(report_run, study.registered.version, time.perf_counter() - t0,
                    datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), commit)
    write_summary(study.findings.configs, staging / Artifact.SUMMARY_CSV)
    notes = [*study.fetched.set_aside, *study.findings.notes, *study.registered.notes,
             *written.notes, *study.evidence.notes]
    markdown = render(study, written, header, notes)
    (staging / Artifact.REPORT_MD).write_text(markdown)
    (staging / Artifact.REPORT_HTML).write_text(
        to_html(markdown, staging,
                f"Training-stability report: sweep {study.fetched.sweep.sweep_id}"))
    own_files = (Artifact.SUMMARY_CSV, Artifact.REPORT_MD, Artifact.REPORT_HTML,
                 *(f"plots/{f.file}" for f in written.figures))
    return _Presented(own_files, "\n".join(first_screen(study, plain=True)))


def _register(c: Any, uri: str, cfg: ReportConfig, fetched: stages.Fetched, winner: ConfigRow,
              test: WinnerTestResult, here: _ReportRun) -> Registered:
    """Register the winner's best seed (chosen on validation); a failure is one of its notes.

    Args:
        c: the MLflow client.
        uri: the tracking URI it talks to.
        cfg: the report's settings (``registered_model``, ``task``).
        fetched: the sweep's runs.
        winner: the winner's row of the config table.
        test: the winner's sealed test (its numbers become version tags).
        here: the report run that registers it, its folder and its scratch folder (the
            checkpoint is downloaded under ``scratch / "model"``).
    """
    runs = fetched.runs
    notes: list[str] = []
    mine = runs[(runs["fingerprint"] == winner.fingerprint) & (runs["outcome"] == "finished")]
    if mine.empty:
        return Registered(notes=("no finished run of the winner: nothing registered",))
    best = mine.sort_values(["best_val_loss", "seed"]).iloc[0]  # chosen on validation
    try:
        loadable = load_winner(c, str(best["run_id"]), here.scratch / "model",
                               winner.fingerprint, allowed_tasks(cfg.task))
        candidate = publish.Candidate(sweep=fetched.sweep, winner=winner, run=best, test=test,
                                      loadable=loadable, report_run_id=here.run_id,
                                      folder=here.folder)
        version, created = publish.register_winner(c, uri, cfg.registered_model, candidate,
                                                   notes)
    except Exception as err:  # the report stands without a registry entry
        log.warning("model not registered: %s: %s", type(err).__name__, err)  # one line
        log.debug("model registration failed", exc_info=True)
        notes.append(f"Model Registry: {type(err).__name__}: {err}")
        return Registered(notes=tuple(notes))
    model_uri = f"models:/{cfg.registered_model}@{publish.CHAMPION}" if version else ""
    return Registered(version=version, created=created, uri=model_uri, notes=tuple(notes))
