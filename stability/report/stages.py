"""The report's stages up to the sealed test, each returning one frozen record.

``fetch_sweep`` (``Fetched``: the sweep's runs and their config aggregates, ranked on
validation) → ``weigh`` (``Evidence``: the equivalence margin, the factor analysis and an
adaptive sweep's replayed looks) → ``decide`` (``Decided``: the winner and every config
against it) → ``examine`` (``Findings``: the step tables, the config table, stability, LR
curves, clipping advice, the plotted runs). Each reads only the records before it; none reads
the test split, which ``pipeline`` opens afterwards for the winner alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from stability.design.margin import Margin
from stability.report.decide import compare, decided, factors, memory, select, spending
from stability.report.decide.steady import Steadied, prefer_stable
from stability.report.decide.table import ConfigTable, StabilityVerdict, VersusWinner
from stability.report.decide.winner import Settings
from stability.report.decide.winner import decide as decide_winner
from stability.report.evidence import adoption, fetch, steps_csv
from stability.report.evidence.trust import allowed_tasks
from stability.report.examine import advice, check_runs, health, layer_norms, lr, val_curves
from stability.report.examine.plotted import Plotted, plotted
from stability.report.options import ReportConfig, ReportError
from stability.report.sealed import evaluate

if TYPE_CHECKING:
    from stability.report.decide.decided import Spent
    from stability.report.decide.factors import Designed, FactorAnalysis
    from stability.report.decide.spending import Sequential, Spending
    from stability.report.decide.winner import Decision
    from stability.report.examine.advice import Recommendation
    from stability.report.examine.layer_norms import LayerNorms
    from stability.report.examine.lr import LrCurve
    from stability.report.examine.val_curves import ValCurves


class NothingToReport(ReportError):
    """The sweep exists but no run finished: there is no winner (exit code 3, not 2)."""


@dataclass(frozen=True, eq=False)
class Fetched:
    """The sweep as read: its runs and their configs, ranked on validation.

    Attributes:
        sweep: the sweep's ids and experiment.
        runs: one row per training run (``fetch.fetch_runs``), within the memory budget.
        configs: ``select.aggregate`` of those runs, lowest validation mean first.
        set_aside: one line per run left out (another sweep's, or over the memory budget).
    """

    sweep: fetch.Sweep
    runs: pd.DataFrame
    configs: pd.DataFrame
    set_aside: tuple[str, ...]

    @property
    def loss_name(self) -> str:
        """The task's loss, on every loss axis and table head."""
        return fetch.loss_name(self.runs)


def _outcomes(runs: pd.DataFrame) -> str:
    counts = runs["outcome"].value_counts()
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items())


def fetch_sweep(c: Any, cfg: ReportConfig) -> Fetched:
    """The sweep, its runs and their config aggregates, within ``cfg.memory_budget_mb``.

    Raises:
        NothingToReport: no run of the sweep finished.
    """
    set_aside: list[str] = []
    sweep = fetch.find_sweep(c, cfg.experiment, cfg.sweep_id)
    runs = fetch.fetch_runs(c, sweep, allowed_tasks(cfg.task), cfg.history_workers, set_aside)
    runs["val_acc_at_best"] = fetch.val_acc_at_best(c, runs, cfg.history_workers)
    configs = select.aggregate(runs, cfg.confidence)
    if not (runs["outcome"] == "finished").any():
        raise NothingToReport(
            f"nothing to recommend: none of the {len(runs)} training runs of sweep "
            f"{sweep.sweep_id!r} finished ({_outcomes(runs)})")
    runs, configs, over = memory.within_budget(runs, configs, cfg.memory_budget_mb,
                                               cfg.confidence)
    return Fetched(sweep=sweep, runs=runs, configs=configs, set_aside=(*set_aside, *over))


