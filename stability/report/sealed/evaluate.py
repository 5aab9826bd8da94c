"""The sealed test split, read once: the winner's checkpoints, after selection, and nothing else.

This module is the only caller of a task's ``sealed_test`` (the default task's opens
``open_test_split``; a test scans the code base for other callers of either). Each finished
seed of the winning config is evaluated from its ``checkpoints/best.pt`` artifact under the
run's own precision, its model rebuilt through its task from its ``config.yaml`` artifact.
``test_loss`` / ``test_acc`` are logged onto the winner's runs, once: a run that already
carries them is evaluated again (deterministic) but not logged twice.

Every task is rebuilt and evaluated by its backend (``integrations.backends.of``): ``ours``
through ``task.model`` and our evaluation, a trainer's task through its own methods
(``module(lr)`` / ``model()``) and that trainer's own evaluation: the one whose validation loss
selected the winner.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from stability.core.config import RunConfig
from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME
from stability.core.precision import check_precision_supported, resolve_device
from stability.core.task import Task
from stability.integrations import backends
from stability.report.evidence.fetch import download, parallel
from stability.report.evidence.trust import BUILTIN_TASKS, read_recorded, trusted_config
from stability.report.sealed.rebuild import check_archive, fitted
from stability.stats.paired import MeanCI, mean_ci

log = logging.getLogger(__name__)

MISMATCH_TOL = 1e-6  # a re-evaluation differing from the logged value by more is reported


def _rebuild(cfg: RunConfig, state: Any,
             task: Task | None = None) -> tuple[Task, torch.nn.Module]:
    backend = backends.of(cfg)
    task = task or backend.task(cfg)
    return task, fitted(backend.model_builder(cfg, task), state)


def rebuild_model(cfg: RunConfig, state: Any, task: Task | None = None) -> torch.nn.Module:
    """The run's model, rebuilt through its task from ``cfg``, with a checkpoint's weights.

    Raises:
        CheckpointMismatch: the checkpoint does not fit the model (``rebuild.fitted``: it is
            sized on the ``meta`` device before any memory is allocated).
    """
    return _rebuild(cfg, state, task)[1]


@dataclass(frozen=True)
class LoadableWinner:
    """What the Model Registry needs: the rebuilt model, its config and a validation example."""

    run_id: str
    cfg: RunConfig
    model: torch.nn.Module
    example: Any  # numpy array, the first validation inputs (the backend's ``example``)
    config_text: str  # the run's config.yaml, logged beside the model


def load_winner(c: Any, run_id: str, dest: Path, expected: str = "",
                allowed: Sequence[str] = BUILTIN_TASKS) -> LoadableWinner:
    """Rebuild one winning run's model (fp32, eval mode, CPU) with a validation input example.

    The example comes from the validation split: the test split stays sealed. The run's
    config must pass ``trust.trusted_config`` against ``expected`` (its fingerprint) first.
    """
    cfg, state = _load(c, run_id, dest, expected, allowed)
    task, trained = _rebuild(cfg, state)
    text = (dest / CONFIG_NAME).read_text()
    # a module taking one tensor, and the first validation inputs
    model, example = backends.of(cfg).example(cfg, task, trained.float().eval())
    return LoadableWinner(run_id, cfg, model.eval(), example, text)


@dataclass(frozen=True)
class SeedTestResult:
    """The test result of one seed of the winner."""

    run_id: str
    seed: int
    test_loss: float
    test_acc: float
    logged: bool  # newly logged onto the run by this report
    note: str = ""  # why a seed has no result, or a mismatch with a value logged earlier


@dataclass(frozen=True)
class WinnerTestResult:
    """The winner's test evaluation over its finished seeds."""

    fingerprint: str
    seeds: list[SeedTestResult]
    loss: MeanCI
    acc: MeanCI
    test_size: int
    device: str


def _load(c: Any, run_id: str, dest: Path, expected: str,
          allowed: Sequence[str]) -> tuple[RunConfig, Any]:
    cfg_path = download(c, run_id, CONFIG_NAME, dest)
    ckpt_path = download(c, run_id, CHECKPOINT_NAME, dest)
    if cfg_path is None or ckpt_path is None:
        raise FileNotFoundError(f"run {run_id} lacks {CONFIG_NAME} or {CHECKPOINT_NAME}")
    cfg = trusted_config(read_recorded(cfg_path), expected, allowed)  # no YAML aliases
    check_archive(ckpt_path)  # the sizes it declares, before torch.load inflates anything
    return cfg, torch.load(ckpt_path, map_location="cpu", weights_only=True)


