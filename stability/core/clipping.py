"""Gradient norms and clipping without per-parameter Python loops or extra syncs.

The tensor-returning helpers (``grad_global_norm``, ``clip_by_norm_``) keep everything
on the device so ``TrainStep`` reads all its statistics with one ``.tolist()``; the
public float-returning functions wrap them for users.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# clip_grad_norm_ divides by (norm + eps); matching it keeps our post-clip norm exact.
CLIP_EPS = 1e-6


def _grads(parameters: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in parameters if p.grad is not None]


def grad_norms(grads: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor L2 norms of ``grads`` (stacked) and their global norm, both on the device.

    A tensor's norm is inf/nan exactly when one of its elements is (up to float32 overflow),
    so the per-tensor norms also say *which* gradient went non-finite, without another pass.
    """
    if not grads:
        return torch.zeros((0,)), torch.zeros(())
    norms = torch.stack(torch._foreach_norm(grads, 2.0))
    return norms, torch.linalg.vector_norm(norms.float(), 2.0)


def grad_global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of ``grads``, a 0-d float32 tensor (inf/nan if any element is)."""
    return grad_norms(grads)[1]


def clip_by_norm_(grads: list[torch.Tensor], pre: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``grads`` in place so their global norm is at most ``max_norm``.

    Args:
        grads: gradient tensors.
        pre: their global norm, from ``grad_global_norm``.
        max_norm: threshold.

    Returns:
        The post-clip norm as a 0-d tensor; derived, not recomputed: the scale factor is
        exactly 1.0 below the threshold (and when ``pre`` is not finite), which leaves every
        gradient bit-identical.
    """
    coef = torch.clamp(max_norm / (pre + CLIP_EPS), max=1.0)
    # Non-finite gradients are left as they are (the step will be skipped), so that whoever
    # looks at them next (the per-layer table, a debugger) sees which one went inf/nan; the
    # choice is made on the device, without a host read. On finite ones ``where`` returns
    # ``coef`` itself: the same bits as before.
    coef = torch.where(torch.isfinite(pre), coef, torch.ones_like(coef))
    if grads:
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    return pre * coef


def clip_by_value_(grads: list[torch.Tensor], clip_value: float) -> torch.Tensor:
    """Clamp each gradient element to ``[-clip_value, clip_value]``; returns the new global norm."""
    if grads:
        torch._foreach_clamp_min_(grads, -clip_value)
        torch._foreach_clamp_max_(grads, clip_value)
    return grad_global_norm(grads)


def clip_global_l2_norm(
    parameters: Iterable[torch.nn.Parameter], max_norm: float
) -> tuple[float, float]:
    """Clip gradients in place to a global L2 norm of ``max_norm``.

    Args:
        parameters: parameters whose ``.grad`` is clipped.
        max_norm: threshold, > 0.

    Returns:
        ``(pre, post)``: global L2 norm before and after clipping. When no clipping
        happens ``post == pre`` and the gradients are untouched.
    """
    if not max_norm > 0:  # also rejects nan, which would turn every gradient into nan
        raise ValueError(f"max_norm={max_norm!r} is invalid: allowed values are a number > 0")
    grads = _grads(parameters)
    pre = grad_global_norm(grads)
    post = clip_by_norm_(grads, pre, max_norm)
    pre_f, post_f = torch.stack([pre, post]).tolist()
    return pre_f, post_f


def has_non_finite_grad(parameters: Iterable[torch.nn.Parameter]) -> bool:
    """True if any gradient element is ``inf`` or ``nan``.

    Checked element-wise, not through the global norm: a norm of finite but huge gradients
    (elements around 1e20) overflows float32 to ``inf`` without any element being non-finite.
    """
    grads = _grads(parameters)
    if not grads:
        return False
    return not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


def first_non_finite(named_parameters: Iterable[tuple[str, torch.nn.Parameter]]) -> str:
    """Name of the first parameter whose gradient holds ``inf``/``nan`` ("" if none).

    A Python loop, but it only runs on the (rare) skip path.
    """
    for name, p in named_parameters:
        if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
            return name
    return ""
