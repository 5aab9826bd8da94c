"""The config table: one typed row per config, ranked, the winner first.

``ConfigRow`` is the schema of a config's row: its settings and seed counts, its aggregates
over seeds (``select.aggregate``), its paired comparison with the winner (``VersusWinner``,
from ``compare.versus``) and its stability verdict (``StabilityVerdict``, from
``health.verdicts``). The pipeline assembles each row once from those parts
(``ConfigTable.assemble``); sections read typed attributes. Each field's name is the column
name of ``summary.csv`` and of ``ConfigTable.frame()``: the table's DataFrame for what needs
pandas (figures, the factor design, CSV export), made once at assembly from the same parts as
the rows (never rebuilt from them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pandas as pd


def _col(doc: str, csv: bool = True) -> Any:
    """A schema field: ``doc`` says what it holds; ``csv`` puts it in ``summary.csv``."""
    return field(metadata={"doc": doc, "csv": csv})


@dataclass(frozen=True)
class VersusWinner:
    """A config's paired comparison with the winner (NaN / False / "winner" on the winner's row).

    Attributes:
        n_paired: seeds both configs finished.
        diff_vs_winner: mean per-seed difference, this config minus the winner.
        p_vs_winner: paired t-test p, unadjusted.
        p_wilcoxon_vs_winner: Wilcoxon signed-rank p, unadjusted.
        mdd_vs_winner: the smallest difference those paired seeds detect with the set power.
        within_ci: the mean lies inside the winner's CI.
        within_noise: the paired t-test is not significant at alpha.
        p_adj_vs_winner: the paired t p, selection-adjusted.
        p_equiv_vs_winner: the TOST p, selection-adjusted (NaN with unfinished seeds).
        verdict_vs_winner: helps / hurts / equivalent / undecided, or "winner".
    """

    n_paired: int
    diff_vs_winner: float
    p_vs_winner: float
    p_wilcoxon_vs_winner: float
    mdd_vs_winner: float
    within_ci: bool
    within_noise: bool
    p_adj_vs_winner: float
    p_equiv_vs_winner: float
    verdict_vs_winner: str


@dataclass(frozen=True)
class StabilityVerdict:
    """A config's stability verdict, worst seed wins.

    Attributes:
        stability: stable / marginal / unstable / not judged.
        stability_reason: what made it so, with the seeds that showed it.
    """

    stability: str
    stability_reason: str


@dataclass(frozen=True)
class ConfigRow:
    """One config of the study: settings, aggregates over seeds, comparison, stability.

    The field order is the column order of ``summary.csv`` (fields with ``csv`` set), then
    the rest; each field's ``metadata["doc"]`` says what it holds.
    """

    rank: int = _col("1 = lowest mean best validation loss (the selection rule's order)")
    label: str = _col("readable config name, e.g. ``fp16 clip=1 acc=4``")
    fingerprint: str = _col("the config's hash: everything but the seed")
    precision: str = _col("fp32 / bf16 / fp16")
    clip_enabled: bool = _col("gradient clipping on")
    clip_method: str = _col("norm / value")
    max_norm: float = _col("clipping threshold; NaN unless norm clipping is on")
    accum_steps: int = _col("micro-batches accumulated per optimizer step")
    seeds: int = _col("seeds recorded")
    seeds_finished: int = _col("seeds that finished")
    seeds_diverged: int = _col("seeds that diverged")
    seeds_failed: int = _col("seeds that failed, were killed or are still running")
    seeds_missing: int = _col("seeds of the sweep this config has no run for")
    flag: str = _col("missing or unfinished seeds, in words; empty when none")
    loss_mean: float = _col("mean best validation loss over seeds (+inf if one did not finish)")
    loss_std: float = _col("its standard deviation over seeds")
    loss_ci_low: float = _col("lower end of its confidence interval")
    loss_ci_high: float = _col("upper end of its confidence interval")
    acc_mean: float = _col("mean validation accuracy at the best epoch, finished seeds")
    acc_std: float = _col("its standard deviation over seeds")
    acc_ci_low: float = _col("lower end of its confidence interval")
    acc_ci_high: float = _col("upper end of its confidence interval")
    clip_fraction_mean: float = _col("mean fraction of steps clipped")
    clip_fraction_std: float = _col("its standard deviation over seeds")
    skip_count_mean: float = _col("mean optimizer steps skipped (GradScaler)")
    skip_count_std: float = _col("its standard deviation over seeds")
    underflow_mean: float = _col("mean fp16 gradient underflow fraction")
    wall_time_s_mean: float = _col("mean run wall time, seconds")
    wall_time_s_median: float = _col("median run wall time over seeds, seconds")
    wall_time_s_max: float = _col("slowest seed's wall time, seconds")
    n_paired: int = _col("seeds finished by both it and the winner")
    diff_vs_winner: float = _col("mean per-seed difference, this config minus the winner")
    p_vs_winner: float = _col("paired t-test p against the winner, unadjusted")
    p_wilcoxon_vs_winner: float = _col("Wilcoxon signed-rank p against the winner")
    mdd_vs_winner: float = _col("smallest difference the paired seeds detect")
    within_ci: bool = _col("mean inside the winner's CI")
    within_noise: bool = _col("paired t-test not significant at alpha")
    stability: str = _col("stable / marginal / unstable / not judged")
    stability_reason: str = _col("what made it so, with the seeds that showed it")
    seed_list: str = _col("the seeds recorded, space-separated")
    underflow_std: float = _col("standard deviation of the fp16 underflow fraction", csv=False)
    wall_time_s_std: float = _col("standard deviation of the wall time", csv=False)
    train_seconds: float = _col("median training seconds: step time x optimizer steps",
                                csv=False)
    peak_memory_mb: float = _col("median peak memory, MB (NaN where not measured)", csv=False)
    p_adj_vs_winner: float = _col("paired t p against the winner, selection-adjusted",
                                  csv=False)
    p_equiv_vs_winner: float = _col("TOST p against the winner, selection-adjusted", csv=False)
    verdict_vs_winner: str = _col("helps / hurts / equivalent / undecided; winner", csv=False)

    @property
    def unfinished(self) -> int:
        """Seeds that diverged or failed."""
        return self.seeds_diverged + self.seeds_failed


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ConfigRow))
SUMMARY_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ConfigRow) if f.metadata["csv"])
_PARTS = {f.name for f in fields(VersusWinner)} | {f.name for f in fields(StabilityVerdict)}
AGGREGATE_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in _PARTS)


@dataclass(frozen=True)
class ConfigTable:
    """The study's configs, ranked by the decision: the winner first, then by rank.

    Attributes:
        rows: one ``ConfigRow`` per config.
    """

    rows: tuple[ConfigRow, ...]
    table: pd.DataFrame | None = field(default=None, compare=False, repr=False)

    @classmethod
    def assemble(cls, aggregates: pd.DataFrame, versus: Sequence[VersusWinner],
                 verdicts: Sequence[StabilityVerdict]) -> ConfigTable:
        """Each row once, from the stages' parts, in ``aggregates``' order (the winner first).

        Args:
            aggregates: ``select.aggregate`` with the winner put first (``select.put_first``).
            versus: each config's comparison with the winner (``compare.versus``), aligned.
            verdicts: each config's stability verdict (``health.verdicts``), aligned.
        """
        records = aggregates.to_dict("records")
        parts = [asdict(v) | asdict(s) for v, s in zip(versus, verdicts, strict=True)]
        rows = [ConfigRow(**{k: rec[k] for k in AGGREGATE_COLUMNS}, **part)
                for rec, part in zip(records, parts, strict=True)]
        return cls(tuple(rows), pd.DataFrame([rec | part for rec, part in zip(records, parts,
                                                                              strict=True)],
                                             columns=list(COLUMNS)))

    @property
    def winner(self) -> ConfigRow:
        """The decided winner (row 0)."""
        return self.rows[0]

    @property
    def others(self) -> tuple[ConfigRow, ...]:
        """Every config but the winner, in rank order."""
        return self.rows[1:]

    @property
    def lowest(self) -> ConfigRow:
        """The config with the lowest validation mean (rank 1)."""
        return min(self.rows, key=lambda r: r.rank)

    def row(self, fingerprint: str) -> ConfigRow:
        """The row of one config (KeyError if the study has none)."""
        for r in self.rows:
            if r.fingerprint == fingerprint:
                return r
        raise KeyError(fingerprint)

    def __iter__(self) -> Iterator[ConfigRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self) -> pd.DataFrame:
        """A DataFrame with exactly the schema's columns, one row per config, in table order.

        A copy of the one made at assembly (a table made of rows alone makes it from them).
        """
        if self.table is None:
            return pd.DataFrame([asdict(r) for r in self.rows], columns=list(COLUMNS))
        return self.table.copy()

    def summary(self) -> pd.DataFrame:
        """``summary.csv``'s table: the csv columns and ``winner`` (the decision's choice, the
        first row; ``rank`` is the validation-mean order, whose 1 may be another config)."""
        out = self.frame()[list(SUMMARY_COLUMNS)]
        return out.assign(winner=out["fingerprint"] == self.winner.fingerprint)

