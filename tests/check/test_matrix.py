"""The planted-bug matrix: each route under check x each planted bug -> the probe that fails.

Routes: a step function (``check.loop=my.step``, the ``Rig`` signature), a loop of one's own
(``stability.check.loop`` on a nanoGPT-style ``train_step``) and a ``LightningModule`` stepped
by a real ``lightning.pytorch.Trainer`` (tests/helpers/check_routes.py builds them). Every
probe runs (``run.run_probes``); a case asserts the probe that names the bug, its number and
the cause printed, and that any other probe failing is one the same bug explains. A bug that
cannot be written in a route (the Trainer clips and scales, not the module) has no case there.
``python -m tests.check.test_matrix`` prints the table docs/check.md shows.
"""

from __future__ import annotations

import time

import pytest
import torch

from stability.check.result import Status, exit_status
from stability.check.rig import Template
from stability.check.run import run_probes
from stability.check.subject import Subject
from stability.integrations import lightning_check
from tests.helpers.check_routes import K, results, spirals

# (route, bug, the probe that names it, its measured number (None: only that it fails),
#  relative tolerance, the other probes the same bug may fail)
SHORT = ("accumulation.short_window",)
OVERFLOW = ("clip.unscaled", "headroom.bf16_vs_fp32", "headroom.fp16_vs_fp32",
            "sanity.init_loss")  # weights x 1e5: every forward-based probe is off too
# gradients zeroed in a hook: the clip and skip probes see nothing either (the GradScaler may
# then assert that it recorded no inf check: a fail after the first, never an exit 3)
ZEROED = ("accumulation.short_window", "clip.unscaled", "skip.is_skip")
CASES = [
    ("step", "short_window", "accumulation.short_window", 0.5, 1e-3, ()),
    ("step", "no_division", "accumulation.full", 3.0, 1e-3, SHORT),
    ("step", "zero_grad", "accumulation.full", 0.889, 1e-2, SHORT),
    ("step", "token_mean", "accumulation.full", 0.297, 1e-2, SHORT),
    ("step", "clip_before_unscale", "clip.unscaled", 1.0, 1e-3, ()),
    ("step", "optimizer_on_inf", "skip.is_skip", 3.0, 0, ()),
    ("step", "scheduler_on_skip", "skip.is_skip", 1.0, 0, ()),
    ("step", "fp16_overflow", "headroom.fp16_range", 2.13, 1e-2, ()),
    ("step", "schedule_per_micro", "schedule.per_step", 4.0, 0, ("skip.is_skip",)),
    ("step", "clip_fixed_scale", "clip.unscaled", 1.0, 1e-3, ()),
    ("any", "short_window", "accumulation.short_window", 0.5, 1e-3, ()),
    ("any", "no_division", "accumulation.full", 3.0, 1e-3, SHORT),
    ("any", "zero_grad", "accumulation.full", 0.845, 1e-2, SHORT),
    ("any", "token_mean", "accumulation.full", 0.290, 1e-2, SHORT),
    ("any", "clip_before_unscale", "clip.unscaled", 1.0, 1e-3, ()),
    ("any", "optimizer_on_inf", "skip.is_skip", 3.0, 0, ()),
    ("any", "scheduler_on_skip", "skip.is_skip", 1.0, 0, ()),
    ("any", "fp16_overflow", "headroom.fp16_range", 6.26, 1e-2, OVERFLOW),
    ("any", "schedule_per_micro", "schedule.per_step", 4.0, 0, ("skip.is_skip",)),
    ("any", "clip_fixed_scale", "clip.unscaled", 1.0, 1e-3, ()),
    ("lightning", "zero_grad", "accumulation.full", 0.619, 1e-2, SHORT),
    ("lightning", "fp16_overflow", "headroom.fp16_range", 9.18, 1e-2, OVERFLOW),
    ("lightning", "zero_grad_hook", "accumulation.full", 1.0, 1e-6, ZEROED),
    ("lightning", "grad_zero_hook", "accumulation.full", 1.0, 1e-6, ZEROED),
    ("lightning", "clip_in_hook", "clip.unscaled", 1.0, 1e-2, ()),
    ("lightning", "double_division", "sanity.init_loss", 0.75, 1e-2, ()),
    ("lightning", "double_division_trainer", "accumulation.full", 0.75, 1e-3, SHORT),
    ("hf", "per_batch_mean", "accumulation.full", 3.17, 1e-2, SHORT),
]
CAUSE = {"short_window": "divided by the configured accum_steps=4 on a window of 2",
         "schedule_per_micro": "the schedule runs 4x too fast",
         "clip_fixed_scale": "clips right at one loss scale only",
         "zero_grad_hook": "stepped on a zero gradient", "grad_zero_hook": "zero gradient",
         "clip_in_hook": "a hook that sees the scaled gradients, such as on_after_backward",
         "double_division": "double division",
         "double_division_trainer": "divided by the accumulation twice",
         "per_batch_mean": "not divided by the window's 4 micro-batches",
         "no_division": "not divided by the window's micro-batch count",
         "zero_grad": "zero_grad", "token_mean": "weighted unequally",
         "clip_before_unscale": "clip before scaler.unscale_",
         "optimizer_on_inf": "parameters changed", "scheduler_on_skip": "LR schedule advanced",
         "fp16_overflow": "overflows fp16"}


