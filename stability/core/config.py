"""Typed, frozen configuration: the library never sees a Hydra ``DictConfig``.

``to_run_config`` converts the composed Hydra config once, at the edge, and every
dataclass validates itself on construction so a user mistake fails before any
training with a message that names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SIGN_SUM_TARGET = "stability.tasks.sign_sum.SignSumTask"  # the default task
PRECISIONS = ("fp32", "fp16", "bf16")
CELLS = ("rnn", "gru", "lstm")
CLIP_METHODS = ("norm", "value")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message names the key and allowed values."""


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: allowed values are {allowed}")


def _positive_int(key: str, value: Any) -> None:
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        key,
        value,
        "an integer >= 1",
    )


def _positive_float(key: str, value: Any) -> None:
    # Finite too: inf passes "> 0" but an inf lr or init_scale turns every step into nan/skip.
    _require(
        isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf,
        key,
        value,
        "a finite number > 0",
    )


def _optional_step(key: str, value: Any) -> None:
    _require(
        value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
        key,
        value,
        "null or an optimizer step index >= 1",
    )


@dataclass(frozen=True)
class DataConfig:
    """The default (sign-of-sum) task's data. Only ``seed`` decides the data and the split."""

    seed: int = 42
    num_samples: int = 3000
    seq_len: int = 30
    val_fraction: float = 0.15
    test_fraction: float = 0.15

    def __post_init__(self) -> None:
        _require(isinstance(self.seed, int), "data.seed", self.seed, "an integer")
        _require(
            isinstance(self.num_samples, int) and self.num_samples >= 20,
            "data.num_samples",
            self.num_samples,
            "an integer >= 20",
        )
        _positive_int("data.seq_len", self.seq_len)
        for key, frac in (("data.val_fraction", self.val_fraction),
                          ("data.test_fraction", self.test_fraction)):
            _require(0 < frac < 0.5, key, frac, "a fraction in (0, 0.5)")


@dataclass(frozen=True)
class ModelConfig:
    """The default task's ``SequenceClassifier`` shape."""

    cell: str = "rnn"
    hidden_size: int = 48

    def __post_init__(self) -> None:
        _require(self.cell in CELLS, "model.cell", self.cell, " | ".join(CELLS))
        _positive_int("model.hidden_size", self.hidden_size)


