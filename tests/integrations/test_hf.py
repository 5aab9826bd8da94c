"""The HF Trainer callback against our own loop and against the Trainer's own ``grad_norm``.

Same model, data order, seed and settings (fp32, clip on, accumulation 2, AdamW without weight
decay at a constant lr, one epoch): the Trainer's per-micro-batch loss divided by the window
length is our loop's, and a short last window is divided by its own length in both.
"""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from stability.core.batches import task_of  # noqa: E402
from stability.core.config import (  # noqa: E402
    ClipConfig,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
)
from stability.core.loop import train  # noqa: E402
from stability.core.steplog import CSV_COLUMNS  # noqa: E402
from stability.core.validation import ConfigError  # noqa: E402
from stability.integrations.hf import StabilityCallback, training_arguments  # noqa: E402
from stability.tasks.sign_sum import DataConfig  # noqa: E402
from stability.tracking.contract import SCHEDULER_STEPPED  # noqa: E402

SEED = 5
MAX_NORM = 0.2


class TaskModel(nn.Module):
    """A task's model in the Trainer's convention: ``forward(x, labels) -> {"loss", "logits"}``."""

    def __init__(self, task) -> None:  # noqa: ANN001
        super().__init__()
        self.task = task
        self.net = task.model()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.net(x)
        return {"loss": self.task.loss(out, labels), "logits": out}


class Dicts(Dataset):
    """``(x, y)`` pairs as the Trainer's dicts, in a given order."""

    def __init__(self, pairs: Dataset, order: list[int]) -> None:
        self.pairs, self.order = pairs, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[self.order[i]]
        return {"x": x, "labels": y}


class GradNorms(transformers.TrainerCallback):
    """What the Trainer logs as ``grad_norm`` (every step with ``logging_steps=1``)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:  # noqa: ANN001
        if logs and "grad_norm" in logs:
            self.values.append(float(logs["grad_norm"]))


def _cfg(tmp: Path, precision: str = "fp32") -> RunConfig:
    return RunConfig(seed=SEED, device="cpu", output_dir=str(tmp),
                     data=DataConfig(num_samples=300), precision=PrecisionConfig(precision),
                     clip=ClipConfig(enabled=True, max_norm=MAX_NORM),
                     train=TrainConfig(epochs=1, batch_size=16, accum_steps=2,
                                       weight_decay=0.0))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def fit_hf(cfg: RunConfig, folder: Path, *, per_layer: bool = False,
           settings: dict | None = None,
           sinks: tuple = ()) -> tuple[StabilityCallback, GradNorms]:
    """Train the run's task with the Trainer and the callback, in our loop's epoch-1 order:
    the run's clip/precision/accumulation through ``training_arguments`` (or ``settings``)."""
    task = task_of(cfg)
    train_set, val_set = task.train_val()
    torch.manual_seed(cfg.seed)
    model = TaskModel(task)
    order = torch.randperm(len(train_set),
                           generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    args = transformers.TrainingArguments(
        output_dir=str(folder / "hf"), per_device_train_batch_size=cfg.train.batch_size,
        per_device_eval_batch_size=1024,
        num_train_epochs=cfg.train.epochs, learning_rate=cfg.train.lr, weight_decay=0.0,
        lr_scheduler_type="constant", report_to="none", save_strategy="no",
        eval_strategy="epoch", logging_steps=1, seed=cfg.seed,
        train_sampling_strategy="sequential", disable_tqdm=True,
        **(settings if settings is not None else training_arguments(
            cfg.clip, cfg.precision, cfg.train.accum_steps, "cpu")))
    norms = GradNorms()
    trainer = transformers.Trainer(model=model, args=args,
                                   train_dataset=Dicts(train_set, order),
                                   eval_dataset=Dicts(val_set, list(range(len(val_set)))),
                                   callbacks=[norms])
    cb = StabilityCallback(folder, per_layer=per_layer, sinks=sinks).attach(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return cb, norms


def test_fp32_clip_accum2_matches_our_loop_and_the_trainers_grad_norm(tmp_path: Path) -> None:
    """Per-step pre-clip norms and losses within 1e-5 of our loop's; the pre-clip norm is the
    one ``accelerator.clip_grad_norm_`` returned (the Trainer's logged ``grad_norm``)."""
    cfg = _cfg(tmp_path / "ours")
    ours = _rows(train(cfg).csv_path)
    cb, norms = fit_hf(cfg, tmp_path / "hf", per_layer=True)
    theirs = _rows(tmp_path / "hf" / "steps.csv")
    assert [int(r["step"]) for r in theirs] == [int(r["step"]) for r in ours]
    for col in ("grad_l2_pre_clip", "loss", "grad_l2_post_clip", "lr"):
        assert max(abs(float(a[col]) - float(b[col]))
                   for a, b in zip(ours, theirs, strict=True)) < 1e-5, col
    assert [r["clipped"] for r in theirs] == [r["clipped"] for r in ours]
    assert 0 < sum(int(r["clipped"]) for r in ours) < len(ours)
    assert [r["micro_batches"] for r in theirs] == [r["micro_batches"] for r in ours]
    assert [r["samples"] for r in theirs] == [r["samples"] for r in ours]
    assert len(norms.values) == len(theirs)
    assert all(math.isclose(v, float(r["grad_l2_pre_clip"]), rel_tol=1e-6)
               for v, r in zip(norms.values, theirs, strict=True))
    with (tmp_path / "hf" / "steps.csv").open() as f:
        assert next(csv.reader(f)) == [*CSV_COLUMNS, SCHEDULER_STEPPED]
    # A constant schedule still "steps" (LambdaLR counts): the column is measured per step.
    assert {r[SCHEDULER_STEPPED] for r in theirs} == {"1"}
    assert len(_rows(tmp_path / "hf" / "layer_norms.csv")) == len(theirs)
    [epoch] = cb.recorder.epochs
    assert epoch.steps == len(theirs) and math.isfinite(epoch.val_loss)


def test_the_callback_needs_its_trainer(tmp_path: Path) -> None:
    """Added as a plain callback it cannot see the pre-clip norm: it says so before training."""
    cfg = _cfg(tmp_path / "ours")
    task = task_of(cfg)
    train_set, _ = task.train_val()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), use_cpu=True,
                                          report_to="none", save_strategy="no", max_steps=1)
    trainer = transformers.Trainer(model=TaskModel(task), args=args,
                                   train_dataset=Dicts(train_set, [0, 1]),
                                   callbacks=[StabilityCallback(tmp_path / "x")])
    with pytest.raises(RuntimeError, match=r"attach\(trainer\)"):
        trainer.train()