def _table(rows):
    return {r.name: r for r in rows}


# the nanoGPT loop's probes take 3-8 s a case on a loaded 2-core machine, the HF Trainer's 7-15
SLOW = ("any", "hf")


@pytest.mark.parametrize(("route", "bug", "probe", "number", "rtol", "also"), [
    pytest.param(*c, marks=pytest.mark.slow) if c[0] in SLOW else c for c in CASES],
    ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_planted_bug_fails_its_probe_with_its_number(route, bug, probe, number, rtol,
                                                          also):
    got = _table(results(route, bug))
    # Lightning's own faults fail too, attributed to it: not this bug's
    own = {n for n, r in got.items()
           if r.status is Status.FAIL and "the trainer's own fault" not in r.meaning}
    assert probe in own and own <= {probe, *also}, {n: (r.status.value, r.meaning)
                                                     for n, r in got.items()}
    r = got[probe]
    assert r.measured == pytest.approx(number, rel=rtol), r
    assert CAUSE[bug] in r.meaning, r.meaning
    if probe.startswith("accumulation"):
        assert "|g|/|g_ref| = 1.000" not in r.meaning  # the number that failed is printed


@pytest.mark.parametrize("route", ["step", "any"])
def test_the_correct_loop_passes_on_every_route(route):
    got = results(route, "")
    assert exit_status(got) == 0, [(r.name, r.status.value, r.meaning) for r in got]
    assert _table(got)["sanity.init_loss"].status is Status.PASS


def test_the_fix_of_the_token_mean_passes():
    got = _table(results("any", "token_mean_fixed"))
    assert got["accumulation.full"].status is Status.PASS, got["accumulation.full"]


def test_lightnings_own_faults_are_its_own_and_accepted_by_name_only():
    got = _table(results("lightning", ""))
    short, skip = got["accumulation.short_window"], got["skip.is_skip"]
    assert short.status is Status.FAIL and short.measured == pytest.approx(0.5, abs=1e-4)
    assert "the trainer's own fault" in short.meaning and "Lightning #19987" in short.meaning
    assert "check.accept=[lightning.short_window]" in short.meaning
    assert skip.status is Status.FAIL and "Lightning #5558" in skip.meaning
    assert "lr_scheduler_step" in skip.meaning  # the workaround
    accepted = results("lightning", "", accept=("lightning.short_window",
                                                "lightning.skip_schedule"))
    assert exit_status(accepted) == 0
    assert _table(accepted)["accumulation.short_window"].status is Status.ACCEPTED
    # the user's own bug still fails under the same acceptance
    own = results("lightning", "zero_grad", accept=("lightning.short_window",
                                                    "lightning.skip_schedule"))
    assert exit_status(own) == 1
    assert _table(own)["accumulation.full"].status is Status.FAIL


def test_manual_optimization_is_driven_and_its_faults_are_the_modules():
    accept = ("lightning.short_window", "lightning.skip_schedule")
    good = _table(results("manual", "", accept))
    assert exit_status(list(good.values())) == 0, good
    assert good["accumulation.short_window"].status is Status.PASS
    assert good["skip.is_skip"].status is Status.PASS
    assert good["clip.unscaled"].status is Status.NA
    assert "manual optimization" in good["clip.unscaled"].meaning
    # the same faults Lightning has, written in the module's own code: never accepted
    short = _table(results("manual", "short_window", accept))
    assert short["accumulation.short_window"].status is Status.FAIL
    assert "the module's own accumulation" in short["accumulation.full"].meaning
    skip = _table(results("manual", "scheduler_on_skip", accept))["skip.is_skip"]
    assert skip.status is Status.FAIL and skip.measured == 1, skip


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["", "seq_cls_fixed"])
def test_the_hf_trainer_with_transformers_collators_passes(bug):
    # raw tokenized samples, collated once by DataCollatorForLanguageModeling /
    # DataCollatorWithPadding (a BatchEncoding) inside the Trainer, as in a plain run
    got = results("hf", bug)
    assert exit_status(got) == 0, [(r.name, r.status.value, r.meaning) for r in got]
    table = _table(got)
    assert table["accumulation.full"].status is Status.PASS
    assert table["accumulation.short_window"].status is Status.PASS
    assert table["schedule.per_step"].status is Status.PASS
    assert "accelerate refuses fp16 on CPU" in table["clip.unscaled"].meaning


