"""What the probes run on: the task's seeded model, its first micro-batches and the loop.

Every backend answers the same question, its check adapter (``integrations.protocol.Probe``,
from ``backends.of(cfg).probe``): ``ours`` gives the task's ``model`` / ``loss`` and
``train.batch_size``, checked with the loop ``check.loop`` names (ours or a user's step
function); a trainer's gives its own model, loss, batch size and step (``lightning_check``,
``hf_check``: each step is the trainer's own fit). A backend without a check adapter is refused
naming it. The micro-batches are the training data's first ``k * b`` samples in order (no
shuffling).

Dropout is switched off in the probed model (``p = 0``): every probe compares forwards from the
same weights, and two forwards under dropout differ by their masks, not by the mechanics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stability.check.rig import StepFn, Template, ours
from stability.core.config import RunConfig
from stability.core.task import OUR_LOOP, first_batch
from stability.core.validation import ConfigError, require
from stability.integrations import backends, protocol


@dataclass(frozen=True)
class Subject:
    """The task, its loop and its data, ready for the probes.

    Attributes:
        template: the seeded initial weights and the task's loss.
        build: builds the model afresh (the caller seeds torch first).
        micro: ``k`` micro-batches.
        step: the loop under check.
        baseline: a correct unclipped step (the clip probe's reference norm).
        trainer: ``ours`` | ``plain`` | the trainer's label (``lightning``, ``hf``, ...).
        task: the task object (its ``expected_init_loss``).
        not_applicable: probe name -> why it cannot run for this trainer here.
    """

    template: Template
    build: Callable[[], nn.Module]
    micro: list[Any]
    step: StepFn
    baseline: StepFn
    trainer: str
    task: Any
    not_applicable: dict[str, str] = field(default_factory=dict)


def no_dropout(model: nn.Module) -> nn.Module:
    """``model`` with every dropout module's ``p`` set to 0 (see the module docstring)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    return model


def _samples(probe: protocol.Probe, k: int) -> list[Any]:
    """The first ``k`` micro-batches of ``probe.batch_size`` samples, in order."""
    data, b = probe.samples, probe.batch_size
    n = len(data)
    require(n >= k * b, "check.accum_steps", k,
            f"at most {n // max(b, 1)} (the task's {n} training samples make "
            f"{n // max(b, 1)} micro-batches of {probe.batch_key})")
    if probe.collate is None:  # (input, target) pairs, cut from one batch of k * b
        x, y = first_batch(data, k * b)
        return [(x[i : i + b], y[i : i + b]) for i in range(0, len(y), b)][:k]
    return [probe.collate([data[i] for i in range(j * b, (j + 1) * b)]) for j in range(k)]


def subject(cfg: RunConfig, loop: str, step: StepFn, k: int) -> Subject:
    """The probes' subject for ``cfg``'s task; ``loop`` is ``check.loop`` (``step`` its
    function).

    Raises:
        ConfigError: the task's backend has no check adapter, a loop named for a trainer task
            (its trainer is the loop), or too little data for ``k`` micro-batches.
    """
    backend = backends.of(cfg)
    task = backend.task(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        probe = backend.probe(cfg, task)
    if probe.step is not None and loop != OUR_LOOP:
        raise ConfigError(f"check.loop={loop!r} is invalid for a {probe.label} task: its trainer "
                          "is the loop under check (allowed values: ours)")
    template = Template(model=no_dropout(probe.model), loss_fn=probe.loss_fn or _unused,
                        seed=cfg.seed, loss_of=probe.loss_of, grad_of=probe.grad_of,
                        join=probe.join, known=probe.known)
    build = probe.build

    def fresh() -> nn.Module:
        return no_dropout(build())

    micro = _samples(probe, k)
    if probe.step is None:  # our loop's task: the loop under check is check.loop's
        return Subject(template=template, build=fresh, micro=micro, step=step, baseline=ours,
                       trainer=OUR_LOOP if loop == OUR_LOOP else "plain", task=task,
                       not_applicable=dict(probe.not_applicable))
    return Subject(template=template, build=fresh, micro=micro, step=probe.step,
                   baseline=probe.step, trainer=probe.label, task=task,
                   not_applicable=dict(probe.not_applicable))


def _unused(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # a trainer task's loss is its own (Template.loss_of); nothing calls this
    raise TypeError("a trainer task's loss is its training_step / model output")