def _max_diffs(ours: list[dict[str, str]], theirs: list[dict[str, str]]) -> dict[str, float]:
    assert len(ours) == len(theirs)
    return {c: max(abs(float(a[c]) - float(b[c])) for a, b in zip(ours, theirs, strict=True))
            for c in ("grad_l2_pre_clip", "loss")}


def test_bf16_matches_our_loop(tmp_path: Path) -> None:
    """bf16 autocast on CPU in both: norms and losses within 1e-5, no loss scale."""
    cfg = _cfg(tmp_path / "ours", "bf16")
    ours = _rows(train(cfg).csv_path)
    fit_hf(cfg, tmp_path / "hf")
    theirs = _rows(tmp_path / "hf" / "steps.csv")
    assert all(d < 1e-5 for d in _max_diffs(ours, theirs).values())
    assert {r["scaler_scale"] for r in theirs} == {"1.0"}
    fp32 = _rows(train(_cfg(tmp_path / "fp32")).csv_path)
    assert _max_diffs(fp32, theirs)["loss"] > 1e-5  # bf16 did change the numbers


def test_fp16_on_cpu_is_refused_because_the_trainer_would_train_fp32(tmp_path: Path) -> None:
    """accelerate trains ``fp16=True`` on CPU in fp32 (no autocast, no scaler) without a word:
    the mapping refuses it naming the key, and the record shows why (fp32's numbers)."""
    cfg = _cfg(tmp_path / "ours", "fp16")
    with pytest.raises(ConfigError, match=r"^precision=fp16 is invalid for the HF Trainer on cpu"):
        training_arguments(cfg.clip, cfg.precision, 2, "cpu")
    assert training_arguments(cfg.clip, cfg.precision, 2, "cuda")["fp16"] is True
    forced = {"max_grad_norm": MAX_NORM, "gradient_accumulation_steps": 2, "fp16": True,
              "use_cpu": True}
    fit_hf(cfg, tmp_path / "hf", settings=forced)
    theirs = _rows(tmp_path / "hf" / "steps.csv")
    fp32 = _rows(train(_cfg(tmp_path / "fp32")).csv_path)
    assert all(d < 1e-5 for d in _max_diffs(fp32, theirs).values())
    assert {r["scaler_scale"] for r in theirs} == {"1.0"}


def test_value_clipping_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^clip.method='value' is invalid for the HF Trainer"):
        training_arguments(ClipConfig(enabled=True, method="value", clip_value=1.0),
                           PrecisionConfig("fp32"), 1, "cpu")


def test_clip_off_still_records_every_step(tmp_path: Path) -> None:
    """``max_grad_norm=0``: the Trainer takes the norm with ``inf`` as threshold, the callback
    still measures every step (nothing clipped, post == pre) and matches our clip-off loop."""
    cfg = _cfg(tmp_path / "ours")
    cfg = RunConfig(**{**vars(cfg), "clip": ClipConfig(enabled=False)})
    ours = _rows(train(cfg).csv_path)
    _, norms = fit_hf(cfg, tmp_path / "hf")
    theirs = _rows(tmp_path / "hf" / "steps.csv")
    assert _max_diffs(ours, theirs)["grad_l2_pre_clip"] < 1e-5
    assert {r["clipped"] for r in theirs} == {"0"}
    assert all(r["grad_l2_pre_clip"] == r["grad_l2_post_clip"] for r in theirs)
    assert len(norms.values) == len(theirs)


def test_the_trainers_clip_norm_is_the_records_one_taken_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gradients are normed once an optimizer step (``torch._foreach_norm``, counted by a
    wrapper that calls the real one): the Trainer's clip takes the norm and the record reads
    it, and the Trainer's ``grad_norm`` is that norm (accelerate's one-element
    ``vector_norm`` of it). Clip on, then off (the Trainer norms with an ``inf`` threshold)."""
    real = torch._foreach_norm
    calls: list[int] = []

    def counted(tensors, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(len(tensors))
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    for clip in (ClipConfig(enabled=True, max_norm=MAX_NORM), ClipConfig(enabled=False)):
        calls.clear()
        cfg = RunConfig(**{**vars(_cfg(tmp_path / "unused")), "clip": clip})
        _, norms = fit_hf(cfg, tmp_path / f"hf-{clip.enabled}")
        rows = _rows(tmp_path / f"hf-{clip.enabled}" / "steps.csv")
        assert len(calls) == len(rows) > 0, clip
        assert norms.values == [float(r["grad_l2_pre_clip"]) for r in rows]