@dataclass(frozen=True, eq=False)
class Evidence:
    """What the validation numbers say, before anything is chosen from them.

    Attributes:
        rule: ``report.margin`` as parsed, once (``Margin.parse``): the margin's words.
        margin: the equivalence margin in loss units (``rule`` of the lowest config mean).
        design: the study's design and its runs placed in it (``factors.design``), made once:
            the analysis, the replays, the decision, the stability step, the LR curves and
            the heatmap all read it.
        analysis: the factor effects from every run.
        spending: an adaptive sweep's replayed rounds; None for a fixed grid.
        sequential: an adaptive sweep's replayed verdicts; None for a fixed grid.
        notes: one line if the adaptive or decide plan could not be replayed.
        decided: a decide sweep's last look (the share of alpha its answer spends); None for
            any other sweep.
    """

    rule: Margin
    margin: float
    design: Designed
    analysis: FactorAnalysis | None
    spending: Spending | None
    sequential: Sequential | None
    notes: tuple[str, ...]
    decided: Spent | None = None


def weigh(c: Any, fetched: Fetched, cfg: ReportConfig, rule: Margin | None = None) -> Evidence:
    """The factor analysis and, for an adaptive sweep, the replay of the looks it took.

    ``rule``: ``report.margin`` already parsed (``settle_loadable`` weighs again with it);
    None: parsed here.
    """
    runs, configs = fetched.runs, fetched.configs
    rule = rule if rule is not None else Margin.parse(cfg.margin)
    margin = rule.lowest(configs["loss_mean"])
    designed = factors.design(runs, configs)
    analysis = factors.analyse(runs, configs, margin, cfg.alpha, cfg.confidence, cfg.power,
                               designed=designed)
    notes: list[str] = []
    parent = fetched.sweep.parent_run_id
    spent, sequential = spending.replayed(c, parent, runs, configs, notes, designed)
    looks = decided.of_sweep(c, parent, runs, configs, notes, designed)
    if looks is not None:  # seeds added where a choice was open: no fixed-design verdict holds
        sequential = spending.Sequential(decide=True)
    return Evidence(rule=rule, margin=margin, design=designed, analysis=analysis,
                    spending=spent, sequential=sequential, notes=tuple(notes), decided=looks)


@dataclass(frozen=True, eq=False)
class Decided:
    """The winner, fixed from validation, and every config against it, paired by seed.

    Attributes:
        decision: the factor-by-factor choice of the winner.
        configs: ``Fetched.configs`` with the winner first (``select.put_first``).
        versus: each config against the winner, in that order.
        comparisons: the winner against its named alternatives.
        verdicts: each config's stability verdict by fingerprint (empty until ``steady``).
        steadied: what stability did to a choice that was not stable (``steady.Steadied``);
            None when the choice was stable or was not judged.
    """

    decision: Decision
    configs: pd.DataFrame
    versus: tuple[VersusWinner, ...]
    comparisons: tuple[compare.Comparison, ...]
    verdicts: Mapping[str, StabilityVerdict] = field(default_factory=dict)
    steadied: Steadied | None = None

    @property
    def winner(self) -> pd.Series:
        """The winner's aggregate row."""
        return self.configs.iloc[0]


def decide(fetched: Fetched, evidence: Evidence, cfg: ReportConfig) -> Decided:
    """Choose the winner on validation and compare it with the rest, paired by seed."""
    runs, margin = fetched.runs, evidence.margin
    settings = Settings(margin=margin, alpha=cfg.alpha, cost_tolerance=cfg.cost_tolerance,
                        power=cfg.power)
    decision = decide_winner(runs, fetched.configs, evidence.analysis, settings,
                             spent=evidence.decided, designed=evidence.design)
    return _against(fetched, decision, margin, cfg)


def _against(fetched: Fetched, decision: Decision, margin: float, cfg: ReportConfig,
             verdicts: Mapping[str, StabilityVerdict] | None = None,
             steadied: Steadied | None = None) -> Decided:
    """``decision``'s config first and every config compared with it, paired by seed."""
    runs = fetched.runs
    configs = select.put_first(fetched.configs, decision.fingerprint)  # row 0: the winner
    criteria = compare.Criteria(confidence=cfg.confidence, alpha=cfg.alpha, power=cfg.power,
                                min_effect=cfg.min_effect, min_effect_sd=cfg.min_effect_sd,
                                margin=margin)
    versus = compare.versus(runs, configs, criteria)
    comparisons = compare.comparisons(runs, configs, criteria)
    return Decided(decision=decision, configs=configs, versus=tuple(versus),
                   comparisons=tuple(comparisons), verdicts=dict(verdicts or {}),
                   steadied=steadied)