def evaluate_winner(c: Any, runs: pd.DataFrame, winner: str, workdir: Path,
                    device: str = "auto", workers: int = 8,
                    allowed: Sequence[str] = BUILTIN_TASKS) -> WinnerTestResult:
    """Evaluate every finished seed of the winning config on the test split; log the metrics.

    Args:
        c: the MLflow client.
        runs: the sweep's training runs (``fetch.fetch_runs``).
        winner: the fingerprint chosen on validation loss.
        workdir: where checkpoints and configs are downloaded.
        device: ``auto | cpu | cuda``.
        workers: parallel downloads.
        allowed: the tasks a run's config may name (``trust.allowed_tasks``); a seed whose
            config names another, or does not hash to ``winner``, is not rebuilt.

    Returns:
        Per-seed results and their mean/std; a seed whose artifacts are missing or refused is
        listed with a note instead of failing the report.
    """
    mine = runs[(runs["fingerprint"] == winner) & (runs["outcome"] == "finished")]
    dev = resolve_device(device)
    loaded = parallel(lambda rid: _safe_load(c, rid, workdir / rid, winner, allowed),
                      mine["run_id"], workers)
    splits: dict[str, tuple[Task, Any]] = {}
    results: list[SeedTestResult] = []
    for _, row in mine.sort_values("seed").iterrows():
        rid, seed = row["run_id"], int(row["seed"])
        got = loaded[rid]
        if isinstance(got, str):
            results.append(SeedTestResult(run_id=rid, seed=seed, test_loss=math.nan,
                                          test_acc=math.nan, logged=False, note=got))
            continue
        cfg, state = got
        check_precision_supported(cfg.precision.name, dev)
        try:  # one seed that cannot be rebuilt or evaluated must not end the report
            got = _test_one(cfg, state, winner, splits, dev)
        except Exception as err:
            log.warning("cannot evaluate run %s: %s", rid, err)
            results.append(SeedTestResult(run_id=rid, seed=seed, test_loss=math.nan,
                                          test_acc=math.nan, logged=False,
                                          note=_reason(err)))
            continue
        results.append(_record(c, row, rid, seed, got["loss"], got.get("acc", math.nan)))
    ok = [r for r in results if math.isfinite(r.test_loss)]
    sizes = {len(s) for _, s in splits.values()}
    return WinnerTestResult(winner, results, mean_ci([r.test_loss for r in ok]),
                      mean_ci([r.test_acc for r in ok]), max(sizes, default=0), dev)


def _test_one(cfg: RunConfig, state: Any, winner: str, splits: dict[str, tuple[Task, Any]],
              dev: str) -> dict[str, float]:
    """One seed's test metrics; the test split opens once per task config."""
    key = repr((cfg.task, cfg.data, cfg.model))
    backend = backends.of(cfg)
    if key not in splits:  # one task config per fingerprint: the split opens once
        task = backend.task(cfg)
        splits[key] = (task, task.sealed_test(winner=winner))
    task, test_set = splits[key]
    model = rebuild_model(cfg, state, task)
    return backend.evaluate(cfg, task, model.to(dev), test_set, dev)


def _reason(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _safe_load(c: Any, run_id: str, dest: Path, expected: str,
               allowed: Sequence[str]) -> tuple[RunConfig, Any] | str:
    try:
        return _load(c, run_id, dest, expected, allowed)
    except Exception as err:  # one unreadable seed must not end the report
        log.warning("cannot evaluate run %s: %s", run_id, err)
        return _reason(err)


def unloadable(c: Any, runs: pd.DataFrame, winner: str, workdir: Path, workers: int = 8,
               allowed: Sequence[str] = BUILTIN_TASKS) -> dict[str, str]:
    """``{run id: why}`` of the winner's finished seeds whose checkpoint cannot be loaded
    (its config refused, its archive refused, ``torch.load`` failing), read as the sealed test
    reads them but without opening the test split: a config none of whose seeds loads cannot
    be the winner (``stages.settle_loadable``)."""
    mine = runs[(runs["fingerprint"] == winner) & (runs["outcome"] == "finished")]
    loaded = parallel(lambda rid: _safe_load(c, rid, workdir / rid, winner, allowed),
                      mine["run_id"], workers)
    return {rid: got for rid, got in loaded.items() if isinstance(got, str)}


def _record(c: Any, row: pd.Series, run_id: str, seed: int, loss: float,
            acc: float) -> SeedTestResult:
    """Log test metrics onto the run unless it already carries them (then compare)."""
    from mlflow.entities import Metric

    old_loss, old_acc = row.get("test_loss", math.nan), row.get("test_acc", math.nan)
    if pd.notna(old_loss) and pd.notna(old_acc):
        same = abs(old_loss - loss) <= MISMATCH_TOL and abs(old_acc - acc) <= MISMATCH_TOL
        note = "" if same else (f"re-evaluation differs from the logged test_loss "
                                f"{old_loss:.6f} / test_acc {old_acc:.4f}; kept the logged ones")
        return SeedTestResult(run_id=run_id, seed=seed, test_loss=loss, test_acc=acc,
                              logged=False, note=note)
    ts = int(time.time() * 1000)
    c.log_batch(run_id, metrics=[Metric("test_loss", loss, ts, 0), Metric("test_acc", acc, ts, 0)],
                synchronous=True)
    return SeedTestResult(run_id=run_id, seed=seed, test_loss=loss, test_acc=acc, logged=True)
