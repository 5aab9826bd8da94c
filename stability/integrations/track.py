"""``stability.track``: any training loop recorded as our loop records its runs.

One context manager around a loop the user writes: it builds the run's ``RunRecord``
(``trainer_run.trainer_record``, ``trainer=plain``), opens its ``TrackedRun`` (MLflow, durable),
writes ``steps.csv`` (``CsvStepWriter``) and keeps our loop's diagnostics
(``core.monitor.Diagnostics``) and cost metrics (``core.cost.run_costs``). Given the task's
sections (``config=``), it also writes the ``config.yaml`` the report rebuilds the winner's
model and opens its sealed test split from (``rebuild_config``). ``run.step`` is
``StepMeter.step`` (measure and clip the unscaled gradients, docs/integrations.md) plus the
recording; ``run.epoch`` records the epoch's validation and keeps the best weights
(``checkpoints/best.pt``). On leaving the block the summary goes to MLflow; an exception ends
the run FAILED (KILLED on Ctrl-C), as for our loop's runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from stability.core.assembly import RunAssembly, standard_sinks
from stability.core.config import (
    TASK_SECTIONS,
    ClipConfig,
    ConfigError,
    RunConfig,
    TrackingConfig,
    to_run_config,
)
from stability.core.cost import CostMeter
from stability.core.identity import fingerprint, flatten
from stability.core.measure import StepMeter
from stability.core.monitor import Diagnostics
from stability.core.rundir import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME
from stability.core.steplog import CsvStepWriter, EpochLog, StepLog
from stability.integrations.trainer_run import RunIdentity, trainer_record
from stability.tracking.run import TrackedRun

PLAIN = "plain"  # the ``trainer`` param of a run recorded through ``track``


class LoopRun:
    """The run inside ``with stability.track(...) as run``: ``step`` and ``epoch``.

    Attributes:
        meter: the ``StepMeter`` (the step index, the skips).
        tracked: the MLflow run (``TrackedRun``; its ``run_id`` once created).
        folder: the run folder (``steps.csv``, ``checkpoints/best.pt``, the journal).
    """

    def __init__(self, folder: Path, clip: ClipConfig, scaler: torch.amp.GradScaler | None,
                 tracked: TrackedRun) -> None:
        self.folder, self.tracked, self.scaler = folder, tracked, scaler
        self.meter = StepMeter(clip, scaler)
        self.diagnostics = Diagnostics()
        self.csv = CsvStepWriter(folder / CSV_NAME)
        (folder / CHECKPOINT_NAME).parent.mkdir(parents=True, exist_ok=True)
        assert tracked.sink is not None
        # Our loop's assembly (core.assembly): sinks, epochs, best epoch and summary.
        self.run = RunAssembly(
            standard_sinks(self.diagnostics, csv=self.csv, extras=[tracked.sink]),
            self.diagnostics, CostMeter("cpu"), best_path=folder / CHECKPOINT_NAME)
        self._epoch = 1
        self._samples = 0  # the largest step's samples: the effective batch
        self._t0 = self._last = time.perf_counter()

    def step(self, model: nn.Module, loss: torch.Tensor | float, *, lr: float,
             samples: int = 0, micro_batches: int = 1,
             params: Iterable[nn.Parameter] | None = None) -> StepLog:
        """Measure and clip this step's unscaled gradients (``StepMeter.step``: call between
        ``scaler.unscale_`` and ``scaler.step``; step only if not ``skipped``) and record it.

        The step's time is the time since the previous step (or epoch) ended: the whole
        iteration, batch included.
        """
        log = self.meter.step(model, loss, lr=lr, micro_batches=micro_batches,
                              samples=samples, params=params)
        now = time.perf_counter()
        self.run.step(log, self._epoch, now - self._last)
        self._last = now
        self._samples = max(self._samples, samples)
        return log

    def epoch(self, val_loss: float, val_acc: float = math.nan,
              model: nn.Module | None = None) -> EpochLog:
        """The epoch's record with its validation; a better ``val_loss`` keeps ``model``'s
        weights as ``checkpoints/best.pt`` (what the report rebuilds a winner from)."""
        self.run.keeper.model = model
        record = self.run.epoch(self._epoch, float(val_loss), float(val_acc),
                                time.perf_counter() - self._t0)
        self._epoch += 1
        self._t0 = self._last = time.perf_counter()
        return record

    def summary(self) -> dict[str, Any]:
        """Our loop's summary metrics for this run (docs/TRACKING.md)."""
        steps = self.meter.step_count
        return self.run.summary(self.scaler, self._samples or math.nan, steps, steps, "finished")


