"""``optim``/``schedule`` from config (core/optim.py): defaults, validation, skips and resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from stability.core import rundir
from stability.core.config import (
    ClipConfig,
    ConfigError,
    FaultConfig,
    PrecisionConfig,
    RunConfig,
    to_run_config,
    to_yaml_dict,
)
from stability.core.faults import FaultInjector
from stability.core.identity import fingerprint
from stability.core.loop import train
from stability.core.optim import build_optimizer, build_scheduler
from stability.core.step import TrainStep
from stability.core.steplog import EpochLog, StepLog
from stability.tasks.sign_sum import ModelConfig, SequenceClassifier
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]
WARMUP = "stability.core.optim.linear_warmup"
COSINE = "stability.core.optim.warmup_cosine"


def _compose(*overrides: str) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT / "stability" / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    cfg.output_dir = "."
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_default_is_todays_adamw_and_keeps_the_fingerprint() -> None:
    run = to_run_config(_compose())
    assert run.optim.is_default and run.schedule.target is None
    assert fingerprint(run) == "0f7301c49a29"
    params = [nn.Parameter(torch.ones(3))]
    built = build_optimizer(run.optim.target, run.optim.options, params, 2e-3, 1e-3)
    direct = torch.optim.AdamW([nn.Parameter(torch.ones(3))], lr=2e-3, weight_decay=1e-3)
    assert type(built) is torch.optim.AdamW
    drop = {"params"}
    assert ({k: v for k, v in built.param_groups[0].items() if k not in drop}
            == {k: v for k, v in direct.param_groups[0].items() if k not in drop})


@pytest.mark.parametrize(("overrides", "target", "options"), [
    (["optim=sgd"], "torch.optim.SGD", {"momentum": 0.9}),
    (["optim=adam"], "torch.optim.Adam", {}),
    (["optim=sgd", "optim.momentum=0.0", "+optim.nesterov=false"], "torch.optim.SGD",
     {"momentum": 0.0, "nesterov": False}),
    (["optim._target_=torch.optim.RMSprop", "+optim.alpha=0.9"], "torch.optim.RMSprop",
     {"alpha": 0.9}),
])
def test_hydra_picks_any_optimizer_and_it_enters_the_fingerprint(
        overrides: list[str], target: str, options: dict[str, Any]) -> None:
    run = to_run_config(_compose(*overrides))
    assert (run.optim.target, dict(run.optim.options)) == (target, options)
    assert fingerprint(run) != "0f7301c49a29"
    opt = build_optimizer(run.optim.target, run.optim.options, [nn.Parameter(torch.ones(2))],
                          run.train.lr, run.train.weight_decay)
    assert type(opt).__name__ == target.rsplit(".", 1)[1]
    assert opt.param_groups[0]["lr"] == run.train.lr
    for key, value in options.items():
        assert opt.param_groups[0][key] == value


@pytest.mark.parametrize("group", ["warmup", "warmup_cosine"])
def test_a_schedule_enters_the_fingerprint_and_config_yaml_reads_back(group: str) -> None:
    run = to_run_config(_compose(f"schedule={group}", "optim=sgd"))
    assert run.schedule.target in (WARMUP, COSINE)
    back = to_run_config(to_yaml_dict(run))
    assert back == run and fingerprint(back) == fingerprint(run)
    assert fingerprint(run) != fingerprint(to_run_config(_compose("optim=sgd")))


def test_a_config_yaml_from_before_optim_existed_reads_as_the_default() -> None:
    old = to_yaml_dict(RunConfig())
    old.pop("optim"), old.pop("schedule")
    run = to_run_config(old)
    assert run.optim.is_default and run.schedule.target is None
    assert fingerprint(run) == "0f7301c49a29"


def test_every_invalid_optim_and_schedule_key_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        to_run_config({"optim": {"_target_": "torch.optim.SGD", "momentum": 0.9, "mommentum": 1,
                                 "lr": 0.1},
                       "schedule": {"_target_": WARMUP, "warmup": 5},
                       "train": {"epochs": 0}})
    message = str(err.value)
    assert message.startswith("4 invalid keys: ") and "\n" not in message
    for part in ("train.epochs=0 is invalid",
                 "optim.lr=0.1 is invalid: allowed values are none (set train.lr",
                 "unknown key optim.mommentum: allowed keys are _target_, _partial_, dampening",
                 "unknown key schedule.warmup: allowed keys are _target_, warmup_steps"):
        assert part in message


@pytest.mark.parametrize(("section", "message"), [
    ({"optim": {"_target_": "torch.nn.Linear"}}, "optim._target_='torch.nn.Linear' is invalid"),
    ({"optim": {"_target_": "torch.optim.SGD", "momentum": -1}},
     "torch.optim.SGD refuses it: Invalid momentum value: -1"),
    ({"optim": {"_target_": "torch.optim.AdamW", "_partial_": False}}, "optim._partial_=False"),
    ({"schedule": {"_target_": "nope.Sched"}}, "schedule._target_='nope.Sched' is invalid"),
    ({"schedule": {"_target_": WARMUP, "warmup_steps": 0}}, "warmup_steps=0: an integer >= 1"),
    ({"schedule": {"_target_": "torch.optim.lr_scheduler.StepLR"}}, "step_size"),
    ({"schedule": {"warmup_steps": 3}}, "unknown key schedule.warmup_steps"),
])
def test_a_bad_optim_or_schedule_fails_before_training(section: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ConfigError) as err:
        to_run_config(section)
    assert message in str(err.value)


def test_a_bad_optimizer_key_exits_2_with_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    proc = in_process(["sweep", "optim=sgd", "+optim.momentun=0.5", "tracking.enabled=false",
                       f"hydra.run.dir={tmp_path}"], capsys)
    assert proc.code == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: unknown key optim.momentun: allowed keys are ") and (
        "momentum" in last), last
    assert not (tmp_path / "steps.csv").exists()


SCHEDULES = [
    (WARMUP, {"warmup_steps": 6}),
    (COSINE, {"warmup_steps": 2}),
    ("torch.optim.lr_scheduler.StepLR", {"step_size": 1, "gamma": 0.5}),
]


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 12, 1, generator=g)
    return x, (x.sum(dim=(1, 2)) > 0).float()


@pytest.mark.parametrize(("target", "options"), SCHEDULES, ids=["warmup", "cosine", "StepLR"])
def test_the_scheduler_never_advances_on_a_skipped_step(target: str,
                                                        options: dict[str, Any]) -> None:
    """An inf gradient at step 3: step 4 trains at step 3's lr; the schedule lags by one."""
    torch.manual_seed(0)
    model = SequenceClassifier(ModelConfig(hidden_size=8))
    opt = build_optimizer("torch.optim.SGD", {"momentum": 0.9}, model.parameters(), 0.1, 0.0)
    sched = build_scheduler(target, options, opt, steps=12)
    ts = TrainStep(model, opt, nn.BCEWithLogitsLoss(), precision=PrecisionConfig(),
                   clip=ClipConfig(), scheduler=sched,
                   hooks=[FaultInjector(FaultConfig(inf_grad_at_step=3))])
    logs = [ts.step([_batch(i)]) for i in range(8)]
    assert [bool(s.skipped) for s in logs] == [False, False, True] + [False] * 5
    lrs = [s.lr for s in logs]
    # the reference: the same schedule stepped only for the 7 steps taken
    ref_opt = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    ref = build_scheduler(target, options, ref_opt, steps=12)
    expected = []
    for _ in range(7):
        expected.append(ref_opt.param_groups[0]["lr"])
        ref_opt.step()  # no gradients: a no-op, in the order PyTorch expects
        ref.step()
    assert lrs[:3] == expected[:3] and lrs[3:] == expected[2:]
    assert lrs[3] == lrs[2] and lrs[1] != lrs[0]  # it moves, except across the skip
    assert sched.last_epoch == 7


