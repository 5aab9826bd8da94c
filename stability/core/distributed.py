"""Data-parallel plumbing for ``torchrun``: process group, rank helpers, reductions, failures.

``setup`` reads the torchrun environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and joins the process group once per process: gloo on
CPU, NCCL on CUDA, with a timeout (``$STABILITY_DIST_TIMEOUT_S``, default 60 s) so that a
collective waiting on a dead or stuck rank raises instead of hanging. Without torchrun
(or with one process) nothing is initialised and every helper answers for a world of one.

A rank that fails writes its reason into the rendezvous store before it exits. Rank 0 reads
it when its own collectives break or when torchrun terminates it, so its MLflow run ends
FAILED with the real cause instead of KILLED (see ``docs/distributed.md``).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stability.core.config import ConfigError
from stability.core.precision import resolve_device
from stability.core.signals import sigterm_deferred

TIMEOUT_ENV = "STABILITY_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0
_FAILED_KEY = "failed"


class PeerFailedError(RuntimeError):
    """Another rank failed first; this rank's collectives cannot complete any more."""


@dataclass
class _State:
    store: Any = None  # our namespace in the rendezvous store (failure reasons)
    failed: bool = False  # this process recorded a failure: skip the orderly teardown
    rank: int = 0  # the rank this process joined with; kept after it leaves the group


_state = _State()


def launched_by_torchrun() -> bool:
    """True when the torchrun environment asks for more than one rank."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def timeout_from_env() -> timedelta:
    """The collective/rendezvous timeout from ``$STABILITY_DIST_TIMEOUT_S`` (default 60 s).

    Raises:
        ConfigError: the variable is set but not a number of seconds > 0.
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{TIMEOUT_ENV}={raw!r} is invalid: allowed values are a number of seconds > 0 "
            f"(unset = {DEFAULT_TIMEOUT_S:g})"
        )
    return timedelta(seconds=value)


def backend_for(device: str) -> str:
    """``nccl`` for CUDA, ``gloo`` for CPU."""
    return "nccl" if device == "cuda" else "gloo"


def setup(device: str = "auto") -> int:
    """Join the torchrun process group (once per process) and return the world size.

    Args:
        device: the run's ``device`` setting (``auto | cpu | cuda``); decides the backend.

    Returns:
        The number of ranks; 1 without torchrun, and then nothing is initialised.

    Raises:
        ConfigError: the timeout variable or the device is invalid.
    """
    if is_distributed():
        return dist.get_world_size()
    if not launched_by_torchrun():
        return 1
    resolved = resolve_device(device)
    timeout = timeout_from_env()
    if resolved == "cuda":
        # "cuda" then means this rank's own GPU everywhere (tensors, autocast, GradScaler).
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # The public rendezvous gives us the store itself, which carries failure reasons too.
    store, rank_, world = next(dist.rendezvous("env://", timeout=timeout))
    dist.init_process_group(backend_for(resolved), store=dist.PrefixStore("default_pg", store),
                            rank=rank_, world_size=world, timeout=timeout)
    _state.store = dist.PrefixStore("stability", store)
    _state.failed = False
    _state.rank = rank_
    atexit.register(shutdown)
    return world


def leave() -> None:
    """End a rank's training in order: wait for every rank, then leave the process group.

    Called once training returned on every rank, while the interpreter is fully alive. The
    barrier means every collective has completed on every rank before any rank tears its
    group down; left to the exit handler alone, a gloo worker thread could still drop a
    tensor during interpreter finalization and abort the rank ("terminate called without an
    active exception", SIGABRT). A no-op without a process group.
    """
    if is_distributed() and not _state.failed:
        dist.barrier()
    shutdown()


def shutdown() -> None:
    """Leave the process group (idempotent). Skipped after a failure: the peers may be gone.

    Also registered as an exit handler, with no barrier: at exit a peer may have stopped
    without recording a failure (Ctrl-C), and waiting for it would only wait out the timeout.
    """
    if is_distributed() and not _state.failed:
        dist.destroy_process_group()
    _state.store = None


def is_distributed() -> bool:
    """True when a process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank: in its process group, or the one it had before ``leave`` (else 0).

    Kept after leaving, so that only rank 0 still speaks once training has ended.
    """
    return dist.get_rank() if is_distributed() else _state.rank


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0: the only rank that writes files and talks to MLflow."""
    return rank() == 0


def wrap(model: nn.Module, device: str) -> nn.parallel.DistributedDataParallel:
    """``DistributedDataParallel`` around ``model`` (already on ``device``)."""
    ids = [torch.cuda.current_device()] if device == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def shard_indices(order: torch.Tensor, rank_: int, world: int) -> torch.Tensor:
    """This rank's share of ``order``, exactly as ``DistributedSampler(drop_last=False)``.

    The order is padded by repeating it from the start up to a multiple of ``world``, then
    rank ``r`` takes every ``world``-th index from position ``r``. Every rank gets the same
    number of samples, hence the same number of micro-batches and optimizer steps.
    """
    if world == 1:
        return order
    n = len(order)
    total = math.ceil(n / world) * world
    padded = order.repeat(math.ceil(total / n))[:total] if total > n else order
    return padded[rank_:total:world]


def all_reduce_sum(values: Sequence[float], device: str) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64; the values as-is without ranks)."""
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def _record_failure(err: BaseException) -> None:
    _state.failed = True
    if _state.store is None:
        return
    message = f"rank {rank()} failed: {type(err).__name__}: {err}"[:2000]
    # First writer wins: the root cause, not the ranks that broke because of it. The store's
    # host may be gone already; the original exception propagates either way.
    with contextlib.suppress(Exception):
        _state.store.compare_set(_FAILED_KEY, "", message)


def peer_failure() -> str:
    """The reason another rank recorded for its failure ("" if none, or not distributed)."""
    if _state.store is None:
        return ""
    try:
        if not _state.store.check([_FAILED_KEY]):
            return ""
        message = _state.store.get(_FAILED_KEY).decode()
    except Exception:  # a dead store host means no answer, not a new error
        return ""
    return "" if message.startswith(f"rank {rank()} ") else message


@contextmanager
def rank_guard() -> Iterator[None]:
    """Around one rank's training: publish this rank's failure, or name the peer that failed.

    An exception here (a broken collective, a timeout, or torchrun's SIGTERM as
    ``Terminated``) becomes ``PeerFailedError`` with the peer's reason when another rank
    failed first; otherwise the exception propagates unchanged, and if it is an error of this
    rank (not Ctrl-C or SIGTERM) its reason is recorded for the others first. Without a
    process group this is a no-op.
    """
    try:
        yield
    except BaseException as err:
        if not is_distributed():
            raise
        with sigterm_deferred():  # a second SIGTERM must not replace the real cause
            peer = peer_failure()
            if peer:
                _state.failed = True
                raise PeerFailedError(peer) from err
            if isinstance(err, Exception):  # not Ctrl-C / SIGTERM: those come from outside
                _record_failure(err)
        raise