@dataclass(frozen=True, eq=False)
class Stepped:
    """The judged runs' ``steps.csv``, read once for the stability step and what follows.

    Attributes:
        steps: each judged (finished or diverged) run's table by run id.
        notes: unreadable runs and missing costs, one line each (for "Problems").
    """

    steps: Mapping[str, pd.DataFrame]
    notes: tuple[str, ...]


def read_steps(c: Any, cfg: ReportConfig, fetched: Fetched, dest: Path) -> Stepped:
    """The judged runs' ``steps.csv`` (every verdict reads them; the figures reuse them)."""
    notes: list[str] = []
    steps = _steps(c, cfg, fetched.runs, dest, notes)
    return Stepped(steps=steps, notes=tuple(notes))


def steady(fetched: Fetched, evidence: Evidence, decided: Decided, stepped: Stepped,
           cfg: ReportConfig) -> Decided:
    """The rule's fourth criterion: a marginal or unstable choice gives way to a stable twin.

    Every config's verdict is judged here, once (``examine`` reuses them); when the chosen
    config is not stable, ``steady.prefer_stable`` takes the next config in the rule's order
    that is stable and passes the validation step, and the configs are compared with it.
    """
    runs = fetched.runs
    found = health.verdicts(runs, fetched.configs, dict(stepped.steps), cfg.verdict)
    verdicts = dict(zip(fetched.configs["fingerprint"].astype(str), found, strict=True))
    decision, steadied = prefer_stable(runs, fetched.configs, decided.decision, verdicts,
                                       designed=evidence.design)
    if steadied is None or not steadied.swapped:
        return replace(decided, verdicts=verdicts, steadied=steadied)
    return _against(fetched, decision, evidence.margin, cfg, verdicts, steadied)


def settle_loadable(c: Any, cfg: ReportConfig, fetched: Fetched, evidence: Evidence,
                    decided: Decided) -> tuple[Fetched, Evidence, Decided]:
    """The records again without a winner none of whose finished seeds' checkpoints loads.

    Such a config cannot be tested or registered (a teammate can refuse every checkpoint of a
    config: issue 55, item 7, "split of 0 sequences"): its finished runs become unreadable
    runs, one line names it, and the evidence is weighed and the winner decided again, until
    a winner loads. The test split stays sealed: checkpoints are only read here.

    Raises:
        NothingToReport: no config is left with a run that finished.
    """
    for _ in range(len(fetched.configs)):
        fp = str(decided.winner["fingerprint"])
        with tempfile.TemporaryDirectory(prefix="stability-loadable-") as tmp:
            why = evaluate.unloadable(c, fetched.runs, fp, Path(tmp), cfg.history_workers,
                                      allowed_tasks(cfg.task))
        mine = fetched.runs[(fetched.runs["fingerprint"] == fp)
                            & (fetched.runs["outcome"] == "finished")]
        if len(why) < len(mine):
            return fetched, evidence, decided
        runs = fetched.runs.copy()
        for i in mine.index:
            reason = f"unreadable run: its checkpoint cannot be loaded: {why[runs.at[i, 'run_id']]}"
            runs.loc[i, ["outcome", "reason"]] = [fetch.UNREADABLE, reason[:300]]
        line = (f"config {decided.winner['label']} ({fp}) cannot be the winner: none of its "
                f"{len(mine)} finished runs has a checkpoint that loads (seed "
                f"{int(mine.iloc[0]['seed'])}: {why[mine.iloc[0]['run_id']][:200]})")
        if not (runs["outcome"] == "finished").any():
            raise NothingToReport(f"nothing to recommend: {line}")
        fetched = replace(fetched, runs=runs, configs=select.aggregate(runs, cfg.confidence),
                          set_aside=(*fetched.set_aside, line))
        evidence = weigh(c, fetched, cfg, evidence.rule)
        decided = decide(fetched, evidence, cfg)
    return fetched, evidence, decided