def _stop_at(epoch: int) -> Any:
    class Stop(Exception):
        pass

    class Sink:
        def on_step(self, log: StepLog, e: int) -> None:
            if e == epoch:
                raise Stop

        def on_epoch(self, log: EpochLog) -> None:
            pass

    return Stop, Sink()


def test_a_resumed_run_continues_the_schedule_byte_identical(tmp_path: Path) -> None:
    """SGD + warmup/cosine, stopped in epoch 3 and run again: the same steps.csv (lr column)."""
    def cfg(out: Path) -> RunConfig:
        return to_run_config({
            "seed": 2, "device": "cpu", "output_dir": str(out), "data": {"num_samples": 200},
            "train": {"epochs": 4, "batch_size": 32, "lr": 0.05},
            "optim": {"_target_": "torch.optim.SGD", "momentum": 0.9},
            "schedule": {"_target_": COSINE, "warmup_steps": 3},
            "fault": {"inf_grad_at_step": 5}, "telemetry": {"per_layer": False},
        })

    whole = train(cfg(tmp_path / "whole"))
    stop, sink = _stop_at(3)
    with pytest.raises(stop):
        train(cfg(tmp_path / "stopped"), sinks=[sink])
    train(cfg(tmp_path / "stopped"))
    csv = (tmp_path / "stopped" / rundir.CSV_NAME).read_bytes()
    assert csv == (whole.output_dir / rundir.CSV_NAME).read_bytes()
    lrs = [float(r.split(",")[1]) for r in csv.decode().splitlines()[1:]]
    assert lrs[0] < lrs[2] and lrs[-1] < 0.01  # warmed up, then decayed to ~0
