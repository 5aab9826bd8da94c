"""Resume a killed or preempted run from its last whole epoch (``checkpoints/last.pt``).

After every epoch the loop saves everything the next epoch depends on, each part as its own
``state_dict`` (the PyTorch convention): ``model``, ``optimizer``, ``trainer`` (``TrainStep``:
GradScaler, scheduler, step and skip counters), ``sinks`` (``{name: sink.state_dict()}``: the
CSV position, the skip-rate monitor's window, the diagnostics, the per-layer table's last
step), ``rng`` (torch, CUDA, numpy, Python, the shuffle generator), the epochs so far and the
best validation result. Run again in the same folder with the same config and seed, training
continues after that epoch and the resumed ``steps.csv`` is byte-identical to an
uninterrupted run's. A run that ends (finished or diverged) removes the file. Only tensors and
plain containers are saved, so it loads with ``torch.load(..., weights_only=True)``. A
checkpoint of the previous format (1, flat) is still read.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stability.core import rundir
from stability.core.config import RunConfig
from stability.core.identity import fingerprint
from stability.core.sinks import Stateful, StepSink, load_states, state_of
from stability.core.steplog import EpochLog

log = logging.getLogger(__name__)
FORMAT = 2
LOW_SPACE = 1 << 20  # bytes: less free space than this after a failed write means "disk full"


@dataclass
class Parts:
    """The live objects whose state a checkpoint holds (references, restored in place)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    trainer: Stateful  # TrainStep: scaler, scheduler, step counters
    shuffle: torch.Generator
    sinks: Mapping[str, StepSink]  # the loop's named step sinks (those with state are saved)


@dataclass
class Resume:
    """Where a resumed run continues."""

    epoch: int  # the last whole epoch
    step: int  # optimizer steps taken so far
    epochs: list[EpochLog]
    best: tuple[float, int, float]  # best val_loss, its epoch, its val_acc
    best_metrics: dict[str, float]  # the task's validation metrics at that epoch


def _identity(cfg: RunConfig) -> str:
    return f"{fingerprint(cfg)}/{cfg.seed}"


