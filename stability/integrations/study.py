"""A trainer we do not own as a backend (``Trainer``): Lightning, the HF Trainer, or one you
register (``backends``).

``stability sweep`` hands every point to its task's backend (``backends.of``); a trainer's is a
``Trainer`` around the trainer's half (``protocol.TrainerBackend``), trained here with the same
``RunConfig`` in and the same ``RunResult`` out as our loop. The point's settings become the
trainer's own arguments (``lightning.trainer_settings``, ``hf.training_arguments``, plus seed,
epochs and lr), the trainer's ``StabilityCallback`` records every step into the run's sinks (the
MLflow buffer of the job's ``TrackedRun`` among them), and the folder gets what our loop leaves:
``config.yaml``, ``steps.csv``, ``layer_norms.csv``, the best-validation ``checkpoints/best.pt``
(the model's plain ``state_dict``). So dedupe, resume (skip finished points), the parent run,
the worker pool and the report see a run like any other.

A setting the trainer cannot honour raises ``ConfigError`` before anything is trained
(``check_settings``, and each trainer's mapping). The skip-rate monitor is the last sink, as in
our loop: it ends the fit as ``diverged``.

Each trainer's half (``lightning_runner``, ``hf_runner``) is imported only by ``backends``, and
only for its own tasks: Lightning and transformers stay optional extras.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stability.core import checkpoint
from stability.core.assembly import BestCheckpoint, EpochLines
from stability.core.config import ConfigError, RunConfig
from stability.core.faults import FaultInjector
from stability.core.loop import RunResult, write_config
from stability.core.monitor import DivergedError, SkipRateMonitor
from stability.core.precision import check_precision_supported, resolve_device
from stability.core.rundir import CHECKPOINT_NAME, CONFIG_NAME, RESUME_NAME
from stability.core.sinks import StepSink
from stability.core.task import Task, build_task
from stability.integrations.protocol import Probe, TrainerBackend
from stability.tracking.record import LOOP_ONLY

log = logging.getLogger(__name__)


class _Steps:
    """The ``trainer`` part of our resume point for a trainer run: the optimizer steps taken."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def state_dict(self) -> dict[str, int]:
        return {"step": self.steps}


def save_resume_point(folder: Path, cfg: RunConfig, model: nn.Module,
                      optimizer: torch.optim.Optimizer, steps: int, recorder: Any) -> None:
    """Our ``checkpoints/last.pt`` once the trainer has saved its own epoch checkpoint: the
    run's identity, its epochs, optimizer steps (``Resume.step``) and best epoch, so the job
    treats the killed point as one of our loop's; the trainer's checkpoint holds the rest.

    Args:
        folder: the run folder.
        cfg: the run's config (its identity).
        model: the trained module.
        optimizer: its optimizer.
        steps: optimizer steps taken (the HF runner finds its checkpoint by them).
        recorder: the callback's ``StepRecorder`` (epochs and best so far).
    """
    parts = checkpoint.Parts(model=model, optimizer=optimizer, trainer=_Steps(steps),
                             shuffle=torch.Generator(), sinks={})
    checkpoint.save(folder, cfg, parts, recorder.run.epochs, recorder.run.best, {})


def trainer_checkpoint(folder: Path, cfg: RunConfig,
                       path_of: Callable[[checkpoint.Resume], Path]) -> Path | None:
    """The trainer's own checkpoint that our ``last.pt`` in ``folder`` names for ``cfg``
    (``path_of`` maps the resume point to it).

    Returns:
        Its path; None when there is no resume point of this config and seed, or when that
        checkpoint is gone (logged): the fit starts over.
    """
    resume = checkpoint.peek(folder, cfg)
    if resume is None:
        return None
    path = path_of(resume)
    if not path.exists():
        log.warning("%s names epoch %d (step %d) but %s is missing: the fit starts over",
                    folder / RESUME_NAME, resume.epoch, resume.step, path)
        return None
    return path


def trainer_task(cfg: RunConfig, module: TrainerBackend) -> Task:
    """The run's task, built and checked to have what its trainer takes."""
    sections = {k: _as_dict(getattr(cfg, k)) for k in cfg.task.sections}
    return build_task(cfg.task, sections, required=module.REQUIRED)


def _as_dict(section: object) -> dict:
    return dataclasses.asdict(section) if dataclasses.is_dataclass(section) else dict(section)


def check_settings(cfg: RunConfig, world_size: int, name: str) -> None:
    """What no run of the trainer ``name`` honours: refused before training, one key per error.

    Raises:
        ConfigError: torchrun ranks, an optimizer or schedule of ours (the trainer keeps the
            task's own), or a deliberate fault (our loop's test hook).
    """
    if world_size > 1:
        raise ConfigError(f"world_size={world_size} is invalid for a {name} task: allowed "
                          "values are 1 (the trainer runs one process; no torchrun)")
    if not cfg.optim.is_default:
        raise ConfigError(f"optim._target_={cfg.optim.target!r} is invalid for a {name} task: "
                          "the trainer keeps the task's own optimizer (allowed values: the "
                          "default, optim=adamw)")
    if cfg.schedule.target is not None:
        raise ConfigError(f"schedule._target_={cfg.schedule.target!r} is invalid for a {name} "
                          "task: the trainer keeps the task's own schedule (allowed values: "
                          "null, schedule=none)")
    if FaultInjector(cfg.fault).active:
        raise ConfigError(f"fault.* is invalid for a {name} task: faults are injected by our "
                          "loop only (allowed values: null)")


