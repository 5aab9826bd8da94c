"""Host reads per optimizer step, counted: every call that brings a tensor's value to Python.

A host read (``.item()``, ``.tolist()``, ``bool(t)``, ``float(t)``, ``int(t)``, ``.cpu()``,
``.numpy()``) of a CUDA tensor waits for the device to finish all queued work: a sync that
stalls the launch queue. On CPU the same calls cost almost nothing, so they cannot be timed
there, but they can be counted: ``HostReads`` wraps those methods of ``torch.Tensor`` while it
is entered and sorts each call by who made it (the first frame outside torch's own tensor
code):

- ``ours``: the imported ``stability`` package (the step, ``measure``, the sinks, the callbacks);
- ``scaler``: ``torch.amp`` (``GradScaler.step`` reads its ``found_inf``); a read inside
  ``GradScaler.get_scale`` counts for its caller;
- ``optimizer``: ``torch.optim`` (its step counters, CPU tensors on every device unless the
  optimizer is ``capturable`` or ``fused``: not a device sync);
- ``trainer``: Lightning, transformers, accelerate;
- ``other``: the caller's own code (a test's sampler, a user's loop).

A frame belongs to a package when its resolved file lies under the resolved folder of that
package as imported here, never by a substring of its path: a checkout cloned into a folder
named ``stability`` holds torch in ``stability/.venv/...``, and torch is still torch there.

``StepBoundaries`` is a step sink (``core.sinks.StepSink``) that closes one interval per
optimizer step: the reads from one step's record to the next, within an epoch (an interval
that spans validation is left out), after ``warmup`` steps. tests/core/test_host_reads.py asserts
the counts; experiments/gpu_check.py prints them on a GPU, where only reads of CUDA tensors
are syncs (``device="cuda"``).
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
ORIGINS = ("ours", "scaler", "optimizer", "trainer", "other")
# A getter whose read belongs to whoever called it (``GradScaler.get_scale``: our ``measure``).
_ASKED = {"get_scale"}
# The files of torch's own tensor code (relative to torch's folder): a read made there is
# made for its caller.
_TORCH_TENSOR_CODE = ("_tensor.py", "_tensor_str.py", "overrides.py", "utils/_device.py")
# origin -> the packages whose folders hold its code, in the order they are tried (torch.amp
# before the rest of torch: none of torch is ours).
_PACKAGES = (("ours", ("stability",)), ("scaler", ("torch.amp", "torch.cuda.amp")),
             ("optimizer", ("torch.optim",)),
             ("trainer", ("lightning", "pytorch_lightning", "lightning_fabric", "transformers",
                          "accelerate")))


def _folders(name: str) -> list[Path]:
    """The resolved folders of package ``name`` as this interpreter imports it (none when it
    is not installed); found without importing it (its parent, torch, is imported already)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return [Path(os.path.realpath(f)) for f in (spec.submodule_search_locations or [])
            ] if spec else []


@functools.cache
def _roots() -> tuple[tuple[str, tuple[Path, ...]], ...]:
    return tuple((origin, tuple(f for name in names for f in _folders(name)))
                 for origin, names in _PACKAGES)


@functools.cache
def _origin(filename: str) -> str:
    """The origin of code in ``filename`` (a frame's ``co_filename``): by the resolved folder
    of the package it lies in."""
    if filename.startswith("<"):  # <string>, <frozen ...>: nobody's file
        return "other"
    path = Path(os.path.realpath(filename))
    for origin, folders in _roots():
        if any(path.is_relative_to(folder) for folder in folders):
            return origin
    return "other"


@functools.cache
def _is_tensor_code(filename: str) -> bool:
    """Whether ``filename`` is one of torch's own tensor files (``_TORCH_TENSOR_CODE``)."""
    torch_dir = Path(os.path.realpath(torch.__file__)).parent
    return Path(os.path.realpath(filename)) in {torch_dir / f for f in _TORCH_TENSOR_CODE}


