"""A trainer's own known faults: reported as the trainer's, with the upstream issue and the
workaround, and accepted by name (``check.accept=[lightning.short_window]``).

A failure is the trainer's only when it has the fault's exact signature, measured on a module
whose own code is otherwise right:

- ``lightning.short_window``: Lightning divides every micro-batch's loss by
  ``accumulate_grad_batches``, an epoch's shorter last window included, so that window's
  gradient is ``j / k`` of the larger batch's (Lightning #19987). Signature: the full window
  passes and the short window's error is ``1 - j / k`` (a pure scale, no other error).
- ``lightning.skip_schedule``: Lightning steps its LR scheduler after a GradScaler skipped the
  optimizer step (Lightning #5558, #16228). Signature: the schedule advancing is the skip
  probe's one broken invariant.
- ``hf.num_items_shift``: the HF Trainer counts ``num_items_in_batch`` over the unshifted
  labels of a causal LM whose ``loss_type`` is not ``ForCausalLM`` (GPT-2's LM head: None;
  transformers PR #46204 fixed the count for that loss type only). Signature: a pure scale
  equal to the window's shifted over unshifted label count (``hf_check.HFLoop.known``).
- ``hf.loss_kwargs_ignored``: a transformers head whose ``forward`` takes ``**kwargs`` but
  whose loss ignores ``num_items_in_batch``: the Trainer stops dividing by the accumulation
  (transformers #47688, #37766). Signature: a pure scale equal to the window's micro-batch
  count, with the stock ``compute_loss``.

Anything else (a full window off, a short window off by another factor, parameters changed on
the inf step) stays the user's failure, accepted or not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stability.check.result import ProbeResult, Status

SCALE_TOL = 1e-3  # the short window's error against 1 - j/k: a pure scale, nothing more


@dataclass(frozen=True)
class Known:
    """One trainer's known fault.

    Attributes:
        name: what ``check.accept`` names.
        trainer: the trainer it belongs to.
        probe: the probe it fails.
        what: the fault, one clause.
        issue: the upstream issue(s).
        workaround: what the user can do about it.
        matches: whether a result (and the other results, the window size) has its signature.
    """

    @property
    def probes(self) -> tuple[str, ...]:
        """The probes it fails."""
        return (self.probe,) if isinstance(self.probe, str) else self.probe

    name: str
    trainer: str
    probe: str | tuple[str, ...]
    what: str
    issue: str
    workaround: str
    matches: Callable[[ProbeResult, dict[str, ProbeResult], int], bool]


def _short_window(r: ProbeResult, by: dict[str, ProbeResult], k: int) -> bool:
    full = by.get("accumulation.full")
    return (full is not None and full.status is Status.PASS
            and abs(r.measured - (1 - (k // 2) / k)) <= SCALE_TOL)


def _skip_schedule(r: ProbeResult, by: dict[str, ProbeResult], k: int) -> bool:
    return r.measured == 1 and r.meaning.startswith("FAIL: LR schedule advanced")


def _signature(name: str) -> Callable[[ProbeResult, dict[str, ProbeResult], int], bool]:
    # the accumulation probe measured exactly the scale this fault gives on its window
    # (``accumulation.diagnose`` with the adapter's ``known`` scales)
    return lambda r, by, k: f"(signature {name})" in r.meaning


KNOWN = (
    Known(name="lightning.short_window", trainer="lightning", probe="accumulation.short_window",
          what="Lightning divides each micro-batch's loss by accumulate_grad_batches, also in "
          "an epoch's shorter last window", issue="Lightning #19987",
          workaround="make the epoch's batch count a multiple of accumulate_grad_batches (trim "
          "the dataset or drop_last), or scale the loss in training_step by k / j on the last "
          "window", matches=_short_window),
    Known(name="lightning.skip_schedule", trainer="lightning", probe="skip.is_skip",
          what="Lightning steps the LR scheduler after the GradScaler skipped the optimizer "
          "step", issue="Lightning #5558, #16228",
          workaround="override LightningModule.lr_scheduler_step to skip when the scaler's scale "
          "dropped on this step, or use manual optimization", matches=_skip_schedule),
    Known(name="hf.num_items_shift", trainer="hf",
          probe=("accumulation.full", "accumulation.short_window"),
          what="the Trainer counts num_items_in_batch over the unshifted labels while the "
          "causal-LM loss sums the shifted ones (it shifts the count only for a model whose "
          "loss_type is ForCausalLM; GPT-2's LM head has loss_type None)",
          issue="transformers PR #46204",
          workaround='set model.loss_type = "ForCausalLM" before building the Trainer',
          matches=_signature("hf.num_items_shift")),
    Known(name="hf.loss_kwargs_ignored", trainer="hf",
          probe=("accumulation.full", "accumulation.short_window"),
          what="the model's forward takes **kwargs, so the Trainer passes num_items_in_batch "
          "and no longer divides by the accumulation, but its loss ignores it: each "
          "micro-batch's mean is summed (the gradient grows with gradient_accumulation_steps)",
          issue="transformers #47688, #37766",
          workaround="set model.accepts_loss_kwargs = False before building the Trainer (it "
          "then divides by the accumulation), or a compute_loss that divides by "
          "num_items_in_batch", matches=_signature("hf.loss_kwargs_ignored")),
)
ACCEPTABLE = tuple(k.name for k in KNOWN)


def attribute(results: Sequence[ProbeResult], trainer: str, accept: Sequence[str],
              accum_steps: int = 4) -> list[ProbeResult]:
    """``results`` with each trainer's-own failure named as such; ``accepted`` when its name
    is in ``accept`` (it then no longer fails the check).

    Args:
        results: the probes' results in order.
        trainer: ``ours`` | ``plain`` | ``lightning`` | ``hf`` | ``any``.
        accept: the accepted faults' names (``check.accept``).
        accum_steps: the configured window (the short window is ``accum_steps // 2``).
    """
    by = {r.name: r for r in results}
    out = []
    for r in results:
        known = next((k for k in KNOWN if k.trainer == trainer and r.name in k.probes
                      and r.status is Status.FAIL and k.matches(r, by, accum_steps)), None)
        if known is None:
            out.append(r)
            continue
        taken = known.name in accept
        head = (f"accepted ({known.name}): " if taken else
                f"FAIL, the trainer's own fault, not your code's ({known.name}): ")
        meaning = (f"{head}{known.what} ({known.issue}); workaround: {known.workaround}"
                   + ("" if taken else f"; or accept it: check.accept=[{known.name}]")
                   + f" | measured: {r.meaning.removeprefix('FAIL: ')}")
        out.append(dataclasses.replace(r, status=Status.ACCEPTED if taken else Status.FAIL,
                                       meaning=meaning))
    return out
