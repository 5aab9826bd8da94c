"""Typed, frozen configuration: the library never sees a Hydra ``DictConfig``.

``to_run_config`` converts the composed Hydra config once, at the edge, and every
dataclass validates itself on construction so a user mistake fails before any
training with a message that names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stability.core.optim import OptimConfig, ScheduleConfig, SectionErrors
from stability.core.precision import Precision
from stability.core.validation import (
    SAFE_NAME_ALLOWED,
    ConfigError,
    build_sections,
    is_safe_name,
    joined,
    locate,
    optional_step,
    positive_float,
    positive_int,
    require,
)

__all__ = ["ConfigError", "OptimConfig", "RunConfig", "ScheduleConfig", "to_run_config",
           "to_yaml_dict"]

# The default task, by name only (core imports no task): conf/config.yaml picks the same one.
DEFAULT_TASK = "stability.tasks.sign_sum.SignSumTask"
PRECISIONS = tuple(p.value for p in Precision)  # plain strings: YAML-safe
CLIP_METHODS = ("norm", "value")
DEVICES = ("auto", "cpu", "cuda")
@dataclass(frozen=True)
class ClipConfig:
    """Gradient clipping: global L2 norm (``norm``) or element-wise (``value``)."""

    enabled: bool = False
    method: str = "norm"
    max_norm: float = 1.0
    clip_value: float = 1.0

    def __post_init__(self) -> None:
        require(isinstance(self.enabled, bool), "clip.enabled", self.enabled, "true | false")
        require(self.method in CLIP_METHODS, "clip.method", self.method, " | ".join(CLIP_METHODS))
        positive_float("clip.max_norm", self.max_norm)
        positive_float("clip.clip_value", self.clip_value)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyper-parameters: ``lr`` and ``weight_decay`` go to the ``optim`` section."""

    epochs: int = 18
    batch_size: int = 64
    accum_steps: int = 1
    lr: float = 2e-3
    weight_decay: float = 1e-3
    threads: int = 1
    num_workers: int = 0  # DataLoader workers for datasets that are not in-memory tensors

    def __post_init__(self) -> None:
        positive_int("train.epochs", self.epochs)
        positive_int("train.batch_size", self.batch_size)
        positive_int("train.accum_steps", self.accum_steps)
        positive_float("train.lr", self.lr)
        require(
            isinstance(self.weight_decay, int | float) and self.weight_decay >= 0,
            "train.weight_decay",
            self.weight_decay,
            "a number >= 0",
        )
        positive_int("train.threads", self.threads)
        require(
            isinstance(self.num_workers, int) and not isinstance(self.num_workers, bool)
            and self.num_workers >= 0,
            "train.num_workers",
            self.num_workers,
            "an integer >= 0",
        )


@dataclass(frozen=True)
class FaultConfig:
    """Deliberate faults that exercise the skip path (1-based optimizer step indices)."""

    inf_grad_at_step: int | None = None
    loss_spike_at_step: int | None = None

    def __post_init__(self) -> None:
        optional_step("fault.inf_grad_at_step", self.inf_grad_at_step)
        optional_step("fault.loss_spike_at_step", self.loss_spike_at_step)


@dataclass(frozen=True)
class MonitorConfig:
    """Rolling skip-rate monitor and diagnostics sampling."""

    window: int = 1000
    max_skip_rate: float = 0.05
    abort_after: int = 100
    underflow_every: int = 25

    def __post_init__(self) -> None:
        positive_int("monitor.window", self.window)
        require(
            isinstance(self.max_skip_rate, int | float) and 0 <= self.max_skip_rate < 1,
            "monitor.max_skip_rate",
            self.max_skip_rate,
            "a rate in [0, 1)",
        )
        positive_int("monitor.abort_after", self.abort_after)
        positive_int("monitor.underflow_every", self.underflow_every)


@dataclass(frozen=True)
class TelemetryConfig:
    """Optional per-step records beyond ``steps.csv`` (none of them changes training)."""

    # On by default since the report draws it (measured cost: docs/performance.md). The one
    # default: conf/config.yaml repeats it and tests/core/test_config.py fails when the two drift.
    per_layer: bool = True  # every parameter's pre-clip gradient norm -> layer_norms.csv
    # ||delta theta|| / ||theta|| per parameter and globally -> layer_updates.csv (with
    # per_layer; measured cost in docs/tasks.md, from benchmarks/update_ratio.py)
    update_ratio: bool = True

    def __post_init__(self) -> None:
        for key in ("per_layer", "update_ratio"):
            require(isinstance(getattr(self, key), bool), f"telemetry.{key}",
                    getattr(self, key), "true | false")


