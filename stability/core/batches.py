"""From a task to batches: build the task, iterate its data in windows, evaluate it.

The run loop's data plumbing. A ``TensorDataset`` is indexed directly (no DataLoader on the hot
path, so the default task keeps its speed and its exact ``steps.csv``); any other ``Dataset``
goes through a ``DataLoader`` over the same shuffled index batches, with ``train.num_workers``.
On CUDA every batch is gathered into pinned host memory and copied with ``non_blocking=True``
(the DataLoader with ``pin_memory``): the copy does not wait for the device, so fetching the
next window adds no sync to the step; on CPU the tensors are used as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from stability.core import distributed
from stability.core.config import RunConfig, TrainConfig
from stability.core.precision import autocast
from stability.core.step import MicroBatch
from stability.core.task import Task, build_task


def task_of(cfg: RunConfig) -> Task:
    """Instantiate the run's task (``cfg.task``), handing it the sections it takes."""
    sections = {k: _as_dict(getattr(cfg, k)) for k in cfg.task.sections}
    return build_task(cfg.task, sections)


def _as_dict(section: object) -> dict:
    return dataclasses.asdict(section) if dataclasses.is_dataclass(section) else dict(section)


def _loader(dataset: Dataset, batches: Sequence[Sequence[int]] | Iterator,
            num_workers: int, device: str = "cpu") -> DataLoader:
    return DataLoader(dataset, batch_sampler=batches, num_workers=num_workers,
                      pin_memory=_is_cuda(device))


def _is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def _to(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t`` on ``device``; a host tensor bound for CUDA goes through pinned memory, without
    blocking (pinned already, from a ``pin_memory`` DataLoader: copied as it is)."""
    if t.device.type != "cpu" or not _is_cuda(device):
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


def _gather(data: torch.Tensor, idx: torch.Tensor, device: str) -> torch.Tensor:
    """``data[idx]`` on ``device``: gathered straight into pinned memory for CUDA."""
    if data.device.type != "cpu" or not _is_cuda(device):
        return data[idx].to(device)
    out = torch.empty((len(idx), *data.shape[1:]), dtype=data.dtype, pin_memory=True)
    return torch.index_select(data, 0, idx, out=out).to(device, non_blocking=True)


@dataclass(frozen=True)
class EvalSettings:
    """How a model is evaluated: the run's autocast, where, in what batches, by which ranks.

    Attributes:
        precision: the run's precision (``fp32`` | ``fp16`` | ``bf16``).
        device: ``cpu`` or ``cuda``.
        batch_size: evaluation batch size.
        sharded: data-parallel: each rank evaluates every world_size-th sample (no padding)
            and the sums are all-reduced, so every rank returns the whole dataset's numbers.
        num_workers: DataLoader workers (datasets that are not ``TensorDataset``).
    """

    precision: str
    device: str
    batch_size: int = 1024
    sharded: bool = False
    num_workers: int = 0

    @classmethod
    def of(cls, cfg: RunConfig, device: str, *, sharded: bool = False) -> EvalSettings:
        """A run's evaluation of ``cfg`` on a concrete ``device``: its precision, its
        ``train.num_workers``."""
        return cls(precision=cfg.precision.name, device=device, sharded=sharded,
                   num_workers=cfg.train.num_workers)


@torch.no_grad()
def evaluate_task(task: Task, model: nn.Module, dataset: Dataset,
                  how: EvalSettings) -> dict[str, float]:
    """Mean loss and the task's metrics of ``model`` on ``dataset``, under the run's autocast.

    Args:
        task: supplies ``metrics`` (batch sums) and ``loss``.
        model: the module.
        dataset: the data to evaluate on.
        how: the precision, device, batch size, sharding and DataLoader workers.

    Returns:
        ``{"loss": mean, <metric>: mean, ...}`` over the samples, plus what the task's
        optional ``derived(means)`` adds (e.g. ``perplexity``).
    """
    precision, device, batch_size = how.precision, how.device, how.batch_size
    sharded, num_workers = how.sharded, how.num_workers
    n = len(dataset)  # type: ignore[arg-type]
    index = torch.arange(n)
    if sharded:
        index = index[distributed.rank()::distributed.world_size()]
    if isinstance(dataset, TensorDataset):
        x_all, y_all = dataset.tensors[0], dataset.tensors[1]
        if sharded:
            x_all, y_all = x_all[index], y_all[index]
        batches: Iterator = ((x_all[i : i + batch_size], y_all[i : i + batch_size])
                             for i in range(0, len(index), batch_size))
    else:
        chunks = [index[i : i + batch_size].tolist() for i in range(0, len(index), batch_size)]
        batches = iter(_loader(dataset, chunks, num_workers, device))
    model.eval()
    sums: dict[str, float] = {}
    for x, y in batches:
        x, y = _to(x, device), _to(y, device)
        with autocast(precision, device):
            out = model(x)
        got = task.metrics(out, y)
        if "loss" not in got:
            got = {"loss": task.loss(out.float(), y) * y.shape[0], **got}
        for k, v in got.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    model.train()
    count = len(index)
    keys = sorted(sums)
    values = [sums[k] for k in keys]
    if sharded:
        *values, count = distributed.all_reduce_sum([*values, count], device)
    means = {k: v / count for k, v in zip(keys, values, strict=True)}
    derived = getattr(task, "derived", None)  # optional: metrics of the means (perplexity)
    return means | derived(means) if callable(derived) else means


def windows(split: Dataset, train: TrainConfig, generator: torch.Generator, device: str,
            rank: int = 0, world_size: int = 1) -> Iterator[list[MicroBatch]]:
    """One epoch of shuffled micro-batches grouped into windows of ``train.accum_steps``.

    The last window may be shorter; it is still stepped (with its own divisor). With
    ``world_size > 1`` every rank draws the same permutation (same generator state) and takes
    its ``DistributedSampler`` share of it, so ranks see disjoint data and the same number of
    windows. A ``TensorDataset`` is indexed directly (no DataLoader on the hot path); any other
    dataset goes through a ``DataLoader`` over the same index batches, with
    ``train.num_workers``.

    Args:
        split: the training split.
        train: the run's ``train`` section: ``batch_size`` (a micro-batch), ``accum_steps``
            (micro-batches per window) and ``num_workers``.
        generator: the shuffling generator (the same state on every rank).
        device: ``cpu`` or ``cuda``.
        rank: this rank.
        world_size: data-parallel ranks.

    Yields:
        Each window's micro-batches ``(x, y)``, on ``device``.
    """
    batch_size, accum_steps, num_workers = train.batch_size, train.accum_steps, train.num_workers
    perm = distributed.shard_indices(torch.randperm(len(split), generator=generator),
                                     rank, world_size)
    batches = [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]
    if isinstance(split, TensorDataset):
        x_all, y_all = split.tensors[0], split.tensors[1]
        for w in range(0, len(batches), accum_steps):
            yield [(_gather(x_all, idx, device), _gather(y_all, idx, device))
                   for idx in batches[w : w + accum_steps]]
        return
    loaded = iter(_loader(split, [b.tolist() for b in batches], num_workers, device))
    for w in range(0, len(batches), accum_steps):
        yield [(_to(x, device), _to(y, device))
               for x, y in (next(loaded) for _ in batches[w : w + accum_steps])]
