"""A config's identity: dotted keys, the canonical form, the fingerprint and a readable label.

The fingerprint (hash of the canonical config without the seed) is what de-duplication,
resume and the report's grouping of seeds rely on; the label is what a person reads in the
MLflow UI and the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from stability.core.config import OptimConfig, RunConfig, ScheduleConfig, TaskConfig
from stability.core.precision import Precision
from stability.core.task import hashes_target

# The params a first-class factor's level is read from, spelled once: a config's label below
# names them, and the study's factor vocabulary (``design.factors``) reads its levels from them.
CLIP_ENABLED, CLIP_METHOD, MAX_NORM, CLIP_VALUE = (
    "clip.enabled", "clip.method", "clip.max_norm", "clip.clip_value")
ACCUM_STEPS, PRECISION_NAME = "train.accum_steps", "precision.name"


def flatten(run: RunConfig) -> dict[str, Any]:
    """The run's config as dotted keys (``clip.max_norm``), for MLflow params and tables."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, TaskConfig):
            walk(f"{prefix}._target_", value.target)
            for k, v in value.options.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, OptimConfig | ScheduleConfig):  # as written: _target_, options
            out[f"{prefix}._target_"] = value.target
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
    for fp16 (``irrelevant``). Output locations, tracking and telemetry settings and
    ``train.num_workers`` (same batches in the same order either way) are dropped, and so is
    ``task._target_`` of a task that declares ``hash_target = False`` (the default task: it
    keeps every fingerprint from before tasks existed). The rule is the task's, the same for
    every task. The default optimizer (AdamW) and schedule (constant) are dropped too: the loop
    trained with exactly those before they were keys, so every existing fingerprint still
    names the same training.
    """
    flat = flatten(run)
    for key in [k for k in flat if k.startswith(("tracking.", "telemetry."))] + [
            "output_dir", "train.num_workers"]:
        flat.pop(key)
    if not hashes_target(run.task):
        flat.pop("task._target_")
    for section, default in (("optim.", run.optim.is_default),
                             ("schedule.", run.schedule.target is None)):
        if default:
            for key in [k for k in flat if k.startswith(section)]:
                flat.pop(key)
    flat.update(dict.fromkeys(sorted(irrelevant(flat)), None))
    return flat


def irrelevant(flat: Mapping[str, Any]) -> set[str]:
    """The dotted keys whose value cannot influence a run with these settings: the one rule
    of what cannot matter (``canonical``, the sweep's de-duplication, the report's grid).

    With clipping off, ``clip.method``, ``clip.max_norm`` and ``clip.clip_value``; with norm
    clipping ``clip.clip_value``, with value clipping ``clip.max_norm``; the GradScaler knobs
    (``precision.init_scale``, ``precision.growth_interval``) unless the precision is scaled.

    Args:
        flat: dotted settings as a config holds them (``clip.enabled`` a bool, absent: off;
            ``clip.method`` absent: norm); a precision name no loop knows keeps its knobs.
    """
    keys: set[str] = set()
    if not flat.get(CLIP_ENABLED, False):
        keys |= {CLIP_METHOD, MAX_NORM, CLIP_VALUE}
    elif flat.get(CLIP_METHOD, "norm") == "norm":
        keys.add(CLIP_VALUE)
    else:
        keys.add(MAX_NORM)
    try:
        scaled = Precision(flat.get(PRECISION_NAME)).scaled
    except ValueError:
        scaled = True
    if not scaled:
        keys |= {"precision.init_scale", "precision.growth_interval"}
    return keys


def fingerprint(run: RunConfig, world_size: int = 1) -> str:
    """Hash of the canonical config without the seed: the identity of a config across seeds.

    ``world_size`` (data-parallel ranks) changes the effective batch, so a multi-rank run is
    a different config; it enters the hash only above 1, leaving single-process ids stable.
    """
    flat = canonical(run)
    flat.pop("seed")
    # Until the GradScaler switch was derived from the precision it was a config key; hashing
    # its value keeps every existing config's identity, so resume and de-dup still match.
    flat["precision.scaler"] = Precision(run.precision.name).scaled
    if world_size > 1:
        flat["world_size"] = world_size
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_label(flat: Mapping[str, Any]) -> str:
    """A readable config name from dotted keys, e.g. ``fp16 clip=1 acc=4`` or ``fp32 noclip acc=1``.

    One function for the MLflow run name (``flatten`` of a ``RunConfig``) and the report's
    labels (a row of typed params): the two always read the same.
    """
    if CLIP_ENABLED not in flat:  # a run that does not record it (clipping not swept)
        clip = "clip=?"
    elif not flat.get(CLIP_ENABLED, False):
        clip = "noclip"
    elif flat.get(CLIP_METHOD, "norm") == "value":
        clip = f"clipv={flat[CLIP_VALUE]:g}"
    else:
        clip = f"clip={flat[MAX_NORM]:g}"
    return f"{flat.get(PRECISION_NAME, '?')} {clip} acc={flat.get(ACCUM_STEPS, '?')}"