@pytest.mark.slow
@pytest.mark.parametrize(("bug", "name", "full", "issue"), [
    ("loss_type_none", "hf.num_items_shift", None, "transformers PR #46204"),
    ("seq_cls", "hf.loss_kwargs_ignored", 3.0, "transformers #47688"),
], ids=["num_items_shift", "loss_kwargs_ignored"])
def test_hfs_own_faults_are_its_own_and_accepted_by_name(bug, name, full, issue):
    got = _table(results("hf", bug))
    for probe in ("accumulation.full", "accumulation.short_window"):
        r = got[probe]
        assert r.status is Status.FAIL and f"not your code's ({name})" in r.meaning, r
        assert issue in r.meaning and f"check.accept=[{name}]" in r.meaning
    if full is not None:  # the classification head: each micro-batch's mean summed, 4x
        assert got["accumulation.full"].measured == pytest.approx(full, rel=1e-3)
    accepted = results("hf", bug, accept=(name,))
    assert exit_status(accepted) == 0
    assert _table(accepted)["accumulation.full"].status is Status.ACCEPTED
    # a user's compute_loss with the same 4x is the user's: never accepted as HF's
    own = _table(results("hf", "per_batch_mean", accept=(name,)))
    assert own["accumulation.full"].status is Status.FAIL


# the correct controls and the trainers' own faults: (route, bug, accept, expected exit)
CONTROLS = [
    ("step", "", (), 0), ("any", "", (), 0), ("any", "token_mean_fixed", (), 0),
    ("lightning", "", (), 1),
    ("lightning", "", ("lightning.short_window", "lightning.skip_schedule"), 0),
    ("manual", "", ("lightning.short_window", "lightning.skip_schedule"), 0),
    ("hf", "", (), 0), ("hf", "seq_cls_fixed", (), 0),
    ("hf", "loss_type_none", (), 1), ("hf", "loss_type_none", ("hf.num_items_shift",), 0),
    ("hf", "seq_cls", (), 1), ("hf", "seq_cls", ("hf.loss_kwargs_ignored",), 0),
]


def _matrix() -> None:
    """The table docs/check.md shows, from a real run: every case and control."""
    print("| route | setup | expected | got | exit | s |")
    print("|---|---|---|---|---|---|")
    for route, bug, probe, number, *_ in CASES:
        t0 = time.perf_counter()
        got = results(route, bug)
        r = _table(got)[probe]
        cause = r.meaning.split("FAIL: ", 1)[-1][:80].replace("|", "\\|")
        print(f"| {route} | {bug} | `{probe}` fail {number:.4g} | {r.status.value} "
              f"{r.measured:.4g}: {cause} | {exit_status(got)} | "
              f"{time.perf_counter() - t0:.1f} |")
    for route, bug, accept, code in CONTROLS:
        t0 = time.perf_counter()
        got = results(route, bug, accept)
        shown = [f"{r.name} {r.status.value}" for r in got
                 if r.status.value in ("fail", "accepted", "warn")]
        setup = (bug or "correct") + (f", accept {', '.join(accept)}" if accept else "")
        print(f"| {route} | {setup} | exit {code} | {'; '.join(shown) or 'all pass or n/a'} | "
              f"{exit_status(got)} | {time.perf_counter() - t0:.1f} |")