def rebuild_config(task: str, seed: int, settings: Mapping[str, object],
                   config: Mapping[str, Mapping[str, Any]]) -> tuple[RunConfig, dict[str, Any]]:
    """The run's config as the report reads a ``config.yaml``: the task, its sections and
    the settings (dotted keys, nested), with our defaults for what is not given.

    Returns:
        The validated ``RunConfig`` (whose ``fingerprint`` becomes the run's) and the plain
        mapping written as ``config.yaml`` (only what was given: no default of our loop).

    Raises:
        ConfigError: one line naming the key: a section or value the config does not take,
            or a setting that is not a config key (it would not tell configs apart).
    """
    raw: dict[str, Any] = {"seed": seed, "task": {"_target_": task}}
    for section, values in config.items():
        if not isinstance(values, Mapping):
            raise ConfigError(f"config[{section!r}]={values!r} is invalid: allowed values are "
                              "a mapping of that section's keys")
        raw[str(section)] = dict(values)
        if section in TASK_SECTIONS:  # the task is built with it, as conf/task/*.yaml says
            raw["task"][str(section)] = f"${{{section}}}"
    for key, value in settings.items():
        section, _, name = str(key).partition(".")
        part = raw.setdefault(section, {})
        if not name or not isinstance(part, dict):
            raise ConfigError(f"settings key {key!r} is invalid: allowed values are dotted "
                              "config keys (clip.max_norm, precision.name...)")
        part[name] = value
    cfg = to_run_config(raw)
    known = flatten(cfg)
    unknown = [k for k in settings if str(k) not in known]
    if unknown:
        raise ConfigError(f"settings key {unknown[0]!r} is invalid with config=: allowed "
                          "values are the run config's dotted keys (clip.max_norm, "
                          "precision.name, train.accum_steps...)")
    return cfg, raw


@contextmanager
def track(folder: str | Path, *, task: str, sweep_id: str, seed: int = 0,
          settings: Mapping[str, object] | None = None, clip: ClipConfig | None = None,
          scaler: torch.amp.GradScaler | None = None, loss_name: str = "loss",
          tracking: TrackingConfig | None = None,
          config: Mapping[str, Mapping[str, Any]] | None = None) -> Iterator[LoopRun]:
    """Record a training loop of your own as one of the study's runs.

    Args:
        folder: the run folder (created).
        task: what is trained, an import path (``task._target_``).
        sweep_id: the study the run belongs to (the report's ``sweep_id``).
        seed: the training seed (seeds of one config share its fingerprint).
        settings: the config's settings (``precision.name``, ``clip.max_norm``...), logged as
            params and hashed into the fingerprint.
        clip: how ``run.step`` clips (default: off; it still measures).
        scaler: the GradScaler (fp16), or None.
        loss_name: what the loss is (axis labels).
        tracking: where the run goes (default: ``./mlflow.db``, experiment ``stability``).
        config: the task's sections as a run config names them (``{"data": {...}}``), so
            that the report can rebuild the winner's model and test it on the sealed split:
            written as ``config.yaml``, and the run's fingerprint is that config's
            (``rebuild_config``; every ``settings`` key must then be a config key). Without
            it the report says in one line that it cannot rebuild the run.

    Yields:
        The ``LoopRun``: ``run.step(model, loss, lr=...)`` per optimizer step,
        ``run.epoch(val_loss, val_acc, model)`` per epoch.
    """
    settings = dict(settings or {})
    rebuilt = None if config is None else rebuild_config(task, seed, settings, config)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if rebuilt is not None:
        (out / CONFIG_NAME).write_text(yaml.safe_dump(rebuilt[1], sort_keys=False))
    identity = RunIdentity(target=task, trainer=PLAIN, settings=settings, seed=seed,
                           sweep_id=sweep_id)
    record = trainer_record(out, identity, loss_name=loss_name, tracking=tracking,
                            fingerprint=None if rebuilt is None else fingerprint(rebuilt[0]))
    t0 = time.perf_counter()
    with TrackedRun(record) as tracked:
        run = LoopRun(out, clip or ClipConfig(enabled=False), scaler, tracked)
        try:
            yield run
        finally:
            run.run.close()
        tracked.finish(run.summary() | {"wall_time_s": time.perf_counter() - t0}, "finished")
