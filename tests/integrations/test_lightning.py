"""The Lightning callback against our own loop: same model, data, seed and settings.

Our loop (``core.loop.train``) and a Lightning fit of the same task (``TaskModule`` below: the
task's model, loss and AdamW; the batches our loop draws, from the same seeded generator) must
record the same per-step pre-clip norms and losses in ``steps.csv``.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, Sampler  # noqa: E402

from stability.core.batches import task_of  # noqa: E402
from stability.core.config import (  # noqa: E402
    ClipConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.core.loop import train  # noqa: E402
from stability.core.steplog import CSV_COLUMNS  # noqa: E402
from stability.integrations.lightning import (  # noqa: E402
    StabilityCallback,
    trainer_settings,
)
from stability.tasks.sign_sum import DataConfig  # noqa: E402
from stability.tracking.contract import SCHEDULER_STEPPED  # noqa: E402
from tests.helpers.stores import sqlite_store  # noqa: E402

SEED = 5
MAX_NORM = 0.2  # clips some of the steps of this run, not all


class SeededBatches(Sampler[list[int]]):
    """Our loop's batches (``core.batches.windows``): one permutation per epoch, one generator."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size = n, batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[list[int]]:
        perm = torch.randperm(self.n, generator=self.generator)
        for i in range(0, self.n, self.batch_size):
            yield perm[i : i + self.batch_size].tolist()

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)


