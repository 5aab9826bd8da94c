"""The routes the planted-bug matrix (tests/check/test_matrix.py) checks, each with a bug
planted by name ("" for the correct loop): a step function (tests/check/test_check.py's plain AMP
loop), a loop of one's own (examples/any_loop's nanoGPT-style ``train_step``, through
``stability.check.anyloop.step_of``) and a ``LightningModule`` under a real Trainer.
``results(route, bug)`` runs every probe on it.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from stability.check.anyloop import step_of
from stability.check.rig import Template, ours
from stability.check.run import run_probes
from stability.check.subject import Subject, no_dropout
from stability.check.upstream import attribute
from stability.integrations import lightning_check
from tests.check import test_check as tc

ROOT = Path(__file__).resolve().parents[2]
for folder in ("any_loop", "lightning_task"):
    if str(ROOT / "examples" / folder) not in sys.path:
        sys.path.append(str(ROOT / "examples" / folder))
import nanogpt_loop as gpt  # noqa: E402
import spirals  # noqa: E402

K = 4


# --- route 1: a step function (tests/check/test_check.py's plain AMP loop and its bugs) ----------

def zero_grad_inside(rig, window) -> bool:
    """tests/check/test_check.py's plain loop with zero_grad per micro-batch: only the last
    micro-batch's gradient is stepped on."""
    params = list(rig.model.parameters())
    for x, y in window:
        rig.optimizer.zero_grad(set_to_none=True)  # BUG: inside the window
        with tc.autocast(rig.precision, "cpu"):
            out = rig.model(x)
        rig.scaler.scale(rig.loss_fn(out.float(), y) / len(window)).backward()
    rig.scaler.unscale_(rig.optimizer)
    if rig.max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, rig.max_norm)
    finite = all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)
    rig.scaler.step(rig.optimizer)
    if rig.scheduler is not None and finite:
        rig.scheduler.step()
    rig.scaler.update()
    return finite


def schedule_per_micro_batch(rig, window) -> bool:
    """The plain loop, fp32 without a scaler, stepping its scheduler after every micro-batch:
    the schedule runs accum_steps times too fast."""
    rig.optimizer.zero_grad(set_to_none=True)
    for x, y in window:
        with tc.autocast(rig.precision, "cpu"):
            out = rig.model(x)
        rig.scaler.scale(rig.loss_fn(out.float(), y) / len(window)).backward()
        if rig.scheduler is not None:
            rig.scheduler.step()  # BUG: per micro-batch
    rig.scaler.unscale_(rig.optimizer)
    if rig.max_norm is not None:
        torch.nn.utils.clip_grad_norm_(rig.model.parameters(), rig.max_norm)
    rig.scaler.step(rig.optimizer)
    rig.scaler.update()
    return True


def clip_scaled_at_fixed_scale(rig, window) -> bool:
    """Clips the scaled gradients at max_norm x 65536 (right only while the scale is 2^16)."""
    rig.optimizer.zero_grad(set_to_none=True)
    for x, y in window:
        with tc.autocast(rig.precision, "cpu"):
            out = rig.model(x)
        rig.scaler.scale(rig.loss_fn(out.float(), y) / len(window)).backward()
    params = list(rig.model.parameters())
    if rig.max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, rig.max_norm * 65536.0)  # BUG: a fixed scale
    rig.scaler.unscale_(rig.optimizer)
    finite = all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)
    rig.scaler.step(rig.optimizer)
    if rig.scheduler is not None and finite:
        rig.scheduler.step()
    rig.scaler.update()
    return finite


def _step_route(bug: str):
    step = {"short_window": tc.short_window_by_configured, "zero_grad": zero_grad_inside,
            "schedule_per_micro": schedule_per_micro_batch,
            "clip_fixed_scale": clip_scaled_at_fixed_scale,
            "no_division": lambda r, w: tc.plain(r, w, divisor=1),
            "clip_before_unscale": tc.clip_before_unscale,
            "optimizer_on_inf": tc.optimizer_on_inf, "scheduler_on_skip": tc.scheduler_on_skip,
            }.get(bug, tc.plain)
    template = tc._template(tc.masked_mean if bug == "token_mean" else None)
    if bug == "fp16_overflow":
        with torch.no_grad():
            template.model[0].weight.mul_(1e5)
    micro = tc._micro(padded=bug == "token_mean")
    return Subject(template=template, build=tc._model, micro=micro, step=step, baseline=ours,
                   trainer="plain", task=SimpleNamespace(expected_init_loss=math.log(2))), "plain"


