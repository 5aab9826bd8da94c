"""``stability check``: each probe fails on its planted bug and passes on the correct loop.

The planted bugs are the known ones, written as the loops that have them (plain step functions
of the signature ``stability.check.rig`` documents): clip before ``unscale_``, a short window
divided by the configured accumulation, a per-micro-batch mean over varying valid counts, a
scheduler stepping on a skipped step, an optimizer stepping on inf gradients.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from stability.check.accumulation import probe_accumulation
from stability.check.amp import probe_clip, probe_skip
from stability.check.headroom import probe_low_precision, probe_range
from stability.check.result import Status, exit_status
from stability.check.rig import Rig, Template, ours
from stability.check.sanity import probe_determinism, probe_init_loss
from stability.core.precision import autocast

ROOT = Path(__file__).resolve().parents[1]
IGNORE = -1.0  # a padded target: no loss


def masked_mean(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean BCE over the valid (unpadded) items: a mean over a variable count."""
    valid = y != IGNORE
    return nn.functional.binary_cross_entropy_with_logits(out[valid], y[valid])


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1), nn.Flatten(0))


def _micro(k: int = 4, b: int = 8, padded: bool = False):
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(k):
        x = torch.randn(b, 6, generator=g)
        y = (x.sum(1) > 0).float()
        if padded:  # micro-batch i has b - 2i valid items
            y[b - 2 * i:] = IGNORE
        out.append((x, y))
    return out


def _template(loss=None) -> Template:
    return Template(_model(), loss or nn.BCEWithLogitsLoss(), 0)


# --- the correct plain loop, and the planted bugs (each a loop as written in the wild) -----

def plain(rig: Rig, window, *, divisor=None, clip_first=False, sched_always=False,
          raw_step=False, by_items=False) -> bool:
    """A plain AMP loop; with no keyword it is correct (per-window normalisation by items
    when ``by_items``, as the HF fix does with ``num_items_in_batch``)."""
    rig.optimizer.zero_grad(set_to_none=True)
    n = divisor or len(window)
    items = sum(int((y != IGNORE).sum()) for _, y in window)
    for x, y in window:
        with autocast(rig.precision, "cpu"):
            out = rig.model(x)
        if by_items:
            valid = y != IGNORE
            loss = nn.functional.binary_cross_entropy_with_logits(
                out[valid].float(), y[valid], reduction="sum") / items
        else:
            loss = rig.loss_fn(out.float(), y) / n
        rig.scaler.scale(loss).backward()
    params = list(rig.model.parameters())
    if clip_first and rig.max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, rig.max_norm)  # BUG: on scaled gradients
    rig.scaler.unscale_(rig.optimizer)
    if rig.max_norm is not None and not clip_first:
        torch.nn.utils.clip_grad_norm_(params, rig.max_norm)
    finite = all(torch.isfinite(p.grad).all() for p in params if p.grad is not None)
    if raw_step:
        rig.optimizer.step()  # BUG: bypasses scaler.step, steps on inf gradients
    else:
        rig.scaler.step(rig.optimizer)
    if rig.scheduler is not None and (finite or sched_always):  # BUG when sched_always
        rig.scheduler.step()
    rig.scaler.update()
    return finite or raw_step


def short_window_by_configured(rig, window):
    """ms-swift #10084: the loss divided by the configured accumulation, not the window's."""
    return plain(rig, window, divisor=rig.accum_steps)


def clip_before_unscale(rig, window):
    return plain(rig, window, clip_first=True)


def scheduler_on_skip(rig, window):
    """Lightning #5558 / #16228: the schedule advances on a skipped fp16 step."""
    return plain(rig, window, sched_always=True)


def optimizer_on_inf(rig, window):
    return plain(rig, window, raw_step=True)


def by_items(rig, window):
    return plain(rig, window, by_items=True)


def _status(results, name):
    return next(r for r in results if r.name == name)


@pytest.mark.parametrize("loop", [ours, plain], ids=["ours", "plain"])
def test_correct_loops_pass_every_mechanics_probe(loop):
    t, micro = _template(), _micro()
    results = [*probe_accumulation(t, loop, micro, 4), probe_clip(t, loop, micro[:1]),
               probe_skip(t, loop, micro[:1])]
    assert [r.status for r in results] == [Status.PASS] * 4, results
    assert exit_status(results) == 0


