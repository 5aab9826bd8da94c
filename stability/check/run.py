"""Run every probe on one task and one loop: ``run_check(RunConfig, CheckConfig)``.

The data are the task's first training samples in order (no shuffling): ``k`` micro-batches of
``train.batch_size``. The model is built once under the run's seed; every probe deepcopies it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from stability.check.accumulation import probe_accumulation
from stability.check.amp import SCALE, probe_clip, probe_skip
from stability.check.headroom import probe_low_precision, probe_range
from stability.check.result import ProbeResult
from stability.check.rig import StepFn, Template, ours
from stability.check.sanity import declared_init_loss, probe_determinism, probe_init_loss
from stability.core.batches import task_of
from stability.core.config import RunConfig
from stability.core.task import first_batch
from stability.core.validation import ConfigError, locate, require

OURS = "ours"


@dataclass(frozen=True)
class CheckConfig:
    """The ``check`` section (conf/check.yaml).

    Attributes:
        loop: ``ours`` (core.step.TrainStep) or the import path of a step function
            (``stability.check.rig`` documents its signature).
        accum_steps: the accumulation the probes use (>= 2; a short window is half of it).
        output: where the JSON goes (a file path).
    """

    loop: str = OURS
    accum_steps: int = 4
    output: str = "check.json"

    def __post_init__(self) -> None:
        require(isinstance(self.loop, str) and bool(self.loop), "check.loop", self.loop,
                "ours | an import path of a step function")
        require(isinstance(self.accum_steps, int) and not isinstance(self.accum_steps, bool)
                and self.accum_steps >= 2, "check.accum_steps", self.accum_steps,
                "an integer >= 2")

    def step_fn(self) -> StepFn:
        """The loop under check."""
        if self.loop == OURS:
            return ours
        try:
            fn = locate(self.loop)
        except Exception as err:
            raise ConfigError(f"check.loop={self.loop!r} is invalid: it does not import "
                              f"({type(err).__name__}); allowed values are ours | an import "
                              "path of a step function") from None
        require(callable(fn), "check.loop", self.loop, "ours | a callable step(rig, window)")
        return fn


def run_check(cfg: RunConfig, check: CheckConfig) -> tuple[list[ProbeResult], float]:
    """All probes on ``cfg``'s task with ``check``'s loop.

    Returns:
        The results in order and the seconds they took.
    """
    t0 = time.perf_counter()
    step = check.step_fn()
    torch.set_num_threads(cfg.train.threads)
    task = task_of(cfg)
    train, _ = task.train_val()
    k, b = check.accum_steps, cfg.train.batch_size
    x, y = first_batch(train, k * b)
    require(len(y) >= k, "train.batch_size", b, f"a size giving {k} micro-batches of data")
    micro = [(x[i : i + b], y[i : i + b]) for i in range(0, len(y), b)][:k]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        template = Template(task.model(), task.loss, cfg.seed)
    scale = cfg.precision.init_scale if cfg.precision.name == "fp16" else SCALE
    one = micro[:1]
    results = [
        *probe_accumulation(template, step, micro, k),
        probe_clip(template, step, one),
        probe_skip(template, step, one),
        *probe_range(template, micro[0], scale),
        *probe_low_precision(template, micro[0]),
        probe_init_loss(template, micro[0], declared_init_loss(task)),
        probe_determinism(task.model, template, step, [micro[:2], micro[2:k]]),
    ]
    return results, time.perf_counter() - t0