@dataclass(frozen=True)
class PrecisionConfig:
    """Mixed-precision policy. The GradScaler is enabled for fp16 alone (derived, not a key)."""

    name: str = Precision.FP32.value
    init_scale: float = 2.0**16  # GradScaler's starting scale (fp16 only)
    # 100, not PyTorch's 2000, so that growth is observable in a study's few hundred steps
    # (conf/precision/fp16.yaml has the measurement). The one default: the YAML repeats it
    # and tests/core/test_config.py fails when the two drift.
    growth_interval: int = 100

    def __post_init__(self) -> None:
        # Stored as the plain string: config.yaml (yaml.safe_dump) and the fingerprint see "fp16"
        object.__setattr__(self, "name", Precision.parse(self.name).value)
        positive_float("precision.init_scale", self.init_scale)
        positive_int("precision.growth_interval", self.growth_interval)


@dataclass(frozen=True)
class TaskConfig:
    """What to train: the class ``target`` called with ``options`` (and the sections).

    Attributes:
        target: import path of the task class or factory (``task._target_``).
        options: the task's own keyword arguments (``task.<key>``).
        sections: top-level sections handed to the task as keyword arguments of the same
            name; the built-in tasks take ``data`` and ``model`` (``data: ${data}`` in their
            YAML), so ``data.seed=1`` keeps working and those keys are hashed once.
    """

    target: str = DEFAULT_TASK
    options: Mapping[str, Any] = field(default_factory=dict)
    sections: tuple[str, ...] = ("data", "model")

    def __post_init__(self) -> None:
        require(isinstance(self.target, str) and bool(self.target), "task._target_",
                 self.target, "an import path such as stability.tasks.adding.AddingTask")
        try:
            locate(self.target)
        except Exception as err:  # ImportError, AttributeError, or the module's own error
            raise ConfigError(
                f"task._target_={self.target!r} is invalid: it does not import "
                f"({type(err).__name__}: {' '.join(str(err).split())}); allowed values are "
                "an importable path such as stability.tasks.adding.AddingTask"
            ) from None

    def declared(self, name: str, default: Any = None) -> Any:
        """A class attribute the task declares (``loss_name``, ``section_types``...).

        Read from the class, so nothing is built; a factory function declares nothing.
        """
        return getattr(locate(self.target), name, default)

    def section_types(self) -> dict[str, type]:
        """The typed sections the task declares for ``sections`` (``{"data": DataConfig}``).

        A section without a declared type stays a plain mapping its constructor validates.
        """
        declared = self.declared("section_types") or {}
        return {k: declared[k] for k in self.sections if k in declared}

    def spec(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        """The task's ``_target_`` plus its keyword arguments (``build_task`` calls it)."""
        return {"_target_": self.target, **self.options,
                **{k: dict(sections[k]) for k in self.sections}}

    def as_yaml(self) -> dict[str, Any]:
        """The section as written to ``config.yaml``: sections as interpolations, like the YAML."""
        return {"_target_": self.target, **self.options,
                **{k: f"${{{k}}}" for k in self.sections}}


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs go. ``uri=None`` means ``MLFLOW_TRACKING_URI`` or the embedded SQLite store."""

    uri: str | None = None
    experiment: str = "stability"
    enabled: bool = True
    sweep_id: str | None = None  # set by the sweeper for every job of a sweep
    parent_run_id: str | None = None  # the sweep's parent run, so the UI nests children
    # Durability (docs/TRACKING.md): how long one outage is ridden out before the run is kept
    # locally, the heartbeat period, when a RUNNING run without heartbeat counts as dead, and
    # the timeout of one HTTP request.
    retry_s: float = 300.0
    heartbeat_s: float = 30.0
    stale_after_s: float = 600.0
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for key in ("sweep_id", "parent_run_id"):
            value = getattr(self, key)
            require(value in (None, "") or is_safe_name(value), f"tracking.{key}", value,
                    f"null or {SAFE_NAME_ALLOWED}")
        for key in ("retry_s", "heartbeat_s", "stale_after_s", "request_timeout_s"):
            value = getattr(self, key)
            require(isinstance(value, int | float) and not isinstance(value, bool)
                     and value > 0, f"tracking.{key}", value, "a number of seconds > 0")


@dataclass(frozen=True)
class RunConfig:
    """One training run, fully resolved."""

    seed: int = 0
    device: str = "auto"
    task: TaskConfig = field(default_factory=TaskConfig)
    # The task's sections: of the type its class declares (``section_types``), else plain
    # mappings that its own constructor validates.
    data: Any = field(default_factory=dict)
    model: Any = field(default_factory=dict)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    clip: ClipConfig = field(default_factory=ClipConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    output_dir: str = "."

    def __post_init__(self) -> None:
        require(
            isinstance(self.seed, int) and not isinstance(self.seed, bool),
            "seed",
            self.seed,
            "an integer",
        )
        require(self.device in DEVICES, "device", self.device, " | ".join(DEVICES))
        for key, cls in self.task.section_types().items():
            value = getattr(self, key)
            if not isinstance(value, cls):  # a mapping given in code: typed like from YAML
                object.__setattr__(self, key, build_sections({key: cls}, {key: value})[key])


_SECTIONS: dict[str, type] = {
    "precision": PrecisionConfig,
    "clip": ClipConfig,
    "train": TrainConfig,
    "optim": OptimConfig,
    "schedule": ScheduleConfig,
    "fault": FaultConfig,
    "monitor": MonitorConfig,
    "tracking": TrackingConfig,
    "telemetry": TelemetryConfig,
}
_TARGET_SECTIONS: dict[str, type] = {"optim": OptimConfig, "schedule": ScheduleConfig}
TASK_SECTIONS = ("data", "model")  # sections a task's YAML may hand to it (``data: ${data}``)


def _task_config(cfg: Mapping[str, Any]) -> TaskConfig:
    raw = cfg.get("task")
    if raw is None:
        return TaskConfig()
    if not isinstance(raw, Mapping) or "_target_" not in raw:
        raise ConfigError("task is invalid: allowed values are a mapping with _target_ "
                          "(conf/task/*.yaml, e.g. task=adding)")
    options = {k: v for k, v in raw.items() if k != "_target_"}
    sections = []
    for key in TASK_SECTIONS:  # ``data: ${data}`` arrives resolved, or verbatim from a file
        if key in options and options[key] in (cfg.get(key), f"${{{key}}}"):
            sections.append(key)
            options.pop(key)
    return TaskConfig(target=raw["_target_"], options=options, sections=tuple(sections))


def _target_section(raw: Any) -> Any:
    """``{_target_, _partial_, **options}`` as ``OptimConfig``/``ScheduleConfig`` fields."""
    if not isinstance(raw, Mapping):
        return raw  # null: the defaults; anything else: build_sections names it
    out: dict[str, Any] = {"options": {k: v for k, v in raw.items()
                                       if k not in ("_target_", "_partial_")}}
    if "_target_" in raw:
        out["target"] = raw["_target_"]
    if "_partial_" in raw:
        out["partial"] = raw["_partial_"]
    return out


def to_run_config(cfg: Mapping[str, Any]) -> RunConfig:
    """Convert a plain mapping (e.g. ``OmegaConf.to_container(cfg, resolve=True)``).

    Args:
        cfg: the composed configuration as nested dicts. Keys other than the
            run's sections (``hydra``, ``sweep``...) are ignored.

    Returns:
        The validated, frozen ``RunConfig``.

    Raises:
        ConfigError: values are out of range; the message names every invalid key.
    """
    # config.yaml of runs recorded before the GradScaler switch was derived carries it
    legacy = dict(cfg.get("precision") or {})
    if "scaler" in legacy:
        legacy.pop("scaler")
        cfg = {**cfg, "precision": legacy}
    # Runs recorded before optim/schedule existed have neither: the defaults (AdamW, constant).
    cfg = {**cfg, **{k: _target_section(cfg.get(k)) for k in _TARGET_SECTIONS}}
    task = _task_config(cfg)
    typed = task.section_types()
    schema = {**_SECTIONS, **typed}  # every section's mistakes in one error
    free = {key: dict(cfg.get(key) or {}) for key in TASK_SECTIONS if key not in typed}
    # optim/schedule check several keys in one go: their mistakes join the others one by one
    targets, errors = {}, []
    for key, cls in _TARGET_SECTIONS.items():
        raw = cfg.get(key) or {}
        if not isinstance(raw, Mapping):
            errors.append(f"{key}={raw!r} is invalid: allowed values are a mapping with _target_")
            continue
        try:
            targets[key] = cls(**raw)
        except SectionErrors as err:
            errors += err.items
        except ConfigError as err:
            errors.append(str(err))
    try:
        sections = build_sections({k: v for k, v in schema.items()
                                   if k not in _TARGET_SECTIONS}, cfg) | targets
    except ConfigError as err:
        counted = re.match(r"(\d+) invalid keys: ", str(err))
        if not errors:
            raise
        n = int(counted.group(1)) if counted else 1
        rest = str(err)[counted.end():] if counted else str(err)
        raise ConfigError(f"{n + len(errors)} invalid keys: {rest}; {'; '.join(errors)}") \
            from None
    if errors:
        raise ConfigError(joined(errors))
    return RunConfig(
        seed=cfg.get("seed", 0),
        device=cfg.get("device", "auto"),
        output_dir=str(cfg.get("output_dir", ".")),
        task=task,
        **sections,
        **free,
    )


def to_yaml_dict(run: RunConfig) -> dict[str, Any]:
    """The run as the nested mapping ``config.yaml`` holds (``to_run_config`` reads it back).

    ``tracking`` is left out: where the run went is not what was trained (the fingerprint
    ignores it), and a URI may carry credentials.
    """
    out = dataclasses.asdict(run)
    out.pop("tracking")
    out["task"] = run.task.as_yaml()
    out["optim"] = run.optim.as_yaml()
    out["schedule"] = run.schedule.as_yaml()
    return out
