"""What a benchmark run measures: validated settings and the ``RunConfig`` of every variant."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stability.core.config import (
    PRECISIONS,
    ClipConfig,
    PrecisionConfig,
    RunConfig,
    TelemetryConfig,
    TrackingConfig,
    TrainConfig,
)
from stability.core.precision import Precision
from stability.core.validation import Errors
from stability.tasks.sign_sum import DataConfig

PARTS = ("overhead", "memory", "precision", "accum", "study", "scale")
# study needs a finished sweep; scale (benchmarks/scale.py) takes ~10 minutes at 2400 runs
DEFAULT_PARTS = ("overhead", "memory", "precision", "accum")
ACCUM_VALUES = (1, 2, 4, 8, 16)

# The overhead targets, in one place so the JSON, the table and the docs agree.
TARGETS = {
    "instrumented_ratio": 1.03,  # TrainStep + telemetry + steps.csv, per epoch, vs bare
    "per_layer_ratio": 1.03,  # ... + telemetry.per_layer, per epoch, vs instrumented
    "tracked_ratio": 1.10,  # ... + per-step metrics to a real MLflow server, vs bare
    "tracked_sqlite_ratio": 1.10,  # the same on the embedded SQLite store, wall
    "tracked_sqlite_cpu_run": 1.15,  # ... its CPU s/run vs bare
    "fixed_cost_s": 0.5,  # per run in a sweep worker: everything that is not epochs
    "study_ratio": 1.3,  # study wall time vs (sum of bare training time) / cores
    "memory_ratio": 1.2,  # peak RSS of a run vs the bare loop's
    "report_10x_s": 300.0,  # the report of a 2400-run sweep (10x the default study), seconds
}
# Targets that are floors, not ceilings.
FLOORS = {
    "ingest_points_per_s": 50_000,  # per-step points a second into one tracking server
}


@dataclass(frozen=True)
class BenchSpec:
    """Settings shared by every part of one benchmark run.

    Attributes:
        reps: interleaved repetitions per variant (A B A B ...).
        epochs: epochs per repetition; with 2 or more the first is a warm-up and dropped. The
            default is the default config's ``train.epochs``: per-epoch figures are those of a
            real run (a tracked run's first-epoch send and its batching included).
        precision_epochs: epochs per repetition of the per-precision part (at most ``epochs``;
            fp16 on a CPU is slow).
        accum_rounds: rounds of the accumulation curve (one epoch per setting each).
        num_samples: sequences in the synthetic data set (70% of them train).
        precision: precision of the overhead and memory variants.
        accum_steps: accumulation of the overhead and memory variants.
        max_norm: global-norm clipping threshold (clipping is on in every variant).
        seed: training seed.
    """

    reps: int = 5
    epochs: int = 18
    precision_epochs: int = 3
    accum_rounds: int = 11
    num_samples: int = 3000
    precision: str = Precision.FP32.value
    accum_steps: int = 4
    max_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        e = Errors()  # every invalid option at once (stability.core.validation)
        for key in ("reps", "epochs", "precision_epochs", "accum_rounds", "accum_steps"):
            value = getattr(self, key)
            e.require(isinstance(value, int) and value >= 1, f"--{key.replace('_', '-')}", value,
                      "an integer >= 1")
        e.require(self.num_samples >= 20, "--num-samples", self.num_samples, "an integer >= 20")
        e.require(self.precision in PRECISIONS, "--precision", self.precision,
                  " | ".join(PRECISIONS))
        e.require(self.max_norm > 0, "--max-norm", self.max_norm, "a number > 0")
        e.raise_if_any()

    def run_config(self, output_dir: str, *, precision: str | None = None,
                   accum_steps: int | None = None, epochs: int | None = None,
                   tracking: TrackingConfig | None = None, per_layer: bool = False) -> RunConfig:
        """The ``RunConfig`` a variant trains (one CPU thread, clipping on, tracking off).

        ``telemetry.per_layer`` is off unless asked for (the default run has it on), so the
        ``instrumented`` figures stay comparable across versions and the per-layer norms are
        measured as a variant of their own.

        Args:
            output_dir: where ``steps.csv``, ``config.yaml`` and the checkpoint go.
            precision: overrides ``self.precision``.
            accum_steps: overrides ``self.accum_steps``.
            epochs: overrides ``self.epochs``.
            tracking: tracking settings; ``None`` disables tracking.
            per_layer: record every parameter's gradient norm (``layer_norms.csv``).
        """
        name = precision or self.precision
        prec = PrecisionConfig(name=name)  # the one default growth_interval
        return RunConfig(
            seed=self.seed,
            device="auto",
            data=DataConfig(num_samples=self.num_samples),
            precision=prec,
            clip=ClipConfig(enabled=True, method="norm", max_norm=self.max_norm),
            train=TrainConfig(epochs=epochs or self.epochs,
                              accum_steps=accum_steps or self.accum_steps, threads=1),
            tracking=tracking or TrackingConfig(enabled=False),
            telemetry=TelemetryConfig(per_layer=per_layer),
            output_dir=output_dir,
        )

    def kept(self, epoch_seconds: list[float]) -> list[float]:
        """Per-epoch seconds without the warm-up epoch (kept when it is the only one)."""
        return epoch_seconds[1:] if len(epoch_seconds) > 1 else list(epoch_seconds)

    def replace(self, **changes: object) -> BenchSpec:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)
