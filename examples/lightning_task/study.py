"""A small study of the user's Lightning model: precision x clipping x seeds, each run tracked.

    python study.py                 # 12 runs into ./mlflow.db (experiment lightning-spirals)
    python study.py --epochs 1 --seeds 0   # quicker
    python study.py --precisions fp16 --init-scale 1e9   # skipped steps: see scheduler_stepped
    stability ui                    # the runs, their per-step metrics, steps.csv

Each run is the user's ``SpiralMLP`` + ``SpiralData`` trained by Lightning as always (their
AdamW and per-step LR schedule), with ``StabilityCallback`` recording every optimizer step and
a ``TrackedRun`` sending it to MLflow. Our settings reach the trainer through
``trainer_settings`` (fp16 on CPU as a GradScaler plugin: Lightning's "16-mixed" would be bf16).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from spirals import SpiralData, SpiralMLP

from stability.core.config import ClipConfig, PrecisionConfig, TrackingConfig
from stability.integrations.lightning import StabilityCallback, trainer_settings
from stability.integrations.record import trainer_record
from stability.tracking.run import TrackedRun


def run_point(precision: str, max_norm: float | None, seed: int, epochs: int,
              out: Path, tracking: TrackingConfig, init_scale: float = 2.0**16) -> dict:
    """One (settings, seed) run; its summary."""
    clip = ClipConfig(enabled=max_norm is not None, max_norm=max_norm or 1.0)
    settings = {"precision.name": precision, "clip.enabled": clip.enabled,
                "clip.max_norm": max_norm, "train.accum_steps": 1, "train.epochs": epochs,
                "precision.init_scale": init_scale}
    folder = out / f"{precision}-clip{max_norm}-s{seed}"
    record = trainer_record(folder, target="spirals.SpiralMLP", trainer="lightning",
                            settings=settings, seed=seed, sweep_id="lightning-spirals",
                            loss_name="BCE", tracking=tracking)
    precision_cfg = PrecisionConfig(precision, init_scale=init_scale)
    with TrackedRun(record) as tracked:
        pl.seed_everything(seed, verbose=False)
        cb = StabilityCallback(folder, per_layer=True, sinks=[tracked.sink])
        trainer = pl.Trainer(max_epochs=epochs, callbacks=[cb], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             **trainer_settings(clip, precision_cfg, 1, "cpu"))
        trainer.fit(SpiralMLP(), SpiralData())
        summary = cb.summary()
        tracked.finish(summary, "finished")
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    p.add_argument("--out", type=Path, default=Path("runs"))
    p.add_argument("--init-scale", type=float, default=2.0**16,
                   help="fp16's starting loss scale (2**30 makes the first steps overflow)")
    p.add_argument("--uri", default=f"sqlite:///{Path('mlflow.db').resolve()}")
    a = p.parse_args()
    torch.set_num_threads(1)
    tracking = TrackingConfig(uri=a.uri, experiment="lightning-spirals")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    for precision in a.precisions:
        for max_norm in (None, 1.0, 0.25):
            for seed in a.seeds:
                s = run_point(precision, max_norm, seed, a.epochs, a.out, tracking,
                              a.init_scale)
                print(f"{precision} clip={max_norm} seed={seed}: best val loss "
                      f"{s['best_val_loss']:.4f}, clipped {s['clip_fraction']:.0%} of "
                      f"{s['optimizer_steps']} steps, skipped {s['skip_count']} "
                      f"(scheduler stepped on {s['scheduler_steps_on_skip']} of them)")


if __name__ == "__main__":
    main()