def test_short_window_divided_by_configured_size_fails():
    results = probe_accumulation(_template(), short_window_by_configured, _micro(), 4)
    assert _status(results, "accumulation.full").status is Status.PASS
    short = _status(results, "accumulation.short_window")
    # a window of 2 divided by 4: half the gradient, a relative error of 0.5
    assert short.status is Status.FAIL and short.measured == pytest.approx(0.5, abs=1e-4)
    assert exit_status(results) == 1


def test_per_micro_batch_mean_over_varying_valid_counts_fails_and_by_items_passes():
    t, micro = _template(masked_mean), _micro(padded=True)
    bad = probe_accumulation(t, plain, micro, 4)
    assert _status(bad, "accumulation.full").status is Status.FAIL
    assert _status(bad, "accumulation.full").measured > 0.01
    good = probe_accumulation(t, by_items, micro, 4)
    assert all(r.status is Status.PASS for r in good), good


def test_clip_before_unscale_fails():
    r = probe_clip(_template(), clip_before_unscale, _micro()[:1])
    # clipped at max_norm on gradients 2**16 too large: about max_norm / 2**16 remains
    assert r.status is Status.FAIL and r.measured > 0.99


def test_no_clip_at_all_fails_the_clip_probe():
    def no_clip(rig, window):
        rig.max_norm = None
        return plain(rig, window)

    r = probe_clip(_template(), no_clip, _micro()[:1])
    assert r.status is Status.FAIL and r.measured == pytest.approx(1.0, rel=1e-2)


def test_scheduler_stepping_on_a_skipped_step_fails():
    r = probe_skip(_template(), scheduler_on_skip, _micro()[:1])
    assert r.status is Status.FAIL and r.measured == 1 and "LR schedule advanced" in r.meaning


def test_optimizer_stepping_on_inf_gradients_fails():
    r = probe_skip(_template(), optimizer_on_inf, _micro()[:1])
    assert r.status is Status.FAIL and "parameters changed" in r.meaning
    assert "not counted skipped" in r.meaning


def test_headroom_flags_an_fp16_overflow_and_passes_a_tame_model():
    x, y = _micro()[0]
    assert all(r.status is Status.PASS for r in probe_range(_template(), (x, y), 2.0**16))
    big = _model()
    with torch.no_grad():
        big[0].weight.mul_(1e5)  # pre-activations far above 65504
    r = probe_range(Template(big, nn.BCEWithLogitsLoss(), 0), (x, y), 2.0**16)[0]
    assert r.status is Status.FAIL and r.measured > 1


def test_low_precision_is_close_to_fp32_at_init():
    results = probe_low_precision(_template(), _micro()[0])
    assert [r.name for r in results] == ["headroom.bf16_vs_fp32", "headroom.fp16_vs_fp32"]
    assert all(r.status is Status.PASS and r.measured < 0.05 for r in results), results


def test_init_loss_against_the_declared_value():
    t, batch = _template(), _micro()[0]
    assert probe_init_loss(t, batch, math.log(2)).status is Status.PASS
    # a summed loss where a mean is declared: far off
    summed = Template(_model(), nn.BCEWithLogitsLoss(reduction="sum"), 0)
    assert probe_init_loss(summed, batch, math.log(2)).status is Status.FAIL


def test_same_seed_twice_passes_and_an_unseeded_model_fails():
    t, micro = _template(), _micro()
    windows = [micro[:2], micro[2:]]
    assert probe_determinism(_model, t, ours, windows).status is Status.PASS

    def unseeded() -> nn.Module:
        torch.seed()  # what a model that reseeds from the clock does
        return nn.Sequential(nn.Linear(6, 1), nn.Flatten(0))

    assert probe_determinism(unseeded, t, ours, windows).status is Status.FAIL


@pytest.mark.slow
def test_cli_check_on_the_default_task(tmp_path):
    out = tmp_path / "c.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "experiments/check.py"),
                           f"check.output={out}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "accumulation.short_window  pass" in done.stdout and str(out) in done.stdout
    body = json.loads(out.read_text())
    assert body["exit_status"] == 0 and len(body["probes"]) == 10
    bad = subprocess.run([sys.executable, str(ROOT / "experiments/check.py"),
                          "check.loop=tests.test_check.short_window_by_configured",
                          f"check.output={tmp_path / 'bad.json'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=env)
    assert bad.returncode == 1 and "accumulation.short_window  fail" in bad.stdout
    wrong = subprocess.run([sys.executable, str(ROOT / "experiments/check.py"),
                            "check.accum_steps=0"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, env=env)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
