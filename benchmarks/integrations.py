"""Overhead of the trainer callbacks: the same trainer with and without ``StabilityCallback``.

``python -m benchmarks.integrations [--reps 5] [--epochs 2] [--out DIR]`` trains the default
task (``sign_sum``: its data, its model after ``torch.manual_seed``, AdamW, clip on, accum 1,
fp32, one thread) with each variant, interleaved (``timing.interleave``), and reports per fit
the wall and CPU seconds and their paired ratios:

- ``ours``: ``stability.core.loop.train`` with tracking off (our loop, instrumented);
- ``lightning``: a ``LightningModule`` of the task, no callback (no logger, no checkpointing,
  no progress bar); ``lightning_callback``: the same with ``StabilityCallback``;
- ``hf``: the HF ``Trainer`` on the task's model (dicts in, ``{"loss"}`` out);
  ``hf_callback``: the same, ``attach``-ed.

``lightning_callback / lightning`` and ``hf_callback / hf`` are the callbacks' costs (the issue
holds them to 1.05); ``lightning / ours`` and ``hf / ours`` are the trainers' own overhead over
our loop, stated, not ours to remove (wall only: a trainer's ``fit_s`` is its whole fit, setup
included, ours is its epochs). ``lightning_empty`` / ``hf_empty`` add a callback that does
nothing (``pl.Callback()``, ``TrainerCallback()``): what any callback costs in that trainer's
hook dispatch (``*_empty / lightning``), and what our callback's own work costs beyond it
(``*_callback / *_empty``). ``lightning_hooks`` / ``hf_hooks`` are the callback variants with
each of the callback's own methods timed (``HookTimer``: thread CPU time inside them): their
``hook_share`` is the callback's CPU over the rest of the same fit, one process, no pairing,
so the machine's drift between fits does not enter it (``1 + hook_share`` is the in-process
form of the paired ratio; it leaves out the trainer's dispatch, which ``*_empty`` measures).
With the trainer's norm clip on, the callback takes the clip's pre-clip norm where the clip
takes it (``_took_norm``, timed: the host read and the record's measurement); the norm and
the clip themselves are the trainer's own work, done once, and count as the rest of the fit.
The result also gives each timed fit's share range over the rounds and how often each timed
method ran in the first round (``hook_calls``: what the share covers).
Needs the ``lightning`` and ``hf`` extras.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.timing import Samples, interleave, paired_ratio
from stability.core.batches import task_of
from stability.core.config import ClipConfig, RunConfig, TrackingConfig, TrainConfig
from stability.core.loop import train

PAIRS = [("lightning_callback", "lightning"), ("hf_callback", "hf"),
         ("lightning", "ours"), ("hf", "ours"),
         ("lightning_empty", "lightning"), ("lightning_callback", "lightning_empty"),
         ("hf_empty", "hf"), ("hf_callback", "hf_empty")]


def bench_config(epochs: int, folder: Path) -> RunConfig:
    """The default task, clip on, one thread, tracking off."""
    return RunConfig(seed=0, device="cpu", output_dir=str(folder),
                     clip=ClipConfig(enabled=True, max_norm=1.0),
                     train=TrainConfig(epochs=epochs, threads=1),
                     tracking=TrackingConfig(enabled=False))


class HookTimer:
    """Thread CPU time spent inside a callback's own methods (wrapped on the instance: the
    trainers look hooks up with ``getattr``, and the HF callback calls ``_before_clip`` and
    ``add_micro_batch`` through ``self``)."""

    HOOKS = {"lightning": ("on_fit_start", "on_train_epoch_start", "on_before_optimizer_step",
                           "_took_norm", "on_train_batch_end", "on_train_epoch_end",
                           "on_fit_end"),
             "hf": ("on_train_begin", "on_epoch_begin", "_before_clip", "_took_norm",
                    "add_micro_batch", "on_pre_optimizer_step", "on_optimizer_step",
                    "on_step_end", "on_epoch_end", "on_evaluate", "on_train_end")}

    def __init__(self, trainer: str) -> None:
        self.names = self.HOOKS[trainer]
        self.ns = 0
        self.calls: dict[str, int] = dict.fromkeys(self.names, 0)  # what the share covers

    def attach(self, callback: Any) -> Any:
        """Wrap ``callback``'s hooks; returns it."""
        for name in self.names:
            setattr(callback, name, self._timed(name, getattr(callback, name)))
        return callback

    def _timed(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.thread_time_ns() - t0
                self.calls[name] += 1
        return timed


def _timed(fit: Any, timer: HookTimer | None = None) -> Samples:
    wall, cpu = time.perf_counter(), time.process_time()
    fit()
    out = {"fit_s": [time.perf_counter() - wall], "fit_cpu_s": [time.process_time() - cpu]}
    if timer is not None:
        hooks = timer.ns / 1e9
        out |= {"hook_cpu_s": [hooks], "hook_share": [hooks / (out["fit_cpu_s"][0] - hooks)]}
        out |= {f"calls.{name}": [float(n)] for name, n in timer.calls.items()}
    return out


def ours(cfg: RunConfig, folder: Path) -> Samples:
    """Our loop, instrumented, tracking off: its epochs' seconds (training + validation
    passes, ``EpochLog.seconds``), without building the data and the run folder."""
    import dataclasses

    result = train(dataclasses.replace(cfg, output_dir=str(folder)))
    return {"fit_s": [sum(e.seconds for e in result.epochs)]}


def lightning_fit(cfg: RunConfig, folder: Path, callback: bool | None,
                  timer: HookTimer | None = None) -> Samples:
    """The task through Lightning, with the callback (True; its hooks timed by ``timer``),
    an empty one (None) or none."""
    import lightning.pytorch as pl

    from stability.integrations.lightning import StabilityCallback, trainer_settings

    task = task_of(cfg)
    train_set, val_set = task.train_val()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = task.model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return task.loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", task.loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.net.parameters(), lr=cfg.train.lr,
                                     weight_decay=cfg.train.weight_decay)

    torch.manual_seed(cfg.seed)
    module = Module()
    trainer = pl.Trainer(
        devices=1, max_epochs=cfg.train.epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=([_timer_on(timer, StabilityCallback(folder))] if callback else
                   [pl.Callback()] if callback is None else []),
        **trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, "cpu"))
    loader = DataLoader(train_set, batch_size=cfg.train.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    return _timed(lambda: trainer.fit(module, loader, DataLoader(val_set, batch_size=1024)),
                  timer)


def _timer_on(timer: HookTimer | None, callback: Any) -> Any:
    return callback if timer is None else timer.attach(callback)


class _Model(nn.Module):
    def __init__(self, task: Any) -> None:
        super().__init__()
        self.task, self.net = task, task.model()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.net(x)
        return {"loss": self.task.loss(out, labels), "logits": out}


class _Dicts(Dataset):
    def __init__(self, pairs: Dataset) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[i]
        return {"x": x, "labels": y}


def hf_fit(cfg: RunConfig, folder: Path, callback: bool | None,
           timer: HookTimer | None = None) -> Samples:
    """The task through the HF Trainer, with the callback (True; its hooks timed by
    ``timer``), an empty one (None) or none."""
    import transformers

    from stability.integrations.hf import StabilityCallback, training_arguments

    task = task_of(cfg)
    train_set, val_set = task.train_val()
    torch.manual_seed(cfg.seed)
    args = transformers.TrainingArguments(
        output_dir=str(folder / "hf"), per_device_train_batch_size=cfg.train.batch_size,
        per_device_eval_batch_size=1024, num_train_epochs=cfg.train.epochs,
        learning_rate=cfg.train.lr, weight_decay=cfg.train.weight_decay,
        lr_scheduler_type="constant", report_to="none", save_strategy="no",
        eval_strategy="epoch", logging_strategy="epoch", seed=cfg.seed, disable_tqdm=True,
        **training_arguments(cfg.clip, cfg.precision, cfg.train.accum_steps, "cpu"))
    trainer = transformers.Trainer(model=_Model(task), args=args,
                                   train_dataset=_Dicts(train_set),
                                   eval_dataset=_Dicts(val_set))
    trainer.remove_callback(transformers.PrinterCallback)  # its log lines on stdout
    if callback:
        _timer_on(timer, StabilityCallback(folder)).attach(trainer)
    elif callback is None:
        trainer.add_callback(transformers.TrainerCallback())
    return _timed(trainer.train, timer)


def run(reps: int, epochs: int, out: Path) -> dict[str, Any]:
    """Every variant ``reps`` times, interleaved; medians and paired ratios."""
    torch.set_num_threads(1)
    cfg = bench_config(epochs, out / "ours")
    counter = iter(range(10**6))

    def folder(name: str) -> Path:
        return out / f"{name}-{next(counter)}"

    variants = {
        "ours": lambda: ours(cfg, folder("ours")),
        "lightning": lambda: lightning_fit(cfg, folder("pl"), callback=False),
        "lightning_callback": lambda: lightning_fit(cfg, folder("plcb"), callback=True),
        "hf": lambda: hf_fit(cfg, folder("hf"), callback=False),
        "hf_callback": lambda: hf_fit(cfg, folder("hfcb"), callback=True),
        "lightning_empty": lambda: lightning_fit(cfg, folder("plempty"), callback=None),
        "hf_empty": lambda: hf_fit(cfg, folder("hfempty"), callback=None),
        "lightning_hooks": lambda: lightning_fit(cfg, folder("plhooks"), True,
                                                 HookTimer("lightning")),
        "hf_hooks": lambda: hf_fit(cfg, folder("hfhooks"), True, HookTimer("hf")),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rounds = interleave(variants, reps)
    medians = {name: {m: statistics.median(x for r in rs for x in r[m])
                      for m in ("fit_s", "fit_cpu_s") if all(r.get(m) for r in rs)}
               for name, rs in rounds.items()}
    ratios = {f"{a}/{b}": {m: paired_ratio(rounds[a], rounds[b], m)
                           for m in ("fit_s", "fit_cpu_s")} for a, b in PAIRS}
    timed = ("lightning_hooks", "hf_hooks")
    shares = {name: [x for r in rounds[name] for x in r["hook_share"]] for name in timed}
    return {"reps": reps, "epochs": epochs, "medians": medians, "paired_ratios": ratios,
            "hook_share": {name: statistics.median(xs) for name, xs in shares.items()},
            "hook_share_range": {name: [min(xs), max(xs)] for name, xs in shares.items()},
            "hook_cpu_s": {name: statistics.median(x for r in rounds[name]
                                                   for x in r["hook_cpu_s"]) for name in timed},
            "hook_calls": {name: {k.removeprefix("calls."): int(v[0])
                                  for k, v in rounds[name][0].items()
                                  if k.startswith("calls.")} for name in timed}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line: ``--reps``, ``--epochs``, ``--out`` (a temp folder by default)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(a.reps, a.epochs, a.out or Path(tmp))
    print(json.dumps(result, indent=2))  # noqa: T201 - a benchmark script reports on stdout
    return result


if __name__ == "__main__":
    main()
