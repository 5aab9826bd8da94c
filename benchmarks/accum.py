"""The accumulation throughput curve: fixed micro-batch, accum_steps in {1, 2, 4, 8, 16}.

Throughput is measured on ``TrainStep`` with the plain model (what a single-process run
trains): every ``step(window)`` call is timed, all accumulation settings advance one epoch
per round, rounds interleave the settings. Gradient syncs per optimizer step are measured
separately on a world-size-1 ``DistributedDataParallel`` model (gloo): a DDP communication
hook counts the all-reduces that really happen, next to ``TrainStep.grad_syncs``. With the
plain model there is no all-reduce at all; the DDP count is what every rank would pay.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.spec import ACCUM_VALUES, BenchSpec
from stability.core.loop import windows
from stability.core.precision import resolve_device
from stability.core.step import TrainStep
from stability.tasks.sign_sum import SequenceClassifier, make_splits

FLAT_WITHIN = 0.05  # "flat": within 5% of the curve's best speedup (run-to-run noise here)


class _Trainer:
    """One accumulation setting: its own model, optimizer, ``TrainStep`` and shuffling."""

    def __init__(self, spec: BenchSpec, accum: int, wrap: Callable[[nn.Module], nn.Module]
                 | None = None) -> None:
        self.cfg = spec.run_config(".", accum_steps=accum)
        torch.set_num_threads(self.cfg.train.threads)
        self.device = resolve_device(self.cfg.device)
        self.train = make_splits(self.cfg.data).train
        torch.manual_seed(self.cfg.seed)
        model = SequenceClassifier(self.cfg.model).to(self.device)
        opt = torch.optim.AdamW(model.parameters(), lr=self.cfg.train.lr,
                                weight_decay=self.cfg.train.weight_decay)
        self.net = wrap(model) if wrap else model
        self.step = TrainStep.for_run(self.cfg, self.net, opt, nn.BCEWithLogitsLoss(),
                                      self.device)
        self.shuffle = torch.Generator().manual_seed(self.cfg.seed)

    def epoch(self) -> dict[str, Any]:
        """One epoch; per-step seconds, samples, losses and window sizes."""
        seconds, losses, sizes, samples = [], [], [], 0
        for window in windows(self.train, self.cfg.train, self.shuffle, self.device):
            t0 = time.perf_counter()
            log = self.step.step(window)  # returns host floats: the device has finished
            seconds.append(time.perf_counter() - t0)
            losses.append(log.loss)
            sizes.append(log.micro_batches)
            samples += log.samples
        return {"seconds": seconds, "losses": losses, "sizes": sizes, "samples": samples}


def throughput(spec: BenchSpec, accum_values: Sequence[int] = ACCUM_VALUES,
               say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """samples/s, median ms per optimizer step and mean loss for each accumulation setting.

    ``spec.accum_rounds`` rounds of one epoch per setting (the first round is a warm-up when
    there are two or more). ``speedup_vs_1`` is paired: per round, this setting's samples/s over
    accum_steps=1's in the same round, median over rounds (robust to drifting load). ms per step
    counts full windows only (an epoch's last window may be short). Mean loss is the mean
    training loss over the last round's epoch.
    """
    trainers = {a: _Trainer(spec, a) for a in accum_values}
    rounds: dict[int, list[dict[str, Any]]] = {a: [] for a in accum_values}
    for r in range(spec.accum_rounds):
        for a in accum_values if r % 2 == 0 else accum_values[::-1]:
            rounds[a].append(trainers[a].epoch())
        say(f"accum: round {r + 1}/{spec.accum_rounds}")

    def rates(a: int) -> list[float]:
        kept = rounds[a][1:] if len(rounds[a]) > 1 else rounds[a]
        return [e["samples"] / sum(e["seconds"]) for e in kept]

    base = rates(accum_values[0])
    curve = []
    for a in accum_values:
        kept = rounds[a][1:] if len(rounds[a]) > 1 else rounds[a]
        full = [s for e in kept for s, n in zip(e["seconds"], e["sizes"], strict=True) if n == a]
        every = [s for e in kept for s in e["seconds"]]
        curve.append({
            "accum_steps": a,
            "effective_batch": a * spec.run_config(".").train.batch_size,
            "samples_per_s": statistics.median(rates(a)),
            "speedup_vs_1": statistics.median(x / b for x, b in zip(rates(a), base,
                                                                      strict=True)),
            "ms_per_optimizer_step": 1e3 * statistics.median(full or every),
            "optimizer_steps_per_epoch": len(kept[-1]["seconds"]),
            "mean_loss": statistics.fmean(rounds[a][-1]["losses"]),
            "epochs_trained": len(rounds[a]),
        })
    return curve


def grad_syncs(spec: BenchSpec, accum_values: Sequence[int] = ACCUM_VALUES) -> dict[int, Any]:
    """All-reduces per optimizer step on a world-size-1 DDP model, counted by a comm hook.

    Returns:
        accum -> ``{"hook": all-reduces/step, "trainstep": TrainStep.grad_syncs/step}``.
    """
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from stability.tracking.server import free_port

    if dist.is_initialized():
        raise RuntimeError("grad_syncs needs its own process group; one is already initialised")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        out: dict[int, Any] = {}
        for a in accum_values:
            count = [0]

            # No annotations: DDP compares them with the real classes, and under
            # ``from __future__ import annotations`` they would be strings.
            def counting(state, bucket, count=count):  # type: ignore[no-untyped-def]
                count[0] += bucket.index() == 0  # one per all-reduce of the gradients
                return allreduce_hook(None, bucket)

            def wrap(model: nn.Module, hook: Callable = counting) -> nn.Module:
                ddp = nn.parallel.DistributedDataParallel(model)
                ddp.register_comm_hook(None, hook)
                return ddp

            trainer = _Trainer(spec, a, wrap)
            steps = len(trainer.epoch()["seconds"])
            out[a] = {"hook": count[0] / steps, "trainstep": trainer.step.grad_syncs / steps}
        return out
    finally:
        dist.destroy_process_group()


def flattens_at(curve: list[dict[str, Any]]) -> int:
    """The smallest accum_steps whose paired speedup is within ``FLAT_WITHIN`` of the best."""
    best = max(p["speedup_vs_1"] for p in curve)
    return next(p["accum_steps"] for p in curve if p["speedup_vs_1"] >= (1 - FLAT_WITHIN) * best)


def plot(curve: list[dict[str, Any]], path: Path) -> None:
    """samples/s and ms per optimizer step against accum_steps (log2 axis), as a PNG."""
    import matplotlib.pyplot as plt

    fig = draw(curve)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(curve: list[dict[str, Any]]) -> Any:
    """The accumulation curve's figure, unsaved (``plot`` saves it; tests inspect it).

    Args:
        curve: the points of the accum part, one per accum_steps.

    Returns:
        The matplotlib figure: throughput (left) and optimizer-step latency (right).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [p["accum_steps"] for p in curve]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(x, [p["samples_per_s"] for p in curve], marker="o")
    flat = flattens_at(curve)
    left.axvline(flat, color="grey", linestyle="--", label=f"flat from accum={flat}")
    left.set(xscale="log", xlabel="accum_steps (micro-batch 64)", ylabel="samples / s",
             title="Training throughput")
    left.legend()
    right.plot(x, [p["ms_per_optimizer_step"] for p in curve], marker="o", color="tab:orange")
    right.set(xscale="log", yscale="log", xlabel="accum_steps (micro-batch 64)",
              ylabel="median ms per optimizer step", title="Optimizer-step latency")
    for ax in (left, right):
        ax.set_xticks(x, [str(v) for v in x])
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