@dataclass(frozen=True)
class Trainer:
    """A trainer we do not own as a ``protocol.Backend``: its half (``TrainerBackend``:
    ``lightning_runner``, ``hf_runner``, or one you register) inside our run folder.

    Attributes:
        name: its registered name (the tasks' ``trainer``).
        half: what it does itself: map and check the settings, fit, rebuild, evaluate.
        unused_params: our loop's settings (``tracking.record.LOOP_ONLY``): the trainer's
            own optimizer, schedule and loaders are logged once it has built them.
    """

    name: str
    half: TrainerBackend
    unused_params: tuple[str, ...] = LOOP_ONLY

    def preflight(self, cfg: RunConfig, world_size: int = 1) -> Task:
        """Every refusal of a trainer run, before a run folder or an MLflow run exists.

        Returns:
            The built task.

        Raises:
            ConfigError: the first setting the trainer cannot honour, naming its key.
        """
        check_settings(cfg, world_size, self.name)
        device = resolve_device(cfg.device)
        check_precision_supported(cfg.precision.name, device)
        task = self.task(cfg)
        self.half.check(task, cfg, device)
        return task

    def train(self, cfg: RunConfig, sinks: Sequence[StepSink] = (),
              world_size: int = 1) -> RunResult:
        """Train one point with the trainer; ``core.loop.train``'s signature and result.

        Args:
            cfg: the validated run configuration (its task declares the trainer).
            sinks: extra consumers of the step and epoch records (e.g. ``TrackedRun.sink``).
            world_size: must be 1.

        Returns:
            The ``RunResult``; ``diverged`` when the skip-rate monitor ended the fit.

        Raises:
            ConfigError: a setting the trainer cannot honour (before any training).
        """
        return train(self, cfg, sinks, world_size)

    def task(self, cfg: RunConfig) -> Task:
        """The run's task, built and checked to have what the trainer takes."""
        return trainer_task(cfg, self.half)

    def model_builder(self, cfg: RunConfig, task: Task) -> Callable[[], nn.Module]:
        """What makes a fresh model of the task (the report sizes it on the ``meta`` device,
        then loads the checkpoint's weights: ``report/sealed/rebuild.py``)."""
        return lambda: self.half.rebuild(task, cfg)

    def evaluate(self, cfg: RunConfig, task: Task, model: nn.Module, dataset: Any,
                 device: str) -> dict[str, float]:
        """``{"loss", "acc"}`` of ``model`` on ``dataset``, by the trainer's own evaluation
        (the one that gave the validation loss the winner was selected on)."""
        return self.half.evaluate(task, cfg, model, dataset, device)

    def example(self, cfg: RunConfig, task: Task, model: nn.Module) -> tuple[nn.Module, Any]:
        """A module taking one tensor (for the MLflow Model) and a validation input example."""
        return self.half.example(task, model)

    def probe(self, cfg: RunConfig, task: Task) -> Probe:
        """The trainer's check adapter (its half's optional ``probe``).

        Raises:
            ConfigError: the trainer has none: ``stability check`` cannot step it.
        """
        adapter = getattr(self.half, "probe", None)
        if adapter is None:
            raise ConfigError(f"task._target_={cfg.task.target!r} declares trainer="
                              f"{self.name!r}, whose backend has no check adapter: allowed "
                              "values are a backend defining probe(task, cfg) "
                              "(docs/integrations.md)")
        return adapter(task, cfg)


def train(trainer: Trainer, cfg: RunConfig, sinks: Sequence[StepSink] = (),
          world_size: int = 1) -> RunResult:
    """``Trainer.train``: the trainer's fit inside our run folder."""
    t0 = time.perf_counter()
    task = trainer.preflight(cfg, world_size)
    module = trainer.half
    device = resolve_device(cfg.device)
    torch.set_num_threads(cfg.train.threads)
    out = Path(cfg.output_dir)
    (out / CHECKPOINT_NAME).parent.mkdir(parents=True, exist_ok=True)
    write_config(cfg, out / CONFIG_NAME)
    best = BestCheckpoint(out / CHECKPOINT_NAME)  # the model: once the trainer built it
    resume = checkpoint.peek(out, cfg)  # a point killed before (lightning_runner writes it)
    if resume is not None:
        best.best = resume.best[0]  # best.pt holds that epoch's weights already
    monitor = SkipRateMonitor(cfg.monitor)  # last, as in our loop (core.assembly)
    fit = module.prepare(task, cfg, device, out,
                         [*sinks, best, EpochLines(cfg.train.epochs), monitor])
    best.model = fit.model
    status, reason = "finished", ""
    try:
        fit.run()
    except DivergedError as err:
        status, reason = "diverged", str(err)
    finally:
        if fit.callback.recorder is not None:
            fit.callback.recorder.close()
    # Finished or diverged: nothing to resume (a kill leaves the resume point, as our loop's)
    fit.ended()
    checkpoint.discard(out)
    rec = fit.callback.recorder
    summary: dict[str, Any] = rec.summary() | {
        "diverged": int(status == "diverged"), "skip_alerts": monitor.alerts,
        "loss_init": math.nan}
    wall = time.perf_counter() - t0
    summary["wall_time_s"] = wall
    return RunResult(status, reason, rec.best_val_loss, rec.best_epoch, rec.epochs, summary,
                     out, wall)
