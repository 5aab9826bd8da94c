"""The Lightning backend's check adapter (``probe``): each step is a ``Trainer.fit``.

``stability check`` (``check.subject``) reaches it through ``lightning_runner.probe``, as it
reaches every backend's. The probes hand this step function a ``Rig`` (``check.rig``) whose
model is the user's ``LightningModule``; the step fits it for one epoch over the window (one
batch per micro-batch, in order), with the study's own mapping of the settings onto the Trainer
(``integrations.lightning.trainer_settings``): ``accumulate_grad_batches`` = the rig's
configured window, ``gradient_clip_val`` = its ``max_norm``, fp16 = a ``MixedPrecision`` plugin
around the rig's GradScaler. So accumulation, clipping, unscaling, the skip and the schedule
step are Lightning's own. A window shorter than ``accumulate_grad_batches`` is the epoch's short
last window: Lightning steps on the epoch's last batch.

The one stand-in: the module's ``configure_optimizers`` returns the rig's optimizer and schedule
(``interval: "step"``), because the probes need plain SGD to see a gradient's scale in the
parameters and a schedule they can read; the mechanics under test are the Trainer's, not the
user's optimizer.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from stability.core.config import ClipConfig, PrecisionConfig, RunConfig
from stability.core.task import Task
from stability.integrations.protocol import NotApplicable, Probe

# Lightning's per-fit notices: a check fits a dozen one-step epochs
NOTICES = (".*does not have many workers.*", ".*LeafSpec.*", ".*srun.*", ".*val_dataloader.*",
           ".*self.log.*", ".*number of training batches.*", ".*GPU available.*")
QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
         "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0}


NEEDS_TRAINER = ("the module's training_step needs its Trainer (self.trainer, "
                 "self.optimizers()): this probe calls it directly, without one")


def module_loss(module: nn.Module, batch: Any) -> torch.Tensor:
    """The module's own ``training_step`` loss on ``batch`` (its return, or its ``"loss"``).

    Raises:
        NotApplicable: the hook needs an attached Trainer (the forward-only probes call it
            directly; the mechanics probes go through ``trainer_gradient`` and ``step``).
    """
    try:
        out = module.training_step(batch, 0)
    except RuntimeError as err:
        if "is not attached to a `Trainer`" in str(err):
            raise NotApplicable(NEEDS_TRAINER) from err
        raise
    return out["loss"] if isinstance(out, Mapping) else out


def trainer_gradient(template: Any, batch: Any) -> list[torch.Tensor]:
    """The gradient of the module's loss on ``batch`` (no accumulation, no clipping, fp32):
    the accumulation probe's reference.

    A backward of ``training_step`` called directly, without a Trainer, so none of the user's
    hooks (``on_after_backward``, ``on_before_optimizer_step``: a ``zero_grad`` or a clip
    there) can touch the reference. A ``training_step`` that needs its Trainer
    (``self.trainer``, ``self.optimizers()``) gets a real ``Trainer.fit`` of one step instead,
    where its hooks run too (the accumulation probe refuses a zero reference).
    """
    model = template.rig().model
    try:
        module_loss(model, batch).backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                for p in model.parameters()]
    except NotApplicable:
        pass
    rig = template.rig(accum_steps=1)
    seen: list[list[torch.Tensor]] = []

    def hook(opt: torch.optim.Optimizer, *_: Any) -> None:  # after the step: its gradients
        seen.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
                     for g in opt.param_groups for p in g["params"]])

    rig.optimizer.register_step_post_hook(hook)
    step(rig, [batch])
    if not seen:
        raise RuntimeError("the Trainer took no optimizer step on one batch")
    return seen[-1]


MANUAL_CLIP = ("manual optimization: the module clips in its own training_step (Lightning "
               "refuses gradient_clip_val for it), so the probe cannot set the threshold")


def quiet() -> None:
    """Silence Lightning's per-fit notices (the probes fit many one-step epochs)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
    for notice in NOTICES:
        warnings.filterwarnings("ignore", notice)


def step(rig: Any, window: Sequence[Any]) -> bool:
    """One optimizer step of the rig's ``LightningModule`` by ``Trainer.fit`` over ``window``.

    Returns:
        Whether the optimizer stepped (a GradScaler skip calls no ``optimizer.step``).
    """
    import lightning.pytorch as pl
    from lightning.pytorch.plugins import MixedPrecision

    from stability.integrations.lightning import trainer_settings

    quiet()
    module = rig.model
    sched = ({"scheduler": rig.scheduler, "interval": "step"} if rig.scheduler is not None
             else None)
    module.configure_optimizers = (  # type: ignore[method-assign]
        (lambda: {"optimizer": rig.optimizer, "lr_scheduler": sched}) if sched
        else (lambda: rig.optimizer))
    clip = (ClipConfig(enabled=True, max_norm=rig.max_norm) if rig.max_norm is not None
            else ClipConfig())
    settings = trainer_settings(clip, PrecisionConfig(name=rig.precision), rig.accum_steps, "cpu")
    if not getattr(module, "automatic_optimization", True):
        # manual optimization: the module accumulates and clips in its own training_step;
        # Lightning refuses both settings for it
        for key in ("accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm"):
            settings.pop(key, None)
    if "plugins" in settings:  # the rig's scaler: the probe reads its scale
        settings["plugins"] = [MixedPrecision("16-mixed", "cpu", scaler=rig.scaler)]
    taken: list[int] = []
    handle = rig.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    try:
        trainer = pl.Trainer(max_epochs=1, **QUIET, **settings)
        trainer.fit(module, train_dataloaders=DataLoader(list(window), batch_size=None))
    finally:
        handle.remove()
    return bool(taken)


def probe(task: Task, cfg: RunConfig) -> Probe:
    """The task's ``module(lr)`` built now, the datamodule's training loader's first samples in
    micro-batches of its batch size (collated by it), stepped by ``step``."""
    def build() -> nn.Module:
        return task.module(lr=cfg.train.lr)

    model = build()
    data = task.datamodule()
    if hasattr(data, "setup"):
        data.setup("fit")
    loader = data.train_dataloader()
    b = int(loader.batch_size)
    common: dict[str, Any] = {"loss_of": module_loss, "grad_of": trainer_gradient, "step": step}
    if not getattr(model, "automatic_optimization", True):
        # its accumulation is its own code: a failure is never Lightning's
        return Probe(model=model, build=build, samples=loader.dataset, batch_size=b,
                     batch_key=f"the training loader's batch_size={b}",
                     collate=loader.collate_fn, label="lightning-manual",
                     not_applicable={"clip.unscaled": MANUAL_CLIP}, **common)
    return Probe(model=model, build=build, samples=loader.dataset, batch_size=b,
                 batch_key=f"the training loader's batch_size={b}",
                 collate=loader.collate_fn, label="lightning", **common)
