"""The report's typed, frozen configuration and its user-facing error.

``experiments/report.py`` converts the composed Hydra config with ``to_report_config`` once,
at the edge; every check below runs before anything touches MLflow, and a mistake names the
key and the allowed values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from stability.core.validation import SAFE_NAME_ALLOWED, ConfigError, Errors, is_safe_name
from stability.design.margin import ALLOWED as MARGIN_ALLOWED
from stability.design.margin import Margin
from stability.stats import cost as costs

DEVICES = ("auto", "cpu", "cuda")
NAME_HASH = 10  # hex digits of the experiment name's hash in a derived model name
HASHED = re.compile(rf"-[0-9a-f]{{{NAME_HASH}}}$")


class ReportError(ConfigError):
    """A user-facing mistake (unknown sweep, empty experiment...); the message names the key."""


@dataclass(frozen=True)
class Thresholds:
    """When a sign makes a run marginal or unstable (defaults: ``conf/report.yaml``)."""

    skip_rate_marginal: float = 0.01
    skip_rate_unstable: float = 0.05
    backoff_rate_marginal: float = 0.05
    scale_floor: float = 1.0
    net_backoffs_unstable: int = 8
    spike_factor: float = 10.0
    spike_window: int = 50
    spike_min_history: int = 10
    spikes_unstable: int = 3
    zspike_threshold: float = 6.0
    zspike_window: int = 128
    zspike_min_history: int = 32
    zspikes_marginal: int = 3
    zspikes_unstable: int = 6
    clip_saturation: float = 0.95
    settle_steps: int = 20


@dataclass(frozen=True)
class ClipAdviceConfig:
    """``advice.*`` in ``conf/report.yaml``."""

    target_share: float = 0.05


@dataclass(frozen=True)
class ReportConfig:
    """What ``build_report`` needs.

    Attributes:
        tracking_uri: ``None`` resolves like the sweeps (``$MLFLOW_TRACKING_URI``, else the
            embedded SQLite store).
        experiment: the MLflow experiment holding the sweep.
        sweep_id: ``None`` picks the latest sweep in ``experiment``.
        output_dir: the report folder is ``<output_dir>/<sweep_id>``.
        device: where the winner's checkpoints are evaluated on the test split.
        confidence: level of every confidence interval.
        alpha: significance level of the paired tests.
        power: power at which the minimum detectable difference and the seeds that would
            decide an open choice (``stats.best.seeds_to_within``) are reported.
        min_effect: the difference (loss units) whose required seed count is reported; None
            means ``min_effect_sd`` times the winner's seed SD.
        min_effect_sd: see ``min_effect``.
        margin: the equivalence margin: ``"5%"`` of the lowest config mean best validation loss,
            or a number in loss units. Differences inside it are "equivalent" when TOST shows
            it.
        cost_tolerance: the share a training-time difference must exceed beyond the study's
            measured run-to-run spread before one candidate level counts as cheaper
            (``stats.cost``; default ``stats.cost.FLOOR``, 10%; 0: the spread alone).
        memory_budget_mb: the most a config may use (its runs' median ``peak_memory_mb``);
            configs over it are set aside before the decision (``report.decide.memory``). None: no
            budget.
        register: register the winning checkpoint in the Model Registry.
        model_name: registered model name; None: ``<experiment>-winner``, one registered
            model per study (``registered_model``).
        plots: draw the figures.
        history_workers: parallel requests when fetching metric histories and artifacts.
        task: ``task_target``: the import path of the user's own task (``task._target_`` of
            the sweep), the one task beside the built-ins the winner may be rebuilt through.
        verdict: thresholds of the per-config stability verdict (``verdict.*`` keys).
        advice: the max_norm recommendation (``advice.target_share``).
    """

    tracking_uri: str | None = None
    experiment: str = "stability"
    sweep_id: str | None = None
    output_dir: str = "reports"
    device: str = "auto"
    confidence: float = 0.95
    alpha: float = 0.05
    power: float = 0.8
    min_effect: float | None = None
    min_effect_sd: float = 1.0
    margin: str | float = "5%"
    cost_tolerance: float = costs.FLOOR
    memory_budget_mb: float | None = None
    register: bool = True
    model_name: str | None = None
    plots: bool = True
    history_workers: int = 8
    task: str | None = None
    verdict: Thresholds = Thresholds()
    advice: ClipAdviceConfig = ClipAdviceConfig()

    def __post_init__(self) -> None:
        # Every invalid key at once, like the run config (stability.core.validation).
        e = Errors(ReportError)
        e.require(self.tracking_uri is None or isinstance(self.tracking_uri, str),
                  "tracking.uri", self.tracking_uri, "null or a tracking URI")
        e.require(isinstance(self.experiment, str) and bool(self.experiment.strip()),
                  "experiment", self.experiment, "a non-empty MLflow experiment name")
        e.require(self.sweep_id is None or is_safe_name(self.sweep_id), "sweep_id",
                  self.sweep_id, f"null (the latest sweep) or a sweep id of {SAFE_NAME_ALLOWED}")
        e.require(isinstance(self.output_dir, str) and bool(self.output_dir), "output_dir",
                  self.output_dir, "a folder path")
        e.require(self.device in DEVICES, "device", self.device, " | ".join(DEVICES))
        for key, value in (("confidence", self.confidence), ("alpha", self.alpha),
                           ("power", self.power)):
            e.require(isinstance(value, float) and 0 < value < 1, key, value, "a number in (0, 1)")
        e.require(self.min_effect is None or (isinstance(self.min_effect, float)
                                              and self.min_effect > 0), "min_effect",
                  self.min_effect, "null (a multiple of the winner's seed SD) or a number > 0")
        e.require(isinstance(self.min_effect_sd, float) and self.min_effect_sd > 0,
                  "min_effect_sd", self.min_effect_sd, "a number > 0")
        e.require(Margin.ok(self.margin), "margin", self.margin, MARGIN_ALLOWED)
        e.require(isinstance(self.cost_tolerance, float) and 0 <= self.cost_tolerance < 1,
                  "cost_tolerance", self.cost_tolerance, "a share in [0, 1), e.g. 0.1")
        e.require(self.memory_budget_mb is None or (isinstance(self.memory_budget_mb, float)
                                                    and self.memory_budget_mb > 0),
                  "memory_budget_mb", self.memory_budget_mb, "null or megabytes > 0, e.g. 8000")
        e.require(isinstance(self.register, bool), "registry.enabled", self.register,
                  "true | false")
        e.require(self.model_name is None or is_safe_name(self.model_name),
                  "registry.model_name", self.model_name,
                  f"null (<experiment>-winner) or a model name of {SAFE_NAME_ALLOWED}")
        e.require(isinstance(self.plots, bool), "plots", self.plots, "true | false")
        e.require(self.task is None or (isinstance(self.task, str) and bool(re.fullmatch(
            r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", self.task))), "task_target", self.task,
                  "null (built-in tasks only) or your task's import path, e.g. my_task.MyTask")
        e.require(isinstance(self.history_workers, int) and self.history_workers >= 1,
                  "history_workers", self.history_workers, "an integer >= 1")
        _check_thresholds(self.verdict, e)
        share = self.advice.target_share
        e.require(isinstance(share, float) and 0 < share < 1, "advice.target_share", share,
                  "a share of steps in (0, 1), e.g. 0.05")
        e.raise_if_any()

    @property
    def registered_model(self) -> str:
        """The registered model's name: ``model_name``, else ``<experiment>-winner``.

        An experiment name that is not already a plain name (``[A-Za-z0-9._-]``) gets its
        other characters as ``-`` and a short hash of the exact name, so "team study",
        "team/study" and "team-study" get three models; so does a plain name that ends like
        such a hash (``-<10 hex>``), which could otherwise pose as another experiment's.
        """
        if self.model_name is not None:
            return self.model_name
        # Only a plain name's characters (core.validation.is_safe_name): MLflow refuses '/' and
        # ':' in model names, and the name goes into filter strings.
        plain = re.sub(r"[^A-Za-z0-9._-]", "-", self.experiment).strip("-.")
        if plain == self.experiment and not HASHED.search(plain):
            return f"{plain}-winner"
        digest = hashlib.sha256(self.experiment.encode()).hexdigest()[:NAME_HASH]
        return f"{plain or 'experiment'}-{digest}-winner"


def _check_thresholds(t: Thresholds, e: Errors) -> None:
    for key in ("skip_rate_marginal", "skip_rate_unstable", "backoff_rate_marginal",
                "clip_saturation"):
        value = getattr(t, key)
        e.require(isinstance(value, float) and 0 <= value <= 1, f"verdict.{key}", value,
                  "a number in [0, 1]")
    rates = (t.skip_rate_marginal, t.skip_rate_unstable)
    e.require(not all(isinstance(r, float) for r in rates) or rates[0] <= rates[1],
              "verdict.skip_rate_marginal", rates[0], "a number <= verdict.skip_rate_unstable")
    for key in ("scale_floor", "spike_factor"):
        value = getattr(t, key)
        e.require(isinstance(value, float) and value > 0, f"verdict.{key}", value, "a number > 0")
    e.require(isinstance(t.settle_steps, int) and not isinstance(t.settle_steps, bool)
              and t.settle_steps >= 0, "verdict.settle_steps", t.settle_steps, "an integer >= 0")
    for key in ("net_backoffs_unstable", "spike_window", "spike_min_history", "spikes_unstable",
                "zspikes_marginal", "zspikes_unstable"):
        value = getattr(t, key)
        e.require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                  f"verdict.{key}", value, "an integer >= 1")
    counts = (t.zspikes_marginal, t.zspikes_unstable)
    e.require(not all(isinstance(c, int) for c in counts) or counts[0] <= counts[1],
              "verdict.zspikes_marginal", counts[0], "an integer <= verdict.zspikes_unstable")


# Hydra keys (conf/report.yaml) -> ReportConfig fields; nested sections use dotted keys.
_KEYS = {
    "tracking.uri": "tracking_uri",
    "experiment": "experiment",
    "sweep_id": "sweep_id",
    "output_dir": "output_dir",
    "device": "device",
    "confidence": "confidence",
    "alpha": "alpha",
    "power": "power",
    "min_effect": "min_effect",
    "min_effect_sd": "min_effect_sd",
    "margin": "margin",
    "cost_tolerance": "cost_tolerance",
    "memory_budget_mb": "memory_budget_mb",
    "registry.enabled": "register",
    "registry.model_name": "model_name",
    "plots": "plots",
    "history_workers": "history_workers",
    "task_target": "task",
}
# Sections that become their own frozen dataclass (every field is a key: ``verdict.spike_factor``).
_SECTIONS: dict[str, type] = {"verdict": Thresholds, "advice": ClipAdviceConfig}


def to_report_config(cfg: Mapping[str, Any]) -> ReportConfig:
    """Convert the composed ``conf/report.yaml`` (plain nested dicts) to a ``ReportConfig``.

    Args:
        cfg: e.g. ``OmegaConf.to_container(cfg, resolve=True)``; ``hydra`` is ignored.

    Returns:
        The validated config.

    Raises:
        ReportError: an unknown key or a value out of range (the message names the key).
    """
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        if key == "hydra":
            continue
        if isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    sections = {name: {f.name for f in fields(kind)} for name, kind in _SECTIONS.items()}
    known = set(_KEYS) | {f"{name}.{k}" for name, keys in sections.items() for k in keys}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ReportError(f"unknown key {unknown[0]}: allowed keys are {', '.join(sorted(known))}")
    values: dict[str, Any] = {_KEYS[k]: v for k, v in flat.items() if k in _KEYS}
    for name, kind in _SECTIONS.items():
        given = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(f"{name}.")}
        for f in fields(kind):  # a YAML 10 where a float is expected is still a number
            if f.type == "float" and isinstance(given.get(f.name), int) \
                    and not isinstance(given[f.name], bool):
                given[f.name] = float(given[f.name])
        values[name] = kind(**given)
    # YAML writes 0.95 as a float but a user may type confidence=1 on the command line.
    for key in ("confidence", "alpha", "power", "min_effect", "min_effect_sd", "cost_tolerance",
                "memory_budget_mb"):
        if isinstance(values.get(key), int) and not isinstance(values[key], bool):
            values[key] = float(values[key])
    if values.get("sweep_id") is not None:
        values["sweep_id"] = str(values["sweep_id"])  # Hydra parses sweep_id=20260101 as int
    names = {f.name for f in fields(ReportConfig)}
    assert set(values) <= names
    return ReportConfig(**values)