@dataclass(frozen=True, eq=False)
class Findings:
    """What the training runs show about the decided study (validation and steps only).

    Attributes:
        steps: each judged run's ``steps.csv`` by run id.
        configs: one typed row per config, the winner first, with its comparison and verdict.
        lr_curves: one per setting when the learning rate was swept.
        lr_sentences: how each other factor moves the stable LR range.
        advice: the recommended clipping thresholds.
        plotted: the configs the run-level figures show, and their representative runs.
        layer_norms: those runs' per-layer norms; None when no figures are drawn.
        val_curves: the chosen config's and its rivals' validation curves; None when no
            figures are drawn.
        check_lines: a failed ``stability check`` of the same task, if the experiment holds
            one (``check_runs.lines``).
        notes: unreadable runs, missing costs and other users' runs, one line each.
    """

    steps: Mapping[str, pd.DataFrame]
    configs: ConfigTable
    lr_curves: tuple[LrCurve, ...]
    lr_sentences: tuple[str, ...]
    advice: tuple[Recommendation, ...]
    plotted: Plotted
    layer_norms: LayerNorms | None
    val_curves: ValCurves | None
    check_lines: tuple[str, ...]
    notes: tuple[str, ...]


def _steps(c: Any, cfg: ReportConfig, runs: pd.DataFrame, dest: Path,
           notes: list[str]) -> dict[str, pd.DataFrame]:
    """The judged runs' ``steps.csv``; a run that cannot be read is a line in ``notes``."""
    judged = runs[runs["outcome"].isin(["finished", "diverged"])]
    unreadable: dict[str, str] = {}
    steps = steps_csv.steps_tables(c, judged["run_id"], dest, cfg.history_workers,
                                   dict(zip(judged["run_id"], judged["artifact_uri"],
                                            strict=True)),
                                   unreadable)
    notes += [f"run {rid} is unreadable, left out of the stability verdicts: {why}"
              for rid, why in sorted(unreadable.items())]
    notes += [f"run {r.run_id} is unreadable, counted as not finished: {r.reason}"
              for r in runs[runs["outcome"] == fetch.UNREADABLE].itertuples()]
    notes += select.missing_costs(runs)
    return steps


def examine(c: Any, cfg: ReportConfig, fetched: Fetched, evidence: Evidence, decided: Decided,
            cache: Path, stepped: Stepped | None = None) -> Findings:
    """Read the judged runs' steps and build the config table and what is drawn from it.

    Args:
        c: the MLflow client.
        cfg: the report's settings.
        fetched: the sweep's runs.
        evidence: the factor analysis (its references name the LR sentences' levels).
        decided: the winner and the configs against it.
        cache: a scratch folder for the downloads.
        stepped: the steps ``read_steps`` read (None: read them here).
    """
    runs = fetched.runs
    stepped = stepped if stepped is not None else read_steps(c, cfg, fetched, cache / "steps")
    steps = dict(stepped.steps)
    notes: list[str] = list(stepped.notes)
    notes += adoption.other_users(c, fetched.sweep.parent_run_id, runs)
    # Each config's row, once, from what selection and the stability check found (the
    # verdicts judged once, by ``steady``, where it ran).
    found = (tuple(decided.verdicts[str(fp)] for fp in decided.configs["fingerprint"])
             if decided.verdicts else health.verdicts(runs, decided.configs, steps, cfg.verdict))
    table = ConfigTable.assemble(decided.configs, decided.versus, found)
    frame = table.frame()  # for the analyses that read a DataFrame (made once, at assembly)
    curves = lr.curves(runs, frame, designed=evidence.design)
    references = {f.name: f.reference for f in evidence.analysis.factors if f.name != lr.LR} \
        if evidence.analysis is not None else {}
    recs = advice.recommend(runs, frame, steps, cfg.advice, table.winner)
    shown = plotted(table, runs)
    layers, curves_read = None, None
    if cfg.plots:  # only figures read them: not downloaded for a report without figures
        layers = layer_norms.gather(c, [(shown.series[fp], r) for fp, r in shown.rep.items()
                                        if r is not None],
                                    steps, cache / "layers", cfg.history_workers)
        curves_read = val_curves.gather(c, table, runs, fetched.loss_name, cfg.history_workers)
    checks = check_runs.lines(c, fetched.sweep.experiment_id, runs, fetched.sweep.parent_run_id)
    return Findings(steps=steps, configs=table, lr_curves=tuple(curves),
                    lr_sentences=tuple(lr.sentences(curves, references)), advice=tuple(recs),
                    plotted=shown, layer_norms=layers, val_curves=curves_read,
                    check_lines=tuple(checks), notes=tuple(notes))
