"""Typed, frozen configuration: the library never sees a Hydra ``DictConfig``.

``to_run_config`` converts the composed Hydra config once, at the edge, and every
dataclass validates itself on construction so a user mistake fails before any
training with a message that names the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    """The synthetic sign-of-sum task. Only ``seed`` decides the data and the split."""

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
    """``SequenceClassifier`` shape."""

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
class PrecisionConfig:
    """Mixed-precision policy. The GradScaler is enabled for fp16 alone (derived, not a key)."""

    name: str = "fp32"
    init_scale: float = 2.0**16  # GradScaler's starting scale (fp16 only)
    growth_interval: int = 2000  # unskipped steps before the scale doubles (fp16 only)

    def __post_init__(self) -> None:
        _require(self.name in PRECISIONS, "precision", self.name, " | ".join(PRECISIONS))
        _positive_float("precision.init_scale", self.init_scale)
        _positive_int("precision.growth_interval", self.growth_interval)


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
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    clip: ClipConfig = field(default_factory=ClipConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
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
}


def _build(cls: type, key: str, values: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown key {key}.{unknown[0]}: allowed keys are {', '.join(sorted(names))}"
        )
    return cls(**values)


def to_run_config(cfg: Mapping[str, Any]) -> RunConfig:
    """Convert a plain mapping (e.g. ``OmegaConf.to_container(cfg, resolve=True)``).

    Args:
        cfg: the composed configuration as nested dicts. Keys other than the
            run's sections (``hydra``, ``sweep``...) are ignored.

    Returns:
        The validated, frozen ``RunConfig``.

    Raises:
        ConfigError: a value is out of range; the message names the key.
    """
    raw = {key: dict(cfg.get(key) or {}) for key in _SECTIONS}
    raw["precision"].pop("scaler", None)  # config.yaml of runs recorded before it was derived
    sections = {key: _build(cls, key, raw[key]) for key, cls in _SECTIONS.items()}
    return RunConfig(
        seed=cfg.get("seed", 0),
        device=cfg.get("device", "auto"),
        output_dir=str(cfg.get("output_dir", ".")),
        **sections,
    )


def flatten(run: RunConfig) -> dict[str, Any]:
    """The run's config as dotted keys (``clip.max_norm``), for MLflow params and tables."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(f"{prefix}.{f.name}" if prefix else f.name, getattr(value, f.name))
        else:
            out[prefix] = value

    walk("", run)
    return out


def canonical(run: RunConfig) -> dict[str, Any]:
    """Dotted config with settings that cannot matter normalised away.

    With clipping off, ``clip.method``, ``clip.max_norm`` and ``clip.clip_value`` do not
    influence training, so they are replaced by ``None``; the GradScaler knobs only matter
    for fp16. Output locations and tracking settings are dropped.
    """
    flat = flatten(run)
    for key in [k for k in flat if k.startswith("tracking.")] + ["output_dir"]:
        flat.pop(key)
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