class HostReads:
    """Counts host reads while entered (``with HostReads() as reads``), by origin.

    Args:
        device: count only reads of tensors on this device type (``cuda``: the reads that are
            device syncs); None: every read.

    Attributes:
        counts: ``(origin, method, "file:line")`` -> calls since the last ``reset``.
        counting: whether reads are counted now (``StepBoundaries`` switches it).
    """

    def __init__(self, device: str | None = None) -> None:
        self.device = device
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.counting = True
        self.allow_counted = False  # under SyncDebug: the counted reads may sync, nothing else
        self._saved: dict[str, Any] = {}
        self._inside = False

    def _wrap(self, name: str, method: Any) -> Any:
        reads = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if reads.counting and not reads._inside and (
                    reads.device is None or tensor.device.type == reads.device):
                frame = sys._getframe(1)
                while frame.f_back is not None and (
                        _is_tensor_code(frame.f_code.co_filename)
                        or frame.f_code.co_name in _ASKED):
                    frame = frame.f_back
                where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
                reads.counts[(_origin(frame.f_code.co_filename), name, where)] += 1
            reads._inside, outer = True, reads._inside  # a read inside a read counts once
            guarded = reads.allow_counted and not outer
            if guarded:  # a counted read may sync; any other sync raises (SyncDebug)
                torch.cuda.set_sync_debug_mode(0)
            try:
                return method(tensor, *args, **kwargs)
            finally:
                reads._inside = outer
                if guarded:
                    torch.cuda.set_sync_debug_mode("error")

        read.__name__ = name
        return read

    def __enter__(self) -> HostReads:
        for name in READS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, before in self._saved.items():
            if before is None:
                delattr(torch.Tensor, name)  # inherited from torch._C.TensorBase again
            else:
                setattr(torch.Tensor, name, before)
        self._saved.clear()

    def reset(self) -> collections.Counter[tuple[str, str, str]]:
        """The counts so far (then zero)."""
        counts, self.counts = self.counts, collections.Counter()
        return counts


def by_origin(counts: collections.Counter[tuple[str, str, str]]) -> dict[str, int]:
    """Total reads per origin (every origin in ``ORIGINS``, zero when none)."""
    totals = dict.fromkeys(ORIGINS, 0)
    for (origin, _, _), n in counts.items():
        totals[origin] += n
    return totals


class StepBoundaries:
    """A step sink that cuts the counted reads into one interval per optimizer step.

    Args:
        reads: the entered ``HostReads``.
        warmup: steps before the first interval counted (allocator, first kernels).
    """

    def __init__(self, reads: HostReads, warmup: int = 3) -> None:
        self.reads, self.warmup = reads, warmup
        self.steps: list[dict[str, int]] = []  # reads per origin, one entry per step
        self.skipped: list[bool] = []  # whether that step was skipped (its own reads: the skip
        # path names the bad parameter, backs the scale off)
        self.where: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._open = False  # an interval began at the previous step, in this epoch

    def on_step(self, log: Any, epoch: int = 0) -> None:
        """A step's record: close the interval since the previous one and open the next."""
        counts = self.reads.reset()
        if self._open:
            self.steps.append(by_origin(counts))
            self.skipped.append(bool(getattr(log, "skipped", False)))
            self.where.update(counts)
        self._open = log.step >= self.warmup

    def on_epoch(self, log: Any) -> None:
        """Validation lies between this epoch's last step and the next's first: not counted."""
        self._open = False
        self.reads.reset()

    def taken(self, origin: str = "ours") -> list[int]:
        """Reads of ``origin`` in each counted step that was taken (not skipped)."""
        return [s[origin] for s, skip in zip(self.steps, self.skipped, strict=True) if not skip]

    def per_step(self, origin: str = "ours") -> float:
        """Mean reads of ``origin`` per optimizer step over the counted steps."""
        assert self.steps, "no step was counted"
        return sum(s[origin] for s in self.steps) / len(self.steps)

    def table(self) -> dict[str, float]:
        """Mean reads per step for every origin."""
        return {o: self.per_step(o) for o in ORIGINS}


class SyncDebug:
    """A step sink that runs steps ``first + 1 .. last`` under
    ``torch.cuda.set_sync_debug_mode("error")`` (CUDA only): a device sync that is not one of
    the counted reads (a blocking copy, a data-dependent shape) raises there.

    Args:
        boundaries: the ``StepBoundaries`` counting the same steps (its reads may sync).
        first: the step whose record switches the mode on.
        last: the step whose record switches it off (before validation: keep it inside the
            epoch, whose evaluation copies batches without pinning).
    """

    def __init__(self, boundaries: StepBoundaries, first: int, last: int) -> None:
        self.boundaries, self.first, self.last = boundaries, first, last
        self.checked = 0  # steps run under the mode

    def on_step(self, log: Any, epoch: int = 0) -> None:
        """Count the step's reads; switch the mode on at ``first`` and off at ``last``."""
        self.boundaries.on_step(log, epoch)
        reads = self.boundaries.reads
        if self.first < log.step <= self.last:
            self.checked += 1
        if log.step == self.first:
            reads.allow_counted = True
            torch.cuda.set_sync_debug_mode("error")
        elif log.step == self.last:
            torch.cuda.set_sync_debug_mode(0)
            reads.allow_counted = False

    def on_epoch(self, log: Any) -> None:
        """The epoch ended: the mode is off (it should be already)."""
        torch.cuda.set_sync_debug_mode(0)
        self.boundaries.reads.allow_counted = False
        self.boundaries.on_epoch(log)


@contextmanager
def counted(device: str | None = None, warmup: int = 3) -> Iterator[StepBoundaries]:
    """``HostReads`` entered and its ``StepBoundaries`` (pass it as a step sink)."""
    with HostReads(device) as reads:
        yield StepBoundaries(reads, warmup)
