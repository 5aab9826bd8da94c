"""Simulated default-study runs for ``--part scale``: the sweeper's configs, made-up telemetry.

A simulated run is a real training run minus the training: its ``RunConfig`` is composed from
``conf/`` like the sweeper composes a grid point (so its fingerprint and params are what
``python experiments/sweep.py -m`` would log), its per-step and per-epoch records have the
default study's shape (optimizer steps per epoch from the task's real train split, 18 epochs),
its summary comes from the loop's own ``Diagnostics``. ``log_run`` writes it through MLflow's
public client only (``MlflowClient``: runs, tags, params, metrics, artifacts), under the names of
``stability.tracking.contract``. Values are made up (seeded per config and seed) so that the
report has a winner, clipping, fp16 skips and seed noise.
"""

from __future__ import annotations

import copy
import io
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import PROJECT_ROOT
from stability.core.config import ConfigError, RunConfig, to_run_config
from stability.core.identity import fingerprint, flatten
from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME, write_config
from stability.core.monitor import Diagnostics
from stability.core.precision import Precision
from stability.core.steplog import CsvStepWriter, EpochLog, StepLog
from stability.tracking.contract import EPOCH_METRICS, STEP_METRICS, Kind, Outcome, Tag

ACCUM = (1, 2, 4, 8)
PRECISIONS = (Precision.FP32, Precision.FP16, Precision.BF16)
# clip.max_norm values in the order grids add them: the default study's three first.
THRESHOLDS = (1.0, 5.0, 10.0, 2.0, 20.0, 0.5, 1.5, 2.5, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 12.0,
              15.0, 25.0, 30.0, 40.0)
# docs/performance.md
SECONDS_PER_EPOCH = {Precision.FP32: 0.085, Precision.BF16: 0.205, Precision.FP16: 0.475}
Point = tuple[bool, float | None, int, str, int]  # clip.enabled, max_norm, accum, precision, seed