# --- route 2: a loop of one's own, nanoGPT's way -------------------------------------------

def nano(model, optimizer, scaler, window, gradient_accumulation_steps, grad_clip, ctx,
         scheduler=None, *, bug: str = ""):
    """examples/any_loop's train_step, iterating the window, with one planted bug."""
    tokens = sum(int((y != -1).sum()) for _, y in window)
    for X, Y in window:
        if bug == "zero_grad":
            optimizer.zero_grad(set_to_none=True)  # BUG: inside the window
        with ctx:
            logits, loss = model(X, Y)
            if bug == "token_mean_fixed":  # the fix: sum over tokens / the window's count
                loss = nn.functional.cross_entropy(logits.view(-1, gpt.VOCAB).float(),
                                                   Y.view(-1), ignore_index=-1,
                                                   reduction="sum") / tokens
            elif bug != "no_division":  # BUG when no_division; short_window: / configured
                loss = loss / (gradient_accumulation_steps if bug == "short_window"
                               else len(window))
        scaler.scale(loss).backward()
        if bug == "schedule_per_micro" and scheduler is not None:
            scheduler.step()  # BUG: per micro-batch
    if grad_clip != 0.0 or bug == "optimizer_on_inf":
        if bug == "clip_before_unscale":
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)  # BUG: scaled
        if bug == "clip_fixed_scale":  # BUG: the scaled gradients at grad_clip x 2^16
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip * 65536.0)
        scaler.unscale_(optimizer)
        if bug not in ("clip_before_unscale", "clip_fixed_scale") and grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scale = scaler.get_scale()
    if bug == "optimizer_on_inf":
        optimizer.step()  # BUG: bypasses the scaler's inf check
    else:
        scaler.step(optimizer)
    scaler.update()
    if scheduler is not None and bug != "schedule_per_micro" and (
            bug == "scheduler_on_skip" or scaler.get_scale() >= scale):
        scheduler.step()  # correct: only when the step was taken (the scale did not drop)
    optimizer.zero_grad(set_to_none=True)


def _padded(batches):
    out = []
    for i, (x, y) in enumerate(batches):  # micro-batch i: its last 3i targets padded
        y = y.clone()
        y[:, gpt.BLOCK - 3 * i:] = -1
        out.append((x, y))
    return out


def _any_route(bug: str):
    def train_step(model, optimizer, scaler, window, gradient_accumulation_steps, grad_clip,
                   ctx, scheduler=None):
        return nano(model, optimizer, scaler, window, gradient_accumulation_steps, grad_clip,
                    ctx, scheduler, bug=bug)

    torch.manual_seed(0)
    model = no_dropout(gpt.TinyGPT())
    if bug == "fp16_overflow":
        with torch.no_grad():
            model.wte.weight.mul_(1e5)
    g = torch.Generator().manual_seed(1)
    micro = [gpt.get_batch(g) for _ in range(K)]
    if bug.startswith("token_mean"):
        micro = _padded(micro)
    step = step_of(train_step)
    template = Template(model=model, loss_fn=None, seed=0, loss_of=lambda m, b: m(*b)[1])
    return Subject(template=template, build=lambda: copy.deepcopy(model), micro=micro, step=step,
                   baseline=step, trainer="any",
                   task=SimpleNamespace(expected_init_loss=math.log(gpt.VOCAB))), "any"


# --- route 3: a LightningModule under a real Trainer ---------------------------------------

