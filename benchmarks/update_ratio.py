"""Cost of ``telemetry.update_ratio`` (||delta theta|| / ||theta||): paired, interleaved.

    PYTHONPATH=. python -m benchmarks.update_ratio --reps 5 --epochs 4

Both variants are ``stability.core.loop.train`` of the benchmark's config (``BenchSpec``:
one thread, clipping on, tracking off) with ``telemetry.per_layer=true``; they differ only in
``telemetry.update_ratio``. The pattern of ``benchmarks/overhead.py``: variants interleaved
A B, B A, ..., the warm-up epoch dropped, per round the median step time of each, and the
headline is the median over rounds of their ratio (``timing.paired_ratio``), in CPU seconds
(what other jobs on a shared machine cannot inflate) and wall seconds. The target is 1.03.
On a loaded machine those ratios scatter by +-10% a round, so ``recorder`` also times the
recorder itself in-process (microseconds a step with and without the ratio) and divides the
difference by the runs' median step: the figure the target is checked against.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.spec import BenchSpec
from benchmarks.timing import StepClock, interleave, paired_ratio, paired_ratios
from stability.core.config import TelemetryConfig
from stability.core.loop import train

TARGET = 1.03


def _samples(spec: BenchSpec, out: Path, update_ratio: bool) -> dict[str, list[float]]:
    cfg = spec.run_config(str(out), per_layer=True)
    cfg = dataclasses.replace(cfg, telemetry=TelemetryConfig(per_layer=True,
                                                             update_ratio=update_ratio))
    clock = StepClock(skip_epochs=1 if cfg.train.epochs > 1 else 0)
    cpu0 = time.process_time()
    train(cfg, sinks=[clock])
    return {"step_cpu_s": clock.cpu, "step_wall_s": clock.wall,
            "run_cpu_s": [time.process_time() - cpu0]}


def measure(spec: BenchSpec, root: Path) -> dict[str, Any]:
    """Interleaved runs with and without the update ratio; paired ratios per metric."""
    n = iter(range(10**6))

    def variant(on: bool) -> Any:
        return lambda: _samples(spec, root / f"{'on' if on else 'off'}-{next(n)}", on)

    _samples(spec.replace(epochs=1), root / "warmup", True)  # imports, first kernels
    rounds = interleave({"off": variant(False), "on": variant(True)}, spec.reps)
    off_wall = statistics.median(v for r in rounds["off"] for v in r["step_wall_s"])
    ratios = {metric: {"ratio": paired_ratio(rounds["on"], rounds["off"], metric),
                       "per_round": paired_ratios(rounds["on"], rounds["off"], metric)}
              for metric in ("step_cpu_s", "step_wall_s", "run_cpu_s")}
    return {"off_step_wall_us": off_wall * 1e6, **ratios,
            "target": TARGET, "reps": spec.reps, "epochs": spec.epochs,
            "accum_steps": spec.accum_steps, "num_samples": spec.num_samples}


def recorder_us(spec: BenchSpec, root: Path, calls: int = 2000, reps: int = 7) -> dict[str, float]:
    """The recorder's own time a step, with and without the ratio, on the benchmark's model.

    The in-process figure that load cannot blur: microseconds a step the update ratio adds
    (``on_gradients`` + the larger ``on_step``), to set against the step time of the runs.
    """
    from stability.core.batches import task_of
    from stability.core.layers import LayerNormRecorder
    from stability.core.steplog import StepLog

    model = task_of(spec.run_config(str(root / "micro"))).model()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    log = StepLog(step=1, lr=1e-3, grad_l2_pre_clip=1.0, grad_l2_post_clip=1.0, loss=0.5,
                  skipped=False, skip_reason="", scaler_scale=1.0, clipped=False,
                  micro_batches=1, samples=64, skips_cumulative=0)

    def per_call(ratio: bool) -> float:
        rec = LayerNormRecorder(model, False, root / "n.csv",
                                root / "u.csv" if ratio else None)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for i in range(calls):
                rec.on_gradients(i, None)
                rec.on_step(log)
            times.append((time.perf_counter() - t0) / calls)
            rec.norms.rows.clear()
            if rec.updates is not None:
                rec.updates.rows.clear()
        return statistics.median(times) * 1e6

    off, on = per_call(False), per_call(True)
    return {"per_layer_us": off, "per_layer_and_ratio_us": on, "ratio_us": on - off}


def main() -> None:
    """Print the paired ratios as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--accum-steps", type=int, default=1)
    args = ap.parse_args()
    spec = BenchSpec(reps=args.reps, epochs=args.epochs, accum_steps=args.accum_steps)
    with tempfile.TemporaryDirectory(prefix="bench-update-ratio-") as tmp:
        torch.set_num_threads(1)
        result = measure(spec, Path(tmp))
        micro = recorder_us(spec, Path(tmp))
        step_us = result.pop("off_step_wall_us")
        result["recorder"] = micro | {"step_wall_us": step_us,
                                      "ratio_share_of_step": micro["ratio_us"] / step_us}
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