@dataclass(frozen=True)
class Grid:
    """A study grid shaped like the default one: ``thresholds`` max_norm values plus clipping
    off, x accum_steps 1/2/4/8 x fp32/fp16/bf16 x ``seeds`` seeds (12 runs per cell)."""

    thresholds: int
    seeds: int

    @classmethod
    def of(cls, runs: int) -> Grid:
        """The grid of ``runs`` runs: 240 is the default study (3 thresholds, 5 seeds), 720
        adds thresholds 2 and 20 and seeds 5-9, 2400 has 19 thresholds and 10 seeds.

        Raises:
            ConfigError: ``runs`` is not 12 x (thresholds + 1) x seeds for a grid of this family.
        """
        cells = runs // 12 if runs > 0 and runs % 12 == 0 else 0
        for seeds in (10, 5, 2, 1):
            if cells and (seeds < 10 or cells >= 60) and cells % seeds == 0 \
                    and cells // seeds - 1 <= len(THRESHOLDS):
                return cls(cells // seeds - 1, seeds)
        raise ConfigError(f"--scale-runs={runs} is invalid: allowed values are 12 x (thresholds "
                          f"+ 1) x seeds with at most {len(THRESHOLDS)} thresholds, e.g. 24, 48, "
                          "240 (the default study), 720, 2400")

    @property
    def runs(self) -> int:
        """Training runs after de-duplication."""
        return 12 * (self.thresholds + 1) * self.seeds

    def points(self) -> list[Point]:
        """Unique points in the sweeper's order (clipping off once, not once per max_norm)."""
        out: list[Point] = []
        for enabled in (False, True) if self.thresholds else (False,):
            for max_norm in THRESHOLDS[: self.thresholds] if enabled else (None,):
                for accum in ACCUM:
                    for precision in PRECISIONS:
                        out += [(enabled, max_norm, accum, precision, s)
                                for s in range(self.seeds)]
        return out



def overrides(point: Point) -> list[str]:
    """The job's overrides as the sweeper records them (settings that cannot matter dropped)."""
    enabled, max_norm, accum, precision, seed = point
    out = [f"clip.enabled={str(enabled).lower()}"]
    if enabled:
        out.append(f"clip.max_norm={max_norm}")
    return out + [f"train.accum_steps={accum}", f"precision={precision}", f"seed={seed}"]


class Composer:
    """``RunConfig`` of grid points, composed from ``conf/`` once per precision (as the sweeper
    does per config-group choice) with the value overrides applied to a copy.

    Args:
        bases: composed configs by precision (another ``Composer``'s, e.g. in a child process);
            None composes them here.
    """

    def __init__(self, bases: dict[str, Any] | None = None) -> None:
        if bases is None:
            from hydra import compose, initialize_config_dir

            with initialize_config_dir(str(PROJECT_ROOT / "conf"), version_base="1.3"):
                bases = {p: compose("config", overrides=[f"precision={p}"]) for p in PRECISIONS}
        self.bases = bases

    def config(self, point: Point, tracking: dict[str, Any], output_dir: Path) -> RunConfig:
        """The point's config with ``tracking.*`` set (uri, experiment, sweep id, parent)."""
        from omegaconf import OmegaConf, open_dict

        enabled, max_norm, accum, precision, seed = point
        cfg = copy.deepcopy(self.bases[precision])
        with open_dict(cfg):
            cfg.pop("hydra", None)
            cfg.output_dir = str(output_dir)
            cfg.clip.enabled, cfg.train.accum_steps, cfg.seed = enabled, accum, seed
            if enabled:
                cfg.clip.max_norm = max_norm
            for key, value in tracking.items():
                cfg.tracking[key] = value
        return to_run_config(OmegaConf.to_container(cfg, resolve=True))


@dataclass(frozen=True)
class Template:
    """What every simulated run shares, prepared once: the composed configs, the size of the
    task's train split, and the bytes of a real checkpoint of the (one) model shape."""

    bases: dict[str, Any]
    train_size: int
    checkpoint: bytes

    @classmethod
    def build(cls) -> Template:
        """Compose the configs, build the task's split once, save one model's weights."""
        import torch

        from stability.core.batches import task_of

        composer = Composer()
        cfg = composer.config(Grid(0, 1).points()[0], {}, Path("."))
        task = task_of(cfg)
        buf = io.BytesIO()
        torch.save(task.model().state_dict(), buf)
        return cls(composer.bases, len(task.train_val()[0]), buf.getvalue())


@dataclass
class Records:
    """What a run's loop would have produced: steps (with their epoch), epochs, summary."""

    steps: list[tuple[int, StepLog]] = field(default_factory=list)
    epochs: list[EpochLog] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def optimizer_steps_per_epoch(cfg: RunConfig, train_size: int) -> int:
    """Windows per epoch (``core.batches.windows``): the last one may be short."""
    batches = math.ceil(train_size / cfg.train.batch_size)
    return math.ceil(batches / cfg.train.accum_steps)


def _target_loss(cfg: RunConfig, rng: random.Random) -> float:
    """The run's best validation loss: precision, accumulation, clipping, then seed noise."""
    shift = {Precision.FP32: 0.0, Precision.BF16: 0.01, Precision.FP16: 0.02}
    base = 0.20 + shift[cfg.precision.name]
    base += 0.015 * math.log2(cfg.train.accum_steps)
    if cfg.clip.enabled:  # a tight threshold slows learning, a moderate one helps a little
        base += 0.03 / cfg.clip.max_norm - 0.01 * math.exp(-abs(math.log(cfg.clip.max_norm / 5)))
    return base + rng.gauss(0.0, 0.01)


def records(cfg: RunConfig, train_size: int) -> Records:
    """Fabricated but consistent records of one run (deterministic per config and seed).

    Pre-clip norms are log-normal around the clip-off medians measured on the default study
    (5.3 at accum_steps 1 to 2.5 at 8, conf/config.yaml); fp16 skips its first few steps while
    the GradScaler halves its 2^16 start, as real runs do.
    """
    rng = random.Random(f"{fingerprint(cfg)}-{cfg.seed}")
    spe, epochs = optimizer_steps_per_epoch(cfg, train_size), cfg.train.epochs
    fp16 = Precision(cfg.precision.name).scaled
    scale, settle = (2.0**16, rng.randint(3, 6)) if fp16 else (1.0, 0)
    target = _target_loss(cfg, rng)
    median_norm = 5.3 * cfg.train.accum_steps ** -0.36
    out, diag, skips, step = Records(), Diagnostics(), 0, 0
    best = (math.inf, 0, math.nan)
    for epoch in range(1, epochs + 1):
        losses, norms, clipped_n, skipped_n = [], [], 0, 0
        for _ in range(spe):
            step += 1
            skipped = step <= settle
            skips += skipped
            norm = math.inf if skipped else median_norm * math.exp(rng.gauss(0.0, 0.75))
            clipped = cfg.clip.enabled and not skipped and norm > cfg.clip.max_norm
            loss = target + (0.69 - target) * math.exp(-step / (2.0 * spe)) + rng.gauss(0, 0.03)
            s = StepLog(step=step, lr=cfg.train.lr, grad_l2_pre_clip=norm,
                        grad_l2_post_clip=cfg.clip.max_norm if clipped else norm, loss=loss,
                        skipped=skipped, skip_reason="nonfinite_grad" if skipped else "",
                        scaler_scale=scale, clipped=clipped, micro_batches=cfg.train.accum_steps,
                        samples=cfg.train.batch_size * cfg.train.accum_steps,
                        skips_cumulative=skips,
                        underflow_frac=rng.uniform(0.0, 0.02) if fp16 and step % 25 == 0
                        else math.nan)
            scale = scale / 2 if skipped else scale
            diag.on_step(s)
            out.steps.append((epoch, s))
            clipped_n, skipped_n = clipped_n + clipped, skipped_n + skipped
            if not skipped:
                losses.append(loss)
                norms.append(norm)
        val = target + (0.69 - target) * math.exp(-epoch / 3.0) + abs(rng.gauss(0, 0.004))
        acc = min(0.99, 1.15 - val)
        out.epochs.append(EpochLog(epoch, sum(losses) / len(losses) if losses else math.nan, val,
                                   acc, clipped_n / spe, max(norms, default=math.nan),
                                   skipped_n, spe, SECONDS_PER_EPOCH[cfg.precision.name]))
        if val < best[0]:
            best = (val, epoch, acc)
    out.summary = diag.summary() | {
        "best_val_loss": best[0], "best_epoch": best[1], "best_val_acc": best[2],
        "final_scaler_scale": scale if fp16 else 1.0, "diverged": 0,
        "effective_batch": cfg.train.batch_size * cfg.train.accum_steps,
        "optimizer_steps": step, "grad_syncs": 0, "skip_alerts": 0,
        "wall_time_s": epochs * SECONDS_PER_EPOCH[cfg.precision.name] + 0.5}
    return out


def log_run(c: Any, experiment_id: str, cfg: RunConfig, point: Point, rec: Records,
            checkpoint: bytes, parent_run_id: str) -> str:
    """Write one simulated run through MLflow's public client, as docs/TRACKING.md lays it out.

    The run folder (``cfg.output_dir``) gets ``steps.csv``, ``config.yaml`` and
    ``checkpoints/best.pt``, uploaded as artifacts. MLflow gets the contract's tags and params,
    every per-epoch metric, the summary and each per-step metric's last value: the report reads
    the per-step history from ``steps.csv``, never from MLflow, so the per-step points are not
    sent (their cost is the ingest rate's, measured on its own).

    Returns:
        The run id.
    """
    from mlflow.entities import Metric, Param

    out = Path(cfg.output_dir)
    (out / CHECKPOINT_NAME).parent.mkdir(parents=True, exist_ok=True)
    write_config(cfg, out / CONFIG_NAME)
    (out / CHECKPOINT_NAME).write_bytes(checkpoint)
    csv = CsvStepWriter(out / CSV_NAME)
    for epoch, s in rec.steps:
        csv.on_step(s, epoch)
    csv.close()
    tags = {Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: cfg.tracking.sweep_id or "",
            Tag.FINGERPRINT: fingerprint(cfg), Tag.SEED: str(cfg.seed),
            Tag.OVERRIDES: " ".join(overrides(point)), Tag.OUTCOME: Outcome.FINISHED,
            Tag.PARENT_RUN_ID: parent_run_id, Tag.OUTPUT_DIR: str(out)}
    run_id = c.create_run(experiment_id, tags={str(k): str(v) for k, v in tags.items()},
                          run_name=f"simulated s={cfg.seed}").info.run_id
    params = [Param(k, str(v)) for k, v in flatten(cfg).items()
              if k != "output_dir" and not k.startswith("tracking.")]
    ts = int(time.time() * 1000)
    last = rec.steps[-1][1]
    metrics = [Metric(k, float(getattr(last, k)), ts, last.step) for k in STEP_METRICS]
    metrics += [Metric(name, float(getattr(e, field)), ts, e.epoch)
                for e in rec.epochs for name, field in EPOCH_METRICS.items()]
    metrics += [Metric(k, float(v), ts, 0) for k, v in rec.summary.items()
                if isinstance(v, int | float) and not isinstance(v, bool)]  # as TrackedRun
    for i in range(0, len(params), 100):  # MLflow's limit of params a call
        c.log_batch(run_id, params=params[i:i + 100])
    c.log_batch(run_id, metrics=metrics)
    for name in (CSV_NAME, CONFIG_NAME):
        c.log_artifact(run_id, str(out / name))
    c.log_artifact(run_id, str(out / CHECKPOINT_NAME),
                   artifact_path=str(Path(CHECKPOINT_NAME).parent))
    c.set_terminated(run_id, status=Outcome.FINISHED.status)
    return run_id
