"""What a run costs on its device: median seconds per optimizer step and peak memory.

The report weighs these against the loss ("the cheapest config among those
equivalent to the best"), so both are measured the same way for every config of a study:

- ``step_time_median_s``: the median wall time of ``TrainStep.step`` over the run's optimizer
  steps (forward, backward, unscale, clip, optimizer step of one window). The median, not the
  mean: a worker's first steps pay its cold start (allocator, first kernels). Each step ends
  with one host read of its results, so on CUDA the timed interval includes the device work.
- ``step_cpu_median_s`` (CPU runs): the median CPU time of the training thread between two
  optimizer steps (``time.thread_time``). Wall time on a shared machine carries the load of
  whatever else runs: in the default study, clipping at max_norm 10 measured 1.21x clip off
  though it does the same work. CPU time counts the work the step does (runs use one intra-op
  thread, ``train.threads: 1``), so the report weighs cost by it where it exists
  (``report.decide.select.train_seconds``). Not recorded on CUDA, where the device's time is the
  cost.
- ``peak_memory_mb``: on CUDA, ``torch.cuda.max_memory_allocated`` (reset at the start of the
  run): the tensors the run allocated. On CPU there is no allocator statistic, so it is the
  process's peak resident set during the run: Linux's ``VmHWM`` after resetting it through
  ``/proc/self/clear_refs`` at the start of the run. It includes the interpreter and the
  imported libraries (the same for every config of a study), so compare configs by its
  differences. Where the peak cannot be reset (not Linux), nothing is recorded: a lifetime peak
  of a worker process that ran other configs before would be a number about another run.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# summary metrics (contract.py)
COST_METRICS = ("step_time_median_s", "step_cpu_median_s", "peak_memory_mb")
# What every run records about its steps, whichever loop trains it (``run_costs``): the report
# names a run that lacks one instead of reading something else in its place.
RUN_COST_METRICS = ("step_time_median_s", "peak_memory_mb", "effective_batch", "grad_syncs",
                    "final_scaler_scale")
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _vm_hwm_mb() -> float:
    match = re.search(r"VmHWM:\s+(\d+)\s*kB", _STATUS.read_text())
    return int(match.group(1)) / 1024 if match else math.nan


class CostMeter:
    """Times optimizer steps and tracks the run's peak memory on ``device`` (``cpu``/``cuda``)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.step_seconds: list[float] = []
        self.step_cpu: list[float] = []
        self._cpu_last = time.thread_time()
        self._cpu_peak = False
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:  # "5" resets the peak RSS (VmHWM) of this process (Linux >= 4.0)
                _CLEAR_REFS.write_text("5")
                self._cpu_peak = math.isfinite(_vm_hwm_mb())
            except OSError:
                log.debug("peak RSS cannot be reset here: peak_memory_mb not recorded")

    def on_step(self, seconds: float) -> None:
        """Record one optimizer step's wall time (and the thread's CPU time since the last)."""
        self.step_seconds.append(seconds)
        now = time.thread_time()
        self.step_cpu.append(now - self._cpu_last)
        self._cpu_last = now

    def summary(self) -> dict[str, float]:
        """``COST_METRICS`` (NaN where not measured)."""
        median = statistics.median(self.step_seconds) if self.step_seconds else math.nan
        # The first interval runs from the meter's creation (set-up, not a step): left out.
        cpu = statistics.median(self.step_cpu[1:]) if len(self.step_cpu) > 1 else math.nan
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            peak = _vm_hwm_mb() if self._cpu_peak else math.nan
        return {"step_time_median_s": median, "peak_memory_mb": peak,
                "step_cpu_median_s": cpu if self.device.type == "cpu" else math.nan}


def final_scale(scaler: torch.amp.GradScaler | None) -> float:
    """The loss scale a run ends with: the GradScaler's, 1.0 without one (fp32, bf16)."""
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0


def run_costs(meter: CostMeter, scaler: torch.amp.GradScaler | None, effective_batch: float,
              grad_syncs: int) -> dict[str, float]:
    """The run's ``RUN_COST_METRICS``, one computation for our loop and for every trainer.

    Args:
        meter: the run's step timer and memory peak.
        scaler: its GradScaler (None or disabled: no loss scaling, scale 1.0).
        effective_batch: samples per optimizer step (batch x accumulation x ranks; NaN when
            the trainer's loader does not say).
        grad_syncs: backward passes that synchronise gradients (one per optimizer step in one
            process; outside ``no_sync`` under DDP).
    """
    return meter.summary() | {"final_scaler_scale": final_scale(scaler),
                              "effective_batch": effective_batch, "grad_syncs": grad_syncs}