@dataclass(frozen=True)
class ClipConfig:
    """Gradient clipping: global L2 norm (``norm``) or element-wise (``value``)."""

    enabled: bool = False
    method: str = "norm"
    max_norm: float = 1.0
    clip_value: float = 1.0

    def __post_init__(self) -> None:
        _require(isinstance(self.enabled, bool), "clip.enabled", self.enabled, "true | false")
        _require(self.method in CLIP_METHODS, "clip.method", self.method, " | ".join(CLIP_METHODS))
        _positive_float("clip.max_norm", self.max_norm)
        _positive_float("clip.clip_value", self.clip_value)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation hyper-parameters (AdamW)."""

    epochs: int = 18
    batch_size: int = 64
    accum_steps: int = 1
    lr: float = 2e-3
    weight_decay: float = 1e-3
    threads: int = 1
    num_workers: int = 0  # DataLoader workers for datasets that are not in-memory tensors

    def __post_init__(self) -> None:
        _positive_int("train.epochs", self.epochs)
        _positive_int("train.batch_size", self.batch_size)
        _positive_int("train.accum_steps", self.accum_steps)
        _positive_float("train.lr", self.lr)
        _require(
            isinstance(self.weight_decay, int | float) and self.weight_decay >= 0,
            "train.weight_decay",
            self.weight_decay,
            "a number >= 0",
        )
        _positive_int("train.threads", self.threads)
        _require(
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
        _optional_step("fault.inf_grad_at_step", self.inf_grad_at_step)
        _optional_step("fault.loss_spike_at_step", self.loss_spike_at_step)


@dataclass(frozen=True)
class MonitorConfig:
    """Rolling skip-rate monitor and diagnostics sampling."""

    window: int = 1000
    max_skip_rate: float = 0.05
    abort_after: int = 100
    underflow_every: int = 25

    def __post_init__(self) -> None:
        _positive_int("monitor.window", self.window)
        _require(
            isinstance(self.max_skip_rate, int | float) and 0 <= self.max_skip_rate < 1,
            "monitor.max_skip_rate",
            self.max_skip_rate,
            "a rate in [0, 1)",
        )
        _positive_int("monitor.abort_after", self.abort_after)
        _positive_int("monitor.underflow_every", self.underflow_every)


@dataclass(frozen=True)
class TelemetryConfig:
    """Optional per-step records beyond ``steps.csv`` (none of them changes training)."""

    per_layer: bool = False  # every parameter's pre-clip gradient norm -> layer_norms.csv

    def __post_init__(self) -> None:
        _require(isinstance(self.per_layer, bool), "telemetry.per_layer", self.per_layer,
                 "true | false")


@dataclass(frozen=True)
class PrecisionConfig:
    """Mixed-precision policy. The GradScaler is enabled for fp16 alone (derived, not a key)."""

    name: str = "fp32"
    init_scale: float = 2.0**16  # GradScaler's starting scale (fp16 only)
    # 100, not PyTorch's 2000, so that growth is observable in a study's few hundred steps
    # (conf/precision/fp16.yaml has the measurement). The one default: the YAML repeats it
    # and tests/test_config.py fails when the two drift.
    growth_interval: int = 100

    def __post_init__(self) -> None:
        _require(self.name in PRECISIONS, "precision", self.name, " | ".join(PRECISIONS))
        _positive_float("precision.init_scale", self.init_scale)
        _positive_int("precision.growth_interval", self.growth_interval)


def locate(path: str) -> Any:
    """The object at a dotted import path (``package.module.Class``), importing as needed.

    Like Hydra's ``_locate`` (which ``instantiate`` uses), without its error log lines.
    """
    parts = path.split(".")
    missing: ModuleNotFoundError | None = None  # the longest module path that is not there
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not module_name.startswith(err.name):
                raise  # a module that exists failed to import one of its own dependencies
            missing = missing or err
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            if missing is not None:
                raise missing from None
            raise
        return obj
    return importlib.import_module(path)


@dataclass(frozen=True)
class TaskConfig:
    """What to train: ``hydra.utils.instantiate`` of ``{"_target_": target, **options}``.

    Attributes:
        target: import path of the task class or factory (``task._target_``).
        options: the task's own keyword arguments (``task.<key>``).
        sections: top-level sections handed to the task as keyword arguments of the same
            name; the built-in tasks take ``data`` and ``model`` (``data: ${data}`` in their
            YAML), so ``data.seed=1`` keeps working and those keys are hashed once.
    """

    target: str = SIGN_SUM_TARGET
    options: Mapping[str, Any] = field(default_factory=dict)
    sections: tuple[str, ...] = ("data", "model")

    def __post_init__(self) -> None:
        _require(isinstance(self.target, str) and bool(self.target), "task._target_",
                 self.target, "an import path such as stability.tasks.adding.AddingTask")
        try:
            locate(self.target)
        except Exception as err:  # ImportError, AttributeError, or the module's own error
            raise ConfigError(
                f"task._target_={self.target!r} is invalid: it does not import "
                f"({type(err).__name__}: {' '.join(str(err).split())}); allowed values are "
                "an importable path such as stability.tasks.adding.AddingTask"
            ) from None

    def spec(self, sections: Mapping[str, Any]) -> dict[str, Any]:
        """The mapping ``hydra.utils.instantiate`` builds (``_target_`` plus arguments)."""
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
        for key in ("retry_s", "heartbeat_s", "stale_after_s", "request_timeout_s"):
            value = getattr(self, key)
            _require(isinstance(value, int | float) and not isinstance(value, bool)
                     and value > 0, f"tracking.{key}", value, "a number of seconds > 0")


@dataclass(frozen=True)
class RunConfig:
    """One training run, fully resolved."""

    seed: int = 0
    device: str = "auto"
    task: TaskConfig = field(default_factory=TaskConfig)
    # The default task's typed sections; any other task's ``data``/``model`` stay plain
    # mappings that its own constructor validates.
    data: DataConfig | Mapping[str, Any] = field(default_factory=DataConfig)
    model: ModelConfig | Mapping[str, Any] = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    clip: ClipConfig = field(default_factory=ClipConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    output_dir: str = "."

    def __post_init__(self) -> None:
        _require(
            isinstance(self.seed, int) and not isinstance(self.seed, bool),
            "seed",
            self.seed,
            "an integer",
        )
        _require(self.device in DEVICES, "device", self.device, " | ".join(DEVICES))


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "precision": PrecisionConfig,
    "clip": ClipConfig,
    "train": TrainConfig,
    "fault": FaultConfig,
    "monitor": MonitorConfig,
    "tracking": TrackingConfig,
    "telemetry": TelemetryConfig,
}
TASK_SECTIONS = ("data", "model")  # sections a task's YAML may hand to it (``data: ${data}``)


def _section_errors(cls: type, key: str, values: Mapping[str, Any]) -> list[str]:
    """Every problem of one section: each unknown key, then each invalid value."""
    names = {f.name for f in dataclasses.fields(cls)}
    errors = [f"unknown key {key}.{k}: allowed keys are {', '.join(sorted(names))}"
              for k in sorted(set(values) - names)]
    # __post_init__ stops at the first bad value: record it, put the keys it names back to
    # their defaults and try again, until the section builds or an error names no key.
    remaining = {k: v for k, v in values.items() if k in names}
    while True:
        try:
            cls(**remaining)
            return errors
        except (ConfigError, TypeError) as err:
            msg = str(err)
            if msg in errors:
                return errors
            errors.append(msg)
            # Every key the message names goes back to its default (both sides of a check
            # across keys).
            culprits = [k for k in remaining if f"{key}.{k}=" in msg
                        or (k == "name" and f"{key}=" in msg)]
            if not culprits:
                return errors
            for k in culprits:
                remaining.pop(k)


def build_sections(schema: Mapping[str, type], cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Build every section of ``cfg`` named in ``schema``, reporting all mistakes at once.

    The one validation helper of run, report and benchmark configs: each invalid key and its
    allowed values end up in a single ``ConfigError`` (one line, ``; ``-separated).

    Args:
        schema: section name -> frozen dataclass validating it.
        cfg: the plain mapping holding the sections (missing ones take the defaults).

    Returns:
        Section name -> constructed dataclass.

    Raises:
        ConfigError: listing every invalid key.
    """
    built, errors = {}, []
    for key, cls in schema.items():
        values = cfg.get(key) or {}
        if not isinstance(values, Mapping):
            errors.append(f"{key}={values!r} is invalid: allowed values are a mapping of keys")
            continue
        problems = _section_errors(cls, key, values)
        if problems:
            errors.extend(problems)
        else:
            built[key] = cls(**values)
    if errors:
        raise ConfigError(errors[0] if len(errors) == 1
                          else f"{len(errors)} invalid keys: " + "; ".join(errors))
    return built


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
    task = _task_config(cfg)
    schema = dict(_SECTIONS)
    free: dict[str, Any] = {}
    if task.target != SIGN_SUM_TARGET:  # another task validates its own data/model sections
        for key in TASK_SECTIONS:
            schema.pop(key)
            free[key] = dict(cfg.get(key) or {})
    sections = build_sections(schema, cfg)
    return RunConfig(
        seed=cfg.get("seed", 0),
        device=cfg.get("device", "auto"),
        output_dir=str(cfg.get("output_dir", ".")),
        task=task,
        **sections,
        **free,
    )