class TaskModule(pl.LightningModule):
    """A task trained by Lightning: its model, its loss, AdamW as our loop builds it."""

    def __init__(self, task, lr: float, weight_decay: float,  # noqa: ANN001
                 scheduler: bool = False) -> None:
        super().__init__()
        self.task, self.lr, self.weight_decay = task, lr, weight_decay
        self.net = task.model()
        self.scheduler = scheduler

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return self.task.loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        self.log("val_loss", self.task.loss(self.net(x).float(), y), prog_bar=False)

    def configure_optimizers(self):  # noqa: ANN201
        opt = torch.optim.AdamW(self.net.parameters(), lr=self.lr,
                                weight_decay=self.weight_decay)
        if not self.scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _cfg(tmp: Path, precision: str, accum: int = 2) -> RunConfig:
    # 300 samples -> a train split whose windows of 16 x 2 are all full (Lightning divides
    # every micro-batch loss by accumulate_grad_batches, a short last window included).
    return RunConfig(seed=SEED, device="cpu", output_dir=str(tmp),
                     data=DataConfig(num_samples=300), precision=PrecisionConfig(precision),
                     clip=ClipConfig(enabled=True, max_norm=MAX_NORM),
                     train=TrainConfig(epochs=2, batch_size=16, accum_steps=accum))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def fit_lightning(cfg: RunConfig, folder: Path, *, per_layer: bool = False,
                  scheduler: bool = False, sinks: tuple = (), **overrides) -> StabilityCallback:
    """Fit the run's task with Lightning and the callback, as our loop would train it: the
    run's clip/precision/accumulation through ``trainer_settings`` (``overrides`` win);
    ``sinks`` go to the callback."""
    task = task_of(cfg)
    train_set, val_set = task.train_val()
    torch.manual_seed(cfg.seed)  # our loop's training seed, then the model
    module = TaskModule(task, cfg.train.lr, cfg.train.weight_decay, scheduler=scheduler)
    cb = StabilityCallback(folder, per_layer=per_layer, sinks=sinks)
    loader = DataLoader(train_set, batch_sampler=SeededBatches(len(train_set),
                                                               cfg.train.batch_size, cfg.seed))
    settings = trainer_settings(cfg.clip, cfg.precision, cfg.train.accum_steps, "cpu")
    trainer = pl.Trainer(
        devices=1, max_epochs=cfg.train.epochs, callbacks=[cb], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **(settings | overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no workers", "lr_scheduler.step() before ..."
        trainer.fit(module, loader, DataLoader(val_set, batch_size=1024))
    return cb


def max_diff(ours: list[dict[str, str]], theirs: list[dict[str, str]], col: str) -> float:
    """The largest |difference| of a numeric column, step by step."""
    assert len(ours) == len(theirs)
    return max(abs(float(a[col]) - float(b[col])) for a, b in zip(ours, theirs, strict=True))


def test_fp32_clip_accum2_matches_our_loop(tmp_path: Path) -> None:
    """fp32, clip on, accum 2: per-step pre-clip norms and losses agree within 1e-5."""
    cfg = _cfg(tmp_path / "ours", "fp32")
    ours = _rows(train(cfg).csv_path)
    cb = fit_lightning(cfg, tmp_path / "pl", per_layer=True)
    theirs = _rows(tmp_path / "pl" / "steps.csv")
    assert [int(r["step"]) for r in theirs] == [int(r["step"]) for r in ours]
    for col in ("grad_l2_pre_clip", "loss", "grad_l2_post_clip", "lr"):
        assert max_diff(ours, theirs, col) < 1e-5, col
    assert [r["clipped"] for r in theirs] == [r["clipped"] for r in ours]
    assert 0 < sum(int(r["clipped"]) for r in ours) < len(ours)  # the comparison means something
    assert [r["micro_batches"] for r in theirs] == [r["micro_batches"] for r in ours]
    assert [r["samples"] for r in theirs] == [r["samples"] for r in ours]
    assert [r["epoch"] for r in theirs] == [r["epoch"] for r in ours]
    # The same sinks: our columns in our order, then the trainer's scheduler column.
    with (tmp_path / "pl" / "steps.csv").open() as f:
        assert next(csv.reader(f)) == [*CSV_COLUMNS, SCHEDULER_STEPPED]
    layers = _rows(tmp_path / "pl" / "layer_norms.csv")
    assert len(layers) == len(theirs)
    assert cb.summary()["optimizer_steps"] == len(ours)
    assert len(cb.recorder.epochs) == 2 and math.isfinite(cb.recorder.epochs[0].val_loss)


def _skipping_fp16(tmp: Path) -> RunConfig:
    # A start scale of 2**30 overflows the fp16 backward: the first steps are skipped while
    # the scale halves (11 of 14 here), then it grows every 3 steps and overflows again.
    cfg = _cfg(tmp, "fp16")
    return RunConfig(**{**vars(cfg), "precision": PrecisionConfig("fp16", init_scale=2.0**30,
                                                                  growth_interval=3)})


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_matches_our_loop(tmp_path: Path, precision: str) -> None:
    """bf16 and fp16 (``trainer_settings``: the scaler as a plugin): norms and losses within
    1e-5, the same scale trace and the same skipped steps, step by step."""
    cfg = _skipping_fp16(tmp_path / "ours") if precision == "fp16" else _cfg(tmp_path / "ours",
                                                                             precision)
    ours = _rows(train(cfg).csv_path)
    fit_lightning(cfg, tmp_path / "pl")
    theirs = _rows(tmp_path / "pl" / "steps.csv")
    assert [r["skipped"] for r in theirs] == [r["skipped"] for r in ours]
    assert [r["skip_reason"] for r in theirs] == [r["skip_reason"] for r in ours]
    assert [float(r["scaler_scale"]) for r in theirs] == [float(r["scaler_scale"]) for r in ours]
    taken = [i for i, r in enumerate(ours) if r["skipped"] == "0"]
    assert taken
    for col in ("grad_l2_pre_clip", "loss"):
        assert max(abs(float(ours[i][col]) - float(theirs[i][col])) for i in taken) < 1e-5
    if precision == "fp16":
        assert 0 < len(taken) < len(ours)
    else:
        assert {r["scaler_scale"] for r in theirs} == {"1.0"}


def test_scheduler_advanced_on_skipped_steps_is_recorded(tmp_path: Path) -> None:
    """Lightning steps an interval-"step" scheduler on fp16 steps the scaler skipped (#5558):
    the row says so, the lr falls across steps that changed nothing, the summary counts it."""
    cfg = _skipping_fp16(tmp_path / "ours")
    cb = fit_lightning(cfg, tmp_path / "pl", scheduler=True)
    rows = _rows(tmp_path / "pl" / "steps.csv")
    skipped = [r for r in rows if r["skipped"] == "1"]
    assert skipped and all(r[SCHEDULER_STEPPED] == "1" for r in skipped)
    assert float(rows[1]["lr"]) < float(rows[0]["lr"])  # step 1 was skipped, yet lr decayed
    assert rows[0]["skipped"] == "1"
    assert cb.summary()["scheduler_steps_on_skip"] == len(skipped)


def test_without_scheduler_nothing_is_recorded_as_stepped(tmp_path: Path) -> None:
    """The column is measured, not assumed: no scheduler, no ``scheduler_stepped``."""
    cfg = _skipping_fp16(tmp_path / "ours")
    cb = fit_lightning(cfg, tmp_path / "pl")
    rows = _rows(tmp_path / "pl" / "steps.csv")
    assert any(r["skipped"] == "1" for r in rows)
    assert {r[SCHEDULER_STEPPED] for r in rows} == {"0"}
    assert cb.summary()["scheduler_steps_on_skip"] == 0


def test_16_mixed_on_cpu_is_bf16_in_lightning(tmp_path: Path) -> None:
    """Lightning 2.6 turns ``precision="16-mixed"`` on CPU into bf16-mixed (a warning only):
    no GradScaler, so the record shows scale 1.0 on every step. A study must not take it for
    fp16 (docs/integrations.md)."""
    cfg = _cfg(tmp_path / "ours", "fp16")
    fit_lightning(cfg, tmp_path / "pl", precision="16-mixed", plugins=None)
    rows = _rows(tmp_path / "pl" / "steps.csv")
    assert {float(r["scaler_scale"]) for r in rows} == {1.0}


def test_a_lightning_fit_is_a_tracked_run_the_report_reads(tmp_path: Path) -> None:
    """The callback's sinks take a ``TrackedRun``'s buffer: MLflow holds every step of
    ``steps.csv``, the epochs, the summary (with ``scheduler_steps_on_skip``) and the CSV."""
    from mlflow.tracking import MlflowClient

    from stability.core.config import TrackingConfig
    from stability.report.evidence.fetch import fetch_runs, find_sweep
    from stability.tracking.contract import Kind, Tag
    from stability.tracking.run import RunRecord, TrackedRun

    cfg = _cfg(tmp_path / "unused", "fp32")
    uri, folder = sqlite_store(tmp_path / "mlflow.db"), tmp_path / "pl"
    tags = {Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: "pl-1", Tag.FINGERPRINT: "beef", Tag.SEED: "5",
            Tag.LOSS_NAME: "BCE"}
    record = RunRecord(params={"task._target_": "tests.TaskModule", "trainer": "lightning"},
                       tags=tags, folder=folder, name="lightning s=5",
                       tracking=TrackingConfig(uri=uri, experiment="pl"))
    with TrackedRun(record) as tracked:
        task = task_of(cfg)
        train_set, val_set = task.train_val()
        torch.manual_seed(cfg.seed)
        cb = StabilityCallback(folder, sinks=[tracked.sink])
        trainer = pl.Trainer(accelerator="cpu", max_epochs=2, callbacks=[cb], logger=False,
                             gradient_clip_val=MAX_NORM, accumulate_grad_batches=2,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(TaskModule(task, 2e-3, 0.0), DataLoader(train_set, batch_size=16),
                        DataLoader(val_set, batch_size=1024))
        tracked.finish(cb.summary(), "finished")
    assert not tracked.pending

    rows = _rows(folder / "steps.csv")
    c = MlflowClient(uri)
    history = c.get_metric_history(tracked.run_id, "grad_l2_pre_clip")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(
        range(1, len(rows) + 1))
    by_step = {m.step: m.value for m in history}
    assert all(abs(by_step[int(r["step"])] - float(r["grad_l2_pre_clip"])) < 1e-12 for r in rows)
    assert [m.step for m in c.get_metric_history(tracked.run_id, "val_loss")] == [1, 2]
    run = c.get_run(tracked.run_id)
    assert run.data.metrics["scheduler_steps_on_skip"] == 0
    assert run.data.metrics["optimizer_steps"] == len(rows)
    assert "steps.csv" in {a.path for a in c.list_artifacts(tracked.run_id)}
    [row] = fetch_runs(c, find_sweep(c, "pl", "pl-1")).to_dict("records")
    assert row["outcome"] == "finished" and row["best_val_loss"] == cb.summary()["best_val_loss"]


def test_per_layer_norms_match_our_loops_table(tmp_path: Path) -> None:
    """``layer_norms.csv`` through the same recorder: the same per-parameter pre-clip norms
    (names carry the module's attribute prefix, ``net.``)."""
    cfg = _cfg(tmp_path / "ours", "fp32")
    train(cfg)  # telemetry.per_layer is on by default
    fit_lightning(cfg, tmp_path / "pl", per_layer=True)
    ours, theirs = (_rows(p / "layer_norms.csv") for p in (tmp_path / "ours", tmp_path / "pl"))
    assert [f"net.{k}" for k in ours[0]][1:] == list(theirs[0])[1:]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert all(abs(float(x) - float(y)) < 1e-5
                   for x, y in zip(list(a.values())[1:], list(b.values())[1:], strict=True))


class PoisonedModule(TaskModule):
    """Its loss is inf on the third micro-batch: a non-finite gradient."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx == 2 else loss


def test_without_a_scaler_lightning_applies_a_nonfinite_update(tmp_path: Path) -> None:
    """32-true: nothing skips the step; the row says the update was taken (``skipped=0``) on a
    non-finite norm and names the parameter, and every later norm is nan (the weights are)."""
    cfg = _cfg(tmp_path / "unused", "fp32", accum=1)
    task = task_of(cfg)
    train_set, _ = task.train_val()
    torch.manual_seed(cfg.seed)
    cb = StabilityCallback(tmp_path / "pl")
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_train_batches=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(PoisonedModule(task, 2e-3, 0.0), DataLoader(train_set, batch_size=16))
    rows = _rows(tmp_path / "pl" / "steps.csv")
    assert [math.isfinite(float(r["grad_l2_pre_clip"])) for r in rows] == [True, True, False,
                                                                             False, False]
    assert {r["skipped"] for r in rows} == {"0"}
    assert rows[2]["nonfinite_param"].startswith("net.")


def test_trainer_record_groups_seeds_and_separates_settings(tmp_path: Path) -> None:
    """Seeds of one setting share a fingerprint, another setting does not; the record has
    every tag and param the report needs (``contract.missing_records``)."""
    from stability.integrations.trainer_run import RunIdentity, trainer_record
    from stability.tracking.contract import Tag, missing_records

    settings = {"precision.name": "fp16", "clip.max_norm": 1.0}
    a, b = (trainer_record(tmp_path, RunIdentity(target="m.M", trainer="lightning",
                                                 settings=settings, seed=s, sweep_id="x"))
            for s in (0, 1))
    c = trainer_record(tmp_path, RunIdentity(target="m.M", trainer="lightning",
                                             settings=settings | {"clip.max_norm": 0.5}, seed=0,
                                             sweep_id="x"))
    d = trainer_record(tmp_path, RunIdentity(target="m.M", trainer="hf", settings=settings,
                                             seed=0, sweep_id="x"))
    assert a.tags[Tag.FINGERPRINT] == b.tags[Tag.FINGERPRINT]
    assert len({a.tags[Tag.FINGERPRINT], c.tags[Tag.FINGERPRINT], d.tags[Tag.FINGERPRINT]}) == 3
    assert (a.tags[Tag.SEED], b.tags[Tag.SEED]) == ("0", "1")
    assert missing_records(a.tags, a.params) == []
    assert a.params["trainer"] == "lightning" and a.params["clip.max_norm"] == "1.0"


class OwnClipModule(TaskModule):
    """Overrides the clipping hook (clipping the same way): the callback measures the post-clip
    norm on the clipped gradients instead of deriving it."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,  # noqa: ANN001
                                    gradient_clip_algorithm=None) -> None:
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)


def test_derived_post_clip_norm_equals_the_measured_one(tmp_path: Path) -> None:
    """The post-clip norm derived for a standard clip is the norm of what Lightning left."""
    cfg = _cfg(tmp_path / "unused", "fp32")
    rows = {}
    for name, cls in (("derived", TaskModule), ("measured", OwnClipModule)):
        task = task_of(cfg)
        train_set, _ = task.train_val()
        torch.manual_seed(cfg.seed)
        cb = StabilityCallback(tmp_path / name)
        trainer = pl.Trainer(max_epochs=1, callbacks=[cb], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False,
                             **trainer_settings(cfg.clip, cfg.precision, 2, "cpu"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(cls(task, 2e-3, 0.0), DataLoader(
                train_set, batch_sampler=SeededBatches(len(train_set), 16, cfg.seed)))
        rows[name] = _rows(tmp_path / name / "steps.csv")
        assert cb.recorder.derive_norm_clip is (name == "derived")
    assert 0 < sum(int(r["clipped"]) for r in rows["derived"]) < len(rows["derived"])
    assert max_diff(rows["derived"], rows["measured"], "grad_l2_post_clip") < 1e-6
    assert [r["clipped"] for r in rows["derived"]] == [r["clipped"] for r in rows["measured"]]


class SameBatches(SeededBatches):
    """The same shuffled order every epoch: what a resumed fit draws cannot depend on how
    Lightning numbers the epoch it restarts (``set_epoch`` after a restore is Lightning's)."""

    def __iter__(self) -> Iterator[list[int]]:
        self.generator = torch.Generator().manual_seed(1000)
        return super().__iter__()


class StopAt(pl.Callback):
    """Fails the fit at one batch of one epoch: a crash after the last checkpoint."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise RuntimeError("crash")


def test_a_fit_resumed_from_its_checkpoint_writes_the_same_files(tmp_path: Path) -> None:
    """Crash in epoch 3 after the epoch-2 checkpoint, resume from it: ``steps.csv`` and
    ``layer_norms.csv`` are byte-identical to those of a fit never interrupted (the callback's
    state rides in Lightning's checkpoint; the rows after it are cut and written again)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    cfg = _cfg(tmp_path / "unused", "fp32")

    def fit(folder: Path, extra: list, ckpt: str | None = None) -> None:
        task = task_of(cfg)
        train_set, _ = task.train_val()
        torch.manual_seed(cfg.seed)
        trainer = pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path,
                             enable_checkpointing=bool(extra),
                             callbacks=[StabilityCallback(folder, per_layer=True), *extra],
                             **trainer_settings(cfg.clip, cfg.precision, 2, "cpu"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(TaskModule(task, 2e-3, 0.0), DataLoader(
                train_set, batch_sampler=SameBatches(len(train_set), 16, cfg.seed)),
                ckpt_path=ckpt)

    fit(tmp_path / "whole", [])
    ckpts = tmp_path / "ckpt"
    saver = ModelCheckpoint(dirpath=ckpts, save_last=True, save_on_train_epoch_end=True,
                            every_n_epochs=1)
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path / "resumed", [saver, StopAt(epoch=2, batch=9)])
    crashed = _rows(tmp_path / "resumed" / "steps.csv")
    assert int(crashed[-1]["epoch"]) == 3  # rows past the checkpoint exist before the resume
    fit(tmp_path / "resumed", [ModelCheckpoint(dirpath=ckpts)], ckpt=str(ckpts / "last.ckpt"))
    for name in ("steps.csv", "layer_norms.csv"):
        whole = (tmp_path / "whole" / name).read_bytes()
        assert (tmp_path / "resumed" / name).read_bytes() == whole, name
    assert len(_rows(tmp_path / "whole" / "steps.csv")) > len(crashed)


def test_lightnings_clip_norm_is_the_records_one_taken_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With Lightning's norm clip the gradients are normed once an optimizer step
    (``torch._foreach_norm``, counted by a wrapper that calls the real one), by the clip,
    whose norm the record reads; the plugin is left as it was after the fit."""
    real = torch._foreach_norm
    calls: list[int] = []

    def counted(tensors, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(len(tensors))
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    cb = fit_lightning(_cfg(tmp_path / "unused", "fp32"), tmp_path / "pl")
    rows = _rows(tmp_path / "pl" / "steps.csv")
    assert len(calls) == len(rows) > 0
    assert 0 < sum(int(r["clipped"]) for r in rows) < len(rows)
    assert cb._plugin is None


def test_a_nonfinite_norm_under_lightnings_clip_names_the_parameter(tmp_path: Path) -> None:
    """The norm is read before the clip scales the gradients (by nan or 0 when the norm is
    not finite): the row still names a parameter that went non-finite, and the trainer's
    precision plugin has no wrapper left on it."""
    cfg = _cfg(tmp_path / "unused", "fp32", accum=1)
    task = task_of(cfg)
    train_set, _ = task.train_val()
    torch.manual_seed(cfg.seed)
    cb = StabilityCallback(tmp_path / "pl")
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_train_batches=4,
                         gradient_clip_val=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(PoisonedModule(task, 2e-3, 0.0), DataLoader(train_set, batch_size=16))
    rows = _rows(tmp_path / "pl" / "steps.csv")
    assert [math.isfinite(float(r["grad_l2_pre_clip"])) for r in rows] == [True, True, False,
                                                                             False]
    assert rows[2]["nonfinite_param"].startswith("net.")
    assert "clip_grad_by_norm" not in vars(trainer.precision_plugin)
