"""Global-norm clipping, value clipping and non-finite gradient detection."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from stability.core.clipping import (
    clip_by_value_,
    clip_global_l2_norm,
    first_non_finite,
    grad_global_norm,
    has_non_finite_grad,
)


def _module_with_grads(seed: int = 0, grad_scale: float = 1.0) -> nn.Module:
    """A small two-layer module whose parameters carry random gradients."""
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    for p in module.parameters():
        p.grad = torch.randn_like(p) * grad_scale
    return module


def _torch_reference(module: nn.Module, max_norm: float) -> tuple[float, list[torch.Tensor]]:
    """``clip_grad_norm_`` applied to a deep copy: (pre-clip norm, clipped gradients)."""
    ref = copy.deepcopy(module)
    for r, p in zip(ref.parameters(), module.parameters(), strict=True):
        r.grad = p.grad.clone()  # deepcopy does not carry .grad
    pre = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm))
    return pre, [p.grad for p in ref.parameters()]


def test_below_threshold_leaves_gradients_bit_identical() -> None:
    """Below max_norm: post == pre exactly and every gradient is untouched."""
    module = _module_with_grads()
    before = [p.grad.clone() for p in module.parameters()]
    ref_pre, _ = _torch_reference(module, 1e6)

    pre, post = clip_global_l2_norm(module.parameters(), max_norm=1e6)

    assert post == pre
    assert pre == pytest.approx(ref_pre, rel=1e-6)
    for g, b in zip((p.grad for p in module.parameters()), before, strict=True):
        assert torch.equal(g, b)


def test_above_threshold_scales_to_max_norm_like_torch() -> None:
    """Above max_norm: post ~= max_norm, gradients match clip_grad_norm_ on a copy."""
    module = _module_with_grads(grad_scale=10.0)
    ref_pre, ref_grads = _torch_reference(module, 0.5)

    pre, post = clip_global_l2_norm(module.parameters(), max_norm=0.5)

    assert pre == pytest.approx(ref_pre, rel=1e-6)
    assert pre > 0.5
    assert post == pytest.approx(0.5, rel=1e-5)
    grads = [p.grad for p in module.parameters()]
    assert float(grad_global_norm(grads)) == pytest.approx(0.5, rel=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-8)


def test_parameters_without_grad_are_ignored() -> None:
    """A parameter with ``grad is None`` neither counts in the norm nor breaks clipping."""
    module = _module_with_grads()
    params = list(module.parameters())
    params[0].grad = None
    expected = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params[1:]])))

    pre, _ = clip_global_l2_norm(params, max_norm=1e6)

    assert pre == pytest.approx(expected, rel=1e-6)
    assert params[0].grad is None


@pytest.mark.parametrize("max_norm", [0.0, -1.0, math.nan])
def test_invalid_max_norm_is_rejected(max_norm: float) -> None:
    """max_norm must be a number > 0 (nan included), and gradients stay untouched."""
    module = _module_with_grads()
    before = [p.grad.clone() for p in module.parameters()]

    with pytest.raises(ValueError, match="max_norm"):
        clip_global_l2_norm(module.parameters(), max_norm=max_norm)

    for p, b in zip(module.parameters(), before, strict=True):
        assert torch.equal(p.grad, b)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_has_non_finite_grad_detects_inf_and_nan(bad: float) -> None:
    """One inf/-inf/nan element anywhere makes the gradients non-finite."""
    module = _module_with_grads()
    assert not has_non_finite_grad(module.parameters())
    list(module.parameters())[-1].grad.view(-1)[2] = bad
    assert has_non_finite_grad(module.parameters())


def test_has_non_finite_grad_is_false_for_huge_finite_gradients() -> None:
    """Finite elements whose global norm overflows float32 are still finite gradients."""
    module = _module_with_grads()
    for p in module.parameters():
        p.grad.fill_(1e20)
    assert not has_non_finite_grad(module.parameters())


def test_first_non_finite_names_the_first_bad_parameter() -> None:
    """The diagnostic names the first parameter (in order) holding a non-finite gradient."""
    module = _module_with_grads()
    assert first_non_finite(module.named_parameters()) == ""
    module[2].weight.grad[0, 0] = math.nan
    module[2].bias.grad[0] = math.inf
    assert first_non_finite(module.named_parameters()) == "2.weight"


def test_clip_by_value_clamps_elements_and_reports_new_norm() -> None:
    """Element-wise clipping clamps into [-c, c] and returns the new global norm."""
    module = _module_with_grads(grad_scale=3.0)
    grads = [p.grad for p in module.parameters()]
    expected = [g.clamp(-0.25, 0.25) for g in grads]

    post = clip_by_value_(grads, 0.25)

    for g, e in zip(grads, expected, strict=True):
        assert torch.equal(g, e)
    assert float(post) == pytest.approx(float(grad_global_norm(expected)), rel=1e-6)