def to_yaml_dict(run: RunConfig) -> dict[str, Any]:
    """The run as the nested mapping ``config.yaml`` holds (``to_run_config`` reads it back)."""
    out = dataclasses.asdict(run)
    out["task"] = run.task.as_yaml()
    return out


def flatten(run: RunConfig) -> dict[str, Any]:
    """The run's config as dotted keys (``clip.max_norm``), for MLflow params and tables."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, TaskConfig):
            walk(f"{prefix}._target_", value.target)
            for k, v in value.options.items():
                walk(f"{prefix}.{k}", v)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(f"{prefix}.{f.name}" if prefix else f.name, getattr(value, f.name))
        elif isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        else:
            out[prefix] = value

    walk("", run)
    return out


def canonical(run: RunConfig) -> dict[str, Any]:
    """Dotted config with settings that cannot matter normalised away.

    With clipping off, ``clip.method``, ``clip.max_norm`` and ``clip.clip_value`` do not
    influence training, so they are replaced by ``None``; the GradScaler knobs only matter
    for fp16. Output locations, tracking and telemetry settings and ``train.num_workers``
    (same batches in the same order either way) are dropped, and so is the default task's
    ``_target_``, which keeps every fingerprint from before tasks existed.
    """
    flat = flatten(run)
    for key in [k for k in flat if k.startswith(("tracking.", "telemetry."))] + [
            "output_dir", "train.num_workers"]:
        flat.pop(key)
    if run.task.target == SIGN_SUM_TARGET:
        flat.pop("task._target_")
    if not run.clip.enabled:
        flat.update({"clip.method": None, "clip.max_norm": None, "clip.clip_value": None})
    elif run.clip.method == "norm":
        flat["clip.clip_value"] = None
    else:
        flat["clip.max_norm"] = None
    if run.precision.name != "fp16":
        flat.update({"precision.init_scale": None, "precision.growth_interval": None})
    return flat


def fingerprint(run: RunConfig, world_size: int = 1) -> str:
    """Hash of the canonical config without the seed: the identity of a config across seeds.

    ``world_size`` (data-parallel ranks) changes the effective batch, so a multi-rank run is
    a different config; it enters the hash only above 1, leaving single-process ids stable.
    """
    flat = canonical(run)
    flat.pop("seed")
    # Until the GradScaler switch was derived from the precision it was a config key; hashing
    # its value keeps every existing config's identity, so resume and de-dup still match.
    flat["precision.scaler"] = run.precision.name == "fp16"
    if world_size > 1:
        flat["world_size"] = world_size
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_label(flat: Mapping[str, Any]) -> str:
    """A readable config name from dotted keys, e.g. ``fp16 clip=1 acc=4`` or ``fp32 noclip acc=1``.

    One function for the MLflow run name (``flatten`` of a ``RunConfig``) and the report's
    labels (a row of typed params): the two always read the same.
    """
    if not flat.get("clip.enabled", False):
        clip = "noclip"
    elif flat.get("clip.method", "norm") == "value":
        clip = f"clipv={flat['clip.clip_value']:g}"
    else:
        clip = f"clip={flat['clip.max_norm']:g}"
    return f"{flat.get('precision.name', '?')} {clip} acc={flat.get('train.accum_steps', '?')}"