def _from_format_1(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of format 1 (every part flat at the top) in today's layout."""
    m, d = state["monitor"], state["diag"]
    return state | {
        "trainer": {"scaler": state["scaler"], "scheduler": state["scheduler"],
                    "grad_syncs": state["grad_syncs"], "step": state["step"],
                    "skips": state["skips"]},
        "sinks": {
            "csv": {"bytes": state["csv_bytes"]},
            "layers": {"step": state["step"]},
            "monitor": {"window": m["_window"], "consecutive_above": m["consecutive_above"],
                        "alerts": m["alerts"], "alerted": m["_alerted"]},
            "diagnostics": {k: d[k] for k in ("steps", "clip_count", "skip_count",
                                              "skip_reasons", "first_nonfinite_param",
                                              "first_nonfinite_step")}
            | {"norms": d["_norms"], "underflow": d["_underflow"]},
        },
        "rng": {"shuffle": state["shuffle"], "torch": state["torch_rng"],
                "cuda": state["cuda_rng"], "numpy": state["numpy_rng"],
                "python": state["python_rng"]},
    }


def _load(folder: Path, cfg: RunConfig) -> dict[str, Any] | None:
    path = folder / rundir.RESUME_NAME
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torn by a kill in the middle of saving: start over
        log.warning("ignoring unreadable %s: %s", path, err)
        return None
    if state.get("format") not in (1, FORMAT) or state.get("identity") != _identity(cfg):
        log.warning("ignoring %s: it belongs to another config, seed or format", path)
        return None
    return _from_format_1(state) if state["format"] == 1 else state


def _resume(state: dict[str, Any]) -> Resume:
    return Resume(state["epoch"], state["trainer"]["step"],
                  [EpochLog(**e) for e in state["epochs"]], tuple(state["best"]),
                  dict(state["best_metrics"]))


def peek(folder: str | Path, cfg: RunConfig) -> Resume | None:
    """The resume point in ``folder`` for ``cfg`` (None: start from scratch)."""
    state = _load(Path(folder), cfg)
    return None if state is None else _resume(state)


def restore(folder: str | Path, cfg: RunConfig, parts: Parts) -> Resume | None:
    """Load ``folder``'s checkpoint into ``parts`` if it belongs to ``cfg``; where to go on."""
    state = _load(Path(folder), cfg)
    if state is None:
        return None
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.trainer.load_state_dict(state["trainer"])
    load_states(parts.sinks, state["sinks"])
    rng = state["rng"]
    parts.shuffle.set_state(rng["shuffle"])
    _set_global_rng(rng)
    resume = _resume(state)
    log.info("resuming after epoch %d (step %d) from %s", resume.epoch, resume.step,
             Path(folder) / rundir.RESUME_NAME)
    return resume


def _set_global_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available() and rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    np.random.set_state(_np_state(rng["numpy"]))
    random.setstate(_py_state(rng["python"]))


def restore_rng(folder: str | Path, cfg: RunConfig) -> bool:
    """Set the global random generators (torch, CUDA, numpy, python) to those ``folder``'s
    checkpoint saved for ``cfg``: a loop that restores the rest itself (a trainer resumed from
    its own checkpoint) draws what it would have drawn. False when there is none."""
    state = _load(Path(folder), cfg)
    if state is None:
        return False
    _set_global_rng(state["rng"])
    return True


def save(folder: str | Path, cfg: RunConfig, parts: Parts, epochs: list[EpochLog],
         best: tuple[float, int, float], best_metrics: Mapping[str, float]) -> None:
    """Write ``checkpoints/last.pt`` after an epoch (atomically: a kill leaves the old one)."""
    np_state = np.random.get_state()
    state = {
        "format": FORMAT, "identity": _identity(cfg), "epoch": epochs[-1].epoch if epochs else 0,
        "epochs": [dataclasses.asdict(e) for e in epochs], "best": list(best),
        "best_metrics": {k: float(v) for k, v in best_metrics.items()},
        "model": parts.model.state_dict(), "optimizer": parts.optimizer.state_dict(),
        "trainer": parts.trainer.state_dict(),
        "sinks": state_of(parts.sinks),
        "rng": {
            "shuffle": parts.shuffle.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                      *np_state[2:]],
            "python": _py_plain(random.getstate()),
        },
    }
    save_atomic(state, Path(folder) / rundir.RESUME_NAME)


class DiskFull(OSError):
    """A checkpoint could not be written: no space left (the message says which file)."""


def _no_space(path: Path) -> bool:
    try:
        if shutil.disk_usage(path.parent).free < LOW_SPACE:
            return True
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        return err.errno == errno.ENOSPC
    return False


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to ``<path>.tmp``, then rename: a reader sees the old file or the new one.

    Raises:
        DiskFull: the disk is full (the temp file is removed; the old file stays).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(obj, tmp)
        tmp.replace(path)
    except (OSError, RuntimeError) as err:  # torch reports ENOSPC as "enforce fail at ..."
        full = (isinstance(err, OSError) and err.errno == errno.ENOSPC) or _no_space(tmp)
        tmp.unlink(missing_ok=True)
        if full:
            raise DiskFull(errno.ENOSPC, f"disk full: cannot write {path} (no space left on "
                           "device); free space and run again (it resumes from its last "
                           "whole epoch)") from None
        raise


def discard(folder: str | Path) -> None:
    """The run ended: nothing to resume."""
    (Path(folder) / rundir.RESUME_NAME).unlink(missing_ok=True)


def _np_state(saved: list[Any]) -> tuple[Any, ...]:
    return (saved[0], saved[1].numpy().astype(np.uint32), *saved[2:])


def _py_plain(state: tuple[Any, ...]) -> list[Any]:
    return [state[0], list(state[1]), state[2]]


def _py_state(saved: list[Any]) -> tuple[Any, ...]:
    return (saved[0], tuple(saved[1]), saved[2])
