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
from tests.helpers.in_process import in_process
from tests.helpers.stores import sqlite_store

ROOT = Path(__file__).resolve().parents[2]
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
def test_cli_check_on_the_default_task(tmp_path, monkeypatch, capsys):
    out = tmp_path / "c.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "experiments/check.py"),
                           f"check.output={out}", "tracking.enabled=false"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert "accumulation.short_window  pass" in done.stdout and str(out) in done.stdout
    body = json.loads(out.read_text())
    assert body["exit_status"] == 0 and len(body["probes"]) == 11
    # the same entry point in this process: a planted bug fails (1), a bad value is one line (2)
    monkeypatch.chdir(ROOT)
    bad = in_process(["check", "check.loop=tests.check.test_check.short_window_by_configured",
                      f"check.output={tmp_path / 'bad.json'}", "tracking.enabled=false"], capsys)
    assert bad.code == 1 and "accumulation.short_window  fail" in bad.stdout
    monkeypatch.chdir(tmp_path)
    wrong = in_process(["check", "check.accum_steps=0"], capsys)
    assert wrong.code == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert wrong.stderr.startswith("error: ") and "check.accum_steps" in wrong.stderr


# --- tracking, and the report citing a failed check ------------------------------------------

def _runs(**task):
    import pandas as pd

    return pd.DataFrame([{"run_id": f"r{i}", "seed": i, **task} for i in range(2)])


def test_the_report_cites_the_newest_failed_check_of_the_same_task_only():
    from stability.report.examine.check_runs import CheckRun, cited

    task = {"task._target_": "stability.tasks.sign_sum.SignSumTask", "task.seq_len": "20"}
    old_fail = CheckRun(run_id="a1", task=task, failed=(("skip.is_skip", 1.0),), start_time=1)
    new_fail = CheckRun(run_id="b2", task=task,
                        failed=(("accumulation.short_window", 0.5), ("clip.unscaled", math.nan)),
                        start_time=2)
    other = CheckRun(run_id="c3", task={**task, "task.seq_len": "40"},
                     failed=(("skip.is_skip", 1.0),), start_time=3)
    assert cited(_runs(**task), [old_fail, new_fail, other]) == [
        "- `stability check` failed on this task (accumulation.short_window: 0.5; "
        "clip.unscaled: not measured): check run `b2`. The study measured a trainer whose "
        "mechanics fail that probe (docs/check.md)."]
    from stability.report.examine.check_runs import WINDOW_MS
    # a pass soon after a failure does not hide it
    still = CheckRun(run_id="d4", task=task, failed=(), start_time=4)
    assert cited(_runs(**task), [old_fail, new_fail, still])[0].endswith(
        "check run `b2`. The study measured a trainer whose mechanics fail that probe "
        "(docs/check.md).")
    # a pass long after: nothing to cite
    fixed = CheckRun(run_id="d4", task=task, failed=(), start_time=2 + WINDOW_MS + 1)
    assert cited(_runs(**task), [old_fail, new_fail, fixed]) == []
    assert cited(_runs(**{**task, "task.seq_len": "30"}), [new_fail, other]) == []


def test_values_from_a_check_run_are_inert_in_the_report(tmp_path):
    from types import SimpleNamespace

    from stability.report.examine.check_runs import cited, read

    hostile = "x`](javascript:alert(1))![img](http://e/x.png)\nline"
    run = SimpleNamespace(
        info=SimpleNamespace(run_id="r`1](http://e)", start_time=5),
        data=SimpleNamespace(params={"task._target_": hostile,
                                     f"check.{hostile}": "fail", "check.ok": "pass"},
                             metrics={f"check.{hostile}": 0.25}))
    check = read(run)
    [line] = cited(_runs(**{"task._target_": hostile}), [check])
    assert "`" not in line.replace("`stability check`", "").replace(f"`{check.run_id}`", "")
    assert "](" not in line and "![" not in line and "\n" not in line
    assert ": 0.25)" in line


@pytest.mark.slow
def test_a_tracked_check_is_a_check_run_the_report_cites(tmp_path):
    from mlflow.tracking import MlflowClient

    from stability.report.examine.check_runs import fetch, lines
    from stability.tracking.contract import Artifact, Kind, Tag

    uri = sqlite_store(tmp_path / "mlflow.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "experiments/check.py"),
                           "check.loop=tests.check.test_check.short_window_by_configured",
                           f"check.output={tmp_path / 'c.json'}", f"tracking.uri={uri}",
                           "tracking.experiment=checks"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    run_id = done.stdout.strip().splitlines()[-1].removeprefix("MLflow check run: ")
    c = MlflowClient(tracking_uri=uri)
    run = c.get_run(run_id)
    assert run.data.tags[Tag.KIND] == Kind.CHECK and run.info.status == "FINISHED"
    assert run.data.tags[Tag.CHECK_OUTCOME] == "fail"
    assert run.data.params["check.accumulation.short_window"] == "fail"
    assert run.data.params["check.accumulation.full"] == "pass"
    assert run.data.params["task._target_"] == "stability.tasks.sign_sum.SignSumTask"
    assert run.data.metrics["check.accumulation.short_window"] == pytest.approx(0.5, abs=1e-4)
    assert [a.path for a in c.list_artifacts(run_id)] == [Artifact.CHECK_JSON]
    assert not any("sqlite" in v for v in run.data.params.values())
    exp = c.get_experiment_by_name("checks").experiment_id
    [check] = fetch(c, exp)
    task = {k: v for k, v in run.data.params.items() if k.startswith("task.")}
    [line] = lines(c, exp, _runs(**task))
    assert check.run_id == run_id and f"`{run_id}`" in line
    assert "accumulation.short_window: 0.5" in line


def test_the_checks_hydra_overrides_never_split_the_users_arguments():
    from stability.cli import CHECK_QUIET, check_argv

    assert check_argv(["--config-dir", ".", "task=spirals"]) == [
        "--config-dir", ".", "task=spirals", *CHECK_QUIET]
    # Hydra's flags first, then every override as one run (Hydra reads only one)
    assert check_argv(["task=x", "--config-dir", ".", "seed=1"]) == [
        "--config-dir", ".", "task=x", "seed=1", *CHECK_QUIET]
    assert check_argv(["-cd=.", "a=1", "-m", "b=2"]) == ["-cd=.", "-m", "a=1", "b=2",
                                                          *CHECK_QUIET]
    assert check_argv([]) == list(CHECK_QUIET)