if __name__ == "__main__":
    _matrix()


def test_a_module_using_its_trainer_in_training_step_is_checked_through_a_real_trainer():
    got = _table(results("lightning", "uses_trainer"))
    # the mechanics probes (and their reference gradient) step a real Trainer.fit
    assert got["accumulation.full"].status is Status.PASS, got["accumulation.full"]
    assert got["accumulation.short_window"].measured == pytest.approx(0.5, abs=1e-4)
    assert got["clip.unscaled"].status is Status.PASS, got["clip.unscaled"]
    assert got["sanity.same_seed"].status is Status.PASS
    # the forward-only probes call training_step directly: n/a, saying why
    for name in ("headroom.fp16_range", "headroom.bf16_vs_fp32", "sanity.init_loss"):
        assert got[name].status is Status.NA, got[name]
        assert "needs its Trainer" in got[name].meaning


class RaisesInTrainingStep(spirals.SpiralMLP):
    """A module whose own hook raises once the Trainer drives it."""

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        if self._trainer is not None:
            raise RuntimeError("shape mismatch in my loss")
        return super().training_step(batch, batch_idx)


def test_a_lightning_hook_raising_names_the_hook():
    from stability.check.raised import LoopRaised

    torch.manual_seed(0)
    module = RaisesInTrainingStep(hidden=8)
    x, y = spirals.spirals(K * 8, 0.02, 0)
    micro = [[x[i : i + 8], y[i : i + 8]] for i in range(0, K * 8, 8)]
    template = Template(model=module, loss_fn=None, seed=0, loss_of=lightning_check.module_loss,
                        grad_of=lightning_check.trainer_gradient)
    sub = Subject(template=template, build=lambda: module, micro=micro,
                  step=lightning_check.step, baseline=lightning_check.step, trainer="lightning",
                  task=None)
    with pytest.raises(LoopRaised) as raised:
        run_probes(sub, K)
    assert raised.value.where.startswith("RaisesInTrainingStep.training_step (test_matrix")
    assert raised.value.error == "RuntimeError: shape mismatch in my loss"
    assert raised.value.probe == "accumulation.full" and raised.value.results == []


class RaisesUnderFp16(spirals.SpiralMLP):
    """A module whose own hook raises only once the scaled (fp16) fits start."""

    def on_after_backward(self) -> None:
        if self.trainer.precision == "16-mixed":
            raise ValueError("my fp16 hook")


def test_a_user_crash_after_another_probe_failed_is_still_exit_3():
    # Lightning's own short-window fault fails first; the module's own hook raising later is
    # the user's code raising (exit 3), not folded into that failure
    from stability.check.raised import LoopRaised

    torch.manual_seed(0)
    module = RaisesUnderFp16(hidden=8)
    x, y = spirals.spirals(K * 8, 0.02, 0)
    micro = [[x[i : i + 8], y[i : i + 8]] for i in range(0, K * 8, 8)]
    template = Template(model=module, loss_fn=None, seed=0, loss_of=lightning_check.module_loss,
                        grad_of=lightning_check.trainer_gradient)
    sub = Subject(template=template, build=lambda: module, micro=micro,
                  step=lightning_check.step, baseline=lightning_check.step, trainer="lightning",
                  task=None)
    with pytest.raises(LoopRaised) as raised:
        run_probes(sub, K)
    assert raised.value.where.startswith("RaisesUnderFp16.on_after_backward (test_matrix")
    assert raised.value.probe == "clip.unscaled"
    assert [r.status for r in raised.value.results] == [Status.PASS, Status.FAIL]
