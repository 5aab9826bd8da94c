"""stability: compare gradient clipping, accumulation and mixed precision on one task."""

from stability.clipping import clip_global_l2_norm, has_non_finite_grad
from stability.config import ConfigError, RunConfig, StepConfig, to_run_config
from stability.model import SequenceClassifier
from stability.monitor import DivergedError, SkipRateMonitor
from stability.run import RunResult, train
from stability.step import TrainStep
from stability.steplog import EpochLog, StepLog

__all__ = [
    "ConfigError",
    "DivergedError",
    "EpochLog",
    "RunConfig",
    "RunResult",
    "SequenceClassifier",
    "SkipRateMonitor",
    "StepConfig",
    "StepLog",
    "TrainStep",
    "clip_global_l2_norm",
    "has_non_finite_grad",
    "to_run_config",
    "train",
]
