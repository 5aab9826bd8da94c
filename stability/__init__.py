"""stability: compare gradient clipping, accumulation and mixed precision on one task."""

from stability.core.clipping import clip_global_l2_norm, has_non_finite_grad
from stability.core.config import ClipConfig, ConfigError, PrecisionConfig, RunConfig, to_run_config
from stability.core.loop import RunResult, train
from stability.core.measure import Measurement, StepMeter, measure
from stability.core.monitor import DivergedError, SkipRateMonitor
from stability.core.precision import Precision
from stability.core.step import TrainStep
from stability.core.steplog import EpochLog, StepLog
from stability.core.task import Task
from stability.tasks.sign_sum import SequenceClassifier, SignSumTask


def track(*args: object, **kwargs: object) -> object:
    """Record a loop of your own as a study run: ``stability.integrations.track.track``
    (docs/integrations.md, "Any loop"); imported on first use, with MLflow."""
    from stability.integrations.track import track as track_loop

    return track_loop(*args, **kwargs)


__all__ = [
    "ClipConfig",
    "ConfigError",
    "DivergedError",
    "EpochLog",
    "Measurement",
    "Precision",
    "PrecisionConfig",
    "RunConfig",
    "RunResult",
    "SequenceClassifier",
    "SignSumTask",
    "SkipRateMonitor",
    "StepLog",
    "StepMeter",
    "Task",
    "TrainStep",
    "clip_global_l2_norm",
    "has_non_finite_grad",
    "measure",
    "to_run_config",
    "track",
    "train",
]
