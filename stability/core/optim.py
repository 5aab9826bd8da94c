"""The optimizer and the learning-rate schedule of a run, built from config.

Both are ``hydra.utils.instantiate`` of a ``_target_`` plus keyword arguments, as a partial
(the run's ``optim`` and ``schedule`` sections: ``OptimConfig``, ``ScheduleConfig`` below):

- ``optim``: ``{_target_: torch.optim.AdamW, _partial_: true, **options}`` (the default: the
  loop's AdamW as before), ``torch.optim.Adam``, ``torch.optim.SGD`` with ``momentum``, or any
  importable ``torch.optim.Optimizer``. The learning rate is always ``train.lr`` (the study's
  LR axis) and the weight decay ``train.weight_decay`` (passed when the optimizer takes one).
- ``schedule``: ``{_target_: null}`` (the default: a constant learning rate), ``linear_warmup``
  or ``warmup_cosine`` below, or any ``torch.optim.lr_scheduler`` class. A factory whose
  signature has ``total_steps`` receives the run's number of optimizer steps.

The scheduler is advanced by ``TrainStep`` on steps actually taken, never on a skipped one,
and checkpointed with it. ``check_optimizer``/``check_schedule`` try the build on a dummy
parameter so that a bad value fails before training, named by its key, with the others.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from stability.core.validation import ConfigError, joined, locate, require

DEFAULT_OPTIMIZER = "torch.optim.AdamW"
RESERVED = ("lr", "weight_decay")  # train.lr and train.weight_decay: one place each
LINEAR_WARMUP = "stability.core.optim.linear_warmup"
WARMUP_COSINE = "stability.core.optim.warmup_cosine"
SCHEDULE_ALLOWED = (f"null (constant lr) | {LINEAR_WARMUP} | {WARMUP_COSINE} | an "
                    "LRScheduler class such as torch.optim.lr_scheduler.StepLR")


def linear_warmup(optimizer: torch.optim.Optimizer,
                  warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup from ``lr / warmup_steps`` to ``lr`` over ``warmup_steps``, then constant.

    Args:
        optimizer: the run's optimizer.
        warmup_steps: optimizer steps (taken ones) to reach the full learning rate, >= 1.
    """
    if not (isinstance(warmup_steps, int) and warmup_steps >= 1):
        raise ValueError(f"warmup_steps={warmup_steps!r}: an integer >= 1")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps))


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then a cosine decay to ``min_lr_ratio * lr`` at ``total_steps``.

    Args:
        optimizer: the run's optimizer.
        warmup_steps: optimizer steps of the warmup, >= 0.
        total_steps: optimizer steps of the run (given by the loop), > ``warmup_steps``.
        min_lr_ratio: the final learning rate as a fraction of ``train.lr``, in [0, 1].
    """
    if not (isinstance(warmup_steps, int) and 0 <= warmup_steps < total_steps):
        raise ValueError(f"warmup_steps={warmup_steps!r}: an integer in [0, total_steps="
                         f"{total_steps})")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio={min_lr_ratio!r}: a number in [0, 1]")

    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: let it decide
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _named(fn: Callable[..., Any]) -> set[str] | None:
    """Keyword names ``fn`` takes, or ``None`` when it takes any (``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return set(params)


def build_optimizer(target: str, options: Mapping[str, Any], params: Iterable[Any],
                    lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """``instantiate({_target_, _partial_: true, **options})(params, lr=, weight_decay=)``.

    The weight decay is passed to an optimizer that takes one; with the default AdamW this is
    exactly ``torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)``.
    """
    from hydra.utils import instantiate

    partial = instantiate({"_target_": target, "_partial_": True, **options}, _convert_="all")
    kwargs: dict[str, Any] = {"lr": lr}
    if _accepts(locate(target), "weight_decay"):
        kwargs["weight_decay"] = weight_decay
    return partial(params, **kwargs)


def total_steps(samples: int, batch_size: int, accum_steps: int, world_size: int,
                epochs: int) -> int:
    """Optimizer steps of a run: every rank's share in windows of ``accum_steps`` micro-batches."""
    share = math.ceil(samples / world_size)
    return epochs * math.ceil(math.ceil(share / batch_size) / accum_steps)


def build_scheduler(target: str | None, options: Mapping[str, Any],
                    optimizer: torch.optim.Optimizer,
                    steps: int) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The schedule of ``optimizer`` (``None`` for a constant learning rate).

    ``steps`` (the run's optimizer steps) is passed as ``total_steps`` to a factory that takes it
    and is not given it.
    """
    if target is None:
        return None
    from hydra.utils import instantiate

    partial = instantiate({"_target_": target, "_partial_": True, **options}, _convert_="all")
    extra = ({"total_steps": steps}
             if "total_steps" not in options and _accepts(locate(target), "total_steps")
             else {})
    return partial(optimizer, **extra)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def check_optimizer(target: Any, options: Mapping[str, Any], lr: float,
                    weight_decay: float) -> list[str]:
    """Every mistake of the ``optim`` section (empty when it builds on a dummy parameter)."""
    if target == DEFAULT_OPTIMIZER and not options and lr >= 0 and weight_decay >= 0:
        # The default AdamW with nothing set: the build below cannot fail. Skipping it keeps
        # torch's first optimizer construction, which imports torch._dynamo (~2.5 s of CPU),
        # out of every process that only validates configs (a sweep's parent, the report).
        return []
    if not (isinstance(target, str) and target):
        return [f"optim._target_={target!r} is invalid: allowed values are an optimizer "
                "class such as torch.optim.AdamW | torch.optim.Adam | torch.optim.SGD"]
    try:
        cls = locate(target)
    except Exception as err:  # ImportError, AttributeError, or the module's own error
        return [f"optim._target_={target!r} is invalid (it does not import: {_one_line(err)}): "
                "allowed values are an importable optimizer such as torch.optim.SGD"]
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        return [f"optim._target_={target!r} is invalid: allowed values are a "
                "torch.optim.Optimizer class such as torch.optim.AdamW"]
    errors = [f"optim.{k}={options[k]!r} is invalid: allowed values are none (set train.{k}: "
              "one place for it, the study's axis)" for k in RESERVED if k in options]
    names = _named(cls)
    if names is not None:
        allowed = sorted(names - {"self", "params", *RESERVED})
        errors += [f"unknown key optim.{k}: allowed keys are _target_, _partial_, "
                   f"{', '.join(allowed)}" for k in sorted(set(options) - names)
                   if k not in RESERVED]
    if errors:
        return errors
    try:
        build_optimizer(target, options, [torch.zeros(1, requires_grad=True)], lr, weight_decay)
    except Exception as err:  # the optimizer's own range checks (momentum < 0...)
        return [f"optim={dict(options)!r} is invalid ({target} refuses it: {_one_line(err)}): "
                f"allowed values are what {target} accepts"]
    return []


def check_schedule(target: Any, options: Mapping[str, Any]) -> list[str]:
    """Every mistake of the ``schedule`` section (empty when it builds on a dummy optimizer)."""
    if target is None:
        return ([f"unknown key schedule.{k}: allowed keys are none with schedule._target_=null"
                 for k in sorted(options)])
    if not (isinstance(target, str) and target):
        return [f"schedule._target_={target!r} is invalid: allowed values are {SCHEDULE_ALLOWED}"]
    try:
        fn = locate(target)
    except Exception as err:
        return [f"schedule._target_={target!r} is invalid (it does not import: "
                f"{_one_line(err)}): allowed values are {SCHEDULE_ALLOWED}"]
    # Only schedulers are called: a config must not make the loop call an arbitrary function.
    if not (target in (LINEAR_WARMUP, WARMUP_COSINE) or (
            isinstance(fn, type) and issubclass(fn, torch.optim.lr_scheduler.LRScheduler))):
        return [f"schedule._target_={target!r} is invalid: allowed values are {SCHEDULE_ALLOWED}"]
    names = _named(fn)
    if names is not None:
        allowed = sorted(names - {"self", "optimizer"})
        bad = sorted(set(options) - names)
        if bad:
            return [f"unknown key schedule.{k}: allowed keys are _target_, {', '.join(allowed)}"
                    for k in bad]
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        sched = build_scheduler(target, options, dummy, steps=1000)
    except Exception as err:  # a missing argument, warmup_steps < 1...
        return [f"schedule={dict(options)!r} is invalid ({target} refuses it: "
                f"{_one_line(err)}): allowed values are what {target} accepts"]
    if not isinstance(sched, torch.optim.lr_scheduler.LRScheduler):
        return [f"schedule._target_={target!r} is invalid: it built a "
                f"{type(sched).__name__}; allowed values are {SCHEDULE_ALLOWED}"]
    return []


class SectionErrors(ConfigError):
    """Several mistakes of one section, kept apart so the run's one error counts each."""

    def __init__(self, items: list[str]) -> None:
        super().__init__(joined(items))
        self.items = items


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer: ``{_target_, _partial_: true, **options}`` (``core.optim``).

    The learning rate is ``train.lr`` and the weight decay ``train.weight_decay``; ``options``
    are the optimizer's other keyword arguments (``momentum``, ``betas``...). The default is
    the loop's AdamW and leaves every fingerprint as it was.
    """

    target: str = DEFAULT_OPTIMIZER
    partial: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.partial is True, "optim._partial_", self.partial,
                "true (the loop passes the parameters, train.lr and train.weight_decay)")
        errors = check_optimizer(self.target, self.options, lr=1e-3, weight_decay=0.0)
        if errors:
            raise SectionErrors(errors)

    @property
    def is_default(self) -> bool:
        """The AdamW the loop always used: not part of the fingerprint."""
        return self.target == DEFAULT_OPTIMIZER and not self.options

    def as_yaml(self) -> dict[str, Any]:
        """The section as Hydra composes it (``_target_``, ``_partial_``, options)."""
        return {"_target_": self.target, "_partial_": True, **self.options}


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate schedule: ``_target_: null`` (constant, the default) or a factory.

    ``core.optim.linear_warmup``, ``core.optim.warmup_cosine`` or any
    ``torch.optim.lr_scheduler`` class, with its keyword arguments in ``options``.
    """

    target: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        errors = check_schedule(self.target, self.options)
        if errors:
            raise SectionErrors(errors)

    def as_yaml(self) -> dict[str, Any]:
        """The section as Hydra composes it (``_target_`` and options)."""
        return {"_target_": self.target, **self.options}