class UsesItsTrainer(spirals.SpiralMLP):
    """A module whose training_step reads its Trainer and optimizer, and logs."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        loss = super().training_step(batch, batch_idx)
        lr = self.optimizers().param_groups[0]["lr"]
        self.log_dict({"lr": lr, "step": float(self.trainer.global_step)})
        return loss


class ManualAccumulation(spirals.SpiralMLP):
    """Manual optimization, accumulating ``K`` batches; the loss divided by the window's own
    count (``bug="short_window"``: by ``K``, also on an epoch's shorter last window)."""

    def __init__(self, *args, bug: str = "", **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.automatic_optimization = False
        self.bug = bug

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        n = self.trainer.num_training_batches
        start = batch_idx - batch_idx % K
        window = K if self.bug == "short_window" else min(K, n - start)
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss / window)
        if batch_idx + 1 == start + window or batch_idx + 1 == n:
            opt, sched = self.optimizers(), self.lr_schedulers()
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            scale = scaler.get_scale() if scaler is not None else None
            opt.step()
            opt.zero_grad()
            skipped = scaler is not None and scaler.get_scale() < scale
            if sched is not None and (not skipped or self.bug == "scheduler_on_skip"):
                sched.step()
        return loss


class ZeroGradInTrainingStep(spirals.SpiralMLP):
    """A module that clears the gradients in ``training_step``: inside Lightning's window."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        for p in self.parameters():
            p.grad = None  # BUG: the window's earlier micro-batches are lost
        return super().training_step(batch, batch_idx)


class ZeroGradInHook(spirals.SpiralMLP):
    """``self.zero_grad()`` in ``on_after_backward``: every gradient is gone at the step."""

    def on_after_backward(self) -> None:
        self.zero_grad()  # BUG


class GradZeroInHook(spirals.SpiralMLP):
    """``grad.zero_()`` in ``on_after_backward``."""

    def on_after_backward(self) -> None:
        for p in self.parameters():
            if p.grad is not None:
                p.grad.zero_()  # BUG


class ClipsInOnAfterBackward(spirals.SpiralMLP):
    """Clips at 10 in ``on_after_backward``: under fp16 that hook sees the *scaled*
    gradients (Lightning unscales after the closure), so training nearly stops."""

    def on_after_backward(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.parameters(), 10.0)  # BUG under fp16


class DividesByAccumulation(spirals.SpiralMLP):
    """``loss / 4`` in ``training_step`` on top of ``accumulate_grad_batches=4``."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return super().training_step(batch, batch_idx) / 4  # BUG: Lightning divides too


class DividesByTrainersAccumulation(spirals.SpiralMLP):
    """``loss / self.trainer.accumulate_grad_batches``: the same double division, read from
    the Trainer."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        loss = super().training_step(batch, batch_idx)
        return loss / self.trainer.accumulate_grad_batches  # BUG: Lightning divides too


LIGHTNING_BUGS = {"zero_grad": ZeroGradInTrainingStep, "uses_trainer": UsesItsTrainer,
                  "zero_grad_hook": ZeroGradInHook, "grad_zero_hook": GradZeroInHook,
                  "clip_in_hook": ClipsInOnAfterBackward, "double_division": DividesByAccumulation,
                  "double_division_trainer": DividesByTrainersAccumulation}


def _lightning_route(bug: str):
    cls = LIGHTNING_BUGS.get(bug, spirals.SpiralMLP)
    torch.manual_seed(0)
    build = lambda: no_dropout(cls(hidden=8))  # noqa: E731
    module = build()
    if bug == "fp16_overflow":
        with torch.no_grad():
            module.net[0].weight.mul_(1e6)
    x, y = spirals.spirals(K * 8, 0.02, 0)
    micro = [[x[i : i + 8], y[i : i + 8]] for i in range(0, K * 8, 8)]
    template = Template(model=module, loss_fn=None, seed=0, loss_of=lightning_check.module_loss,
                        grad_of=lightning_check.trainer_gradient)
    return Subject(template=template, build=build, micro=micro, step=lightning_check.step,
                   baseline=lightning_check.step, trainer="lightning",
                   task=SimpleNamespace(expected_init_loss=math.log(2))), "lightning"


def _manual_route(bug: str):
    torch.manual_seed(0)
    build = lambda: no_dropout(ManualAccumulation(hidden=8, bug=bug))  # noqa: E731
    module = build()
    x, y = spirals.spirals(K * 8, 0.02, 0)
    micro = [[x[i : i + 8], y[i : i + 8]] for i in range(0, K * 8, 8)]
    template = Template(model=module, loss_fn=None, seed=0, loss_of=lightning_check.module_loss,
                        grad_of=lightning_check.trainer_gradient)
    return Subject(template=template, build=build, micro=micro, step=lightning_check.step,
                   baseline=lightning_check.step, trainer="lightning-manual", task=None,
                   not_applicable={"clip.unscaled": lightning_check.MANUAL_CLIP}), \
        "lightning-manual"


# --- route 4: the HF Trainer with a stock collator over raw tokenized samples ---------------

HF_CPU = "accelerate refuses fp16 on CPU"
HF_BUGS = ("", "loss_type_none", "seq_cls", "seq_cls_fixed", "per_batch_mean")


def _tokenizer():
    """A character-level fast tokenizer built here (nothing downloaded), padding id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{c: i + 2 for i, c in enumerate("abcdefghijklmnopqr")}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def _hf_route(bug: str):
    """A tiny GPT-2 trained by the HF Trainer on 16 texts of 3..15 characters, tokenized as a
    dataset gives them (lists of ids), collated by transformers' own collators: the LM head
    with ``DataCollatorForLanguageModeling`` (its ``loss_type`` set to ``ForCausalLM``, or
    left None: ``loss_type_none``), the classification head with ``DataCollatorWithPadding``
    (``seq_cls``: stock; ``seq_cls_fixed``: ``accepts_loss_kwargs = False``), and a user
    ``compute_loss`` returning the model's mean (``per_batch_mean``)."""
    from transformers import (
        DataCollatorForLanguageModeling,
        DataCollatorWithPadding,
        GPT2Config,
        GPT2ForSequenceClassification,
        GPT2LMHeadModel,
        Trainer,
    )

    from stability.integrations import hf_check

    hf_check.quiet()
    fast = _tokenizer()
    g = torch.Generator().manual_seed(1)
    texts = ["".join("abcdefghijklmnopqr"[int(i)]
                     for i in torch.randint(0, 18, (int(n),), generator=g))
             for n in torch.randint(3, 16, (16,), generator=g)]
    config = {"vocab_size": 20, "n_positions": 16, "n_embd": 16, "n_layer": 1, "n_head": 2,
              "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if bug.startswith("seq_cls"):
        samples = [{**fast(t), "labels": len(t) % 2} for t in texts]
        collator = DataCollatorWithPadding(tokenizer=fast)

        def build():
            model = GPT2ForSequenceClassification(GPT2Config(**config, num_labels=2))
            if bug == "seq_cls_fixed":
                model.accepts_loss_kwargs = False  # the workaround: the Trainer divides
            return no_dropout(model)
    else:
        samples = [fast(t) for t in texts]
        collator = DataCollatorForLanguageModeling(tokenizer=fast, mlm=False)

        def build():
            model = GPT2LMHeadModel(GPT2Config(**config))
            if bug != "loss_type_none":
                model.loss_type = "ForCausalLM"  # the Trainer counts the shifted tokens
            return no_dropout(model)

    class PerBatchMean(Trainer):
        """compute_loss as often written: the model's mean, num_items_in_batch ignored."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    hf = hf_check.HFLoop(PerBatchMean if bug == "per_batch_mean" else None, collator)
    torch.manual_seed(0)
    model = build()
    collate = hf_check.collated(collator)
    micro = [collate(samples[i : i + 4]) for i in range(0, 16, 4)]
    template = Template(model=model, loss_fn=None, seed=0, loss_of=hf.loss, join=hf.join,
                        known=hf.known)
    return Subject(template=template, build=build, micro=micro, step=hf.step,
                   baseline=hf.step, trainer="hf", task=None,
                   not_applicable={"clip.unscaled": HF_CPU, "skip.is_skip": HF_CPU}), "hf"


ROUTES = {"step": _step_route, "any": _any_route, "lightning": _lightning_route,
          "manual": _manual_route, "hf": _hf_route}


def results(route: str, bug: str, accept=()):
    """Every probe of ``route`` with ``bug`` planted ("" for the correct loop)."""
    sub, trainer = ROUTES[route](bug)
    return attribute(run_probes(sub, K), trainer, accept, K)
