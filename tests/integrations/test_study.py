"""A task that declares a trainer (Lightning, the HF Trainer) runs in the study (issue 21, item 3).

The same job as our loop's (``sweep.job.run_job``: a composed config in, an MLflow run out), the
same run folder, the winner rebuilt from its checkpoint through the task, the trainer's
refusals before anything exists, the report's verdict naming a scheduler stepped on skips.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from stability.core.config import ConfigError, to_run_config
from stability.core.identity import fingerprint
from stability.sweep.job import run_job
from stability.tracking.contract import SCHEDULER_STEPPED, Tag
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]
LIGHTNING = "tests.helpers.trainer_tasks.TinyLightningTask"
HF = "tests.helpers.trainer_tasks.TinyHFTask"


def _raw(tmp: Path, target: str, *overrides: str, **options: Any) -> dict[str, Any]:
    """The composed config of one run (as the sweep's job receives it) with ``target``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "stability" / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["device=cpu", "train.epochs=2", *overrides])
    cfg.output_dir = str(tmp)
    raw = OmegaConf.to_container(cfg, resolve=True)
    raw["task"] = {"_target_": target, **options}
    return raw


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _tracked(tmp: Path) -> list[str]:
    return [f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=trainers"]


def _runs(tmp: Path) -> list[Any]:
    import mlflow

    c = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = c.get_experiment_by_name("trainers")
    return c.search_runs([exp.experiment_id])


@pytest.mark.parametrize("target", [LIGHTNING, HF])
def test_a_trainer_task_leaves_our_run_folder_and_mlflow_run(tmp_path: Path, target: str,
                                                             caplog: Any) -> None:
    """steps.csv (+ scheduler_stepped), layer_norms.csv, config.yaml, checkpoint; the MLflow
    run carries our loop's fingerprint, params and summary metrics."""
    pytest.importorskip("lightning.pytorch" if target == LIGHTNING else "transformers")
    raw = _raw(tmp_path / "run", target, "clip.enabled=true", "clip.max_norm=0.3",
               "train.accum_steps=2", "seed=3", "train.lr=0.01", *_tracked(tmp_path))
    with caplog.at_level("INFO", logger="stability.core.loop"):
        best = run_job(raw)
    # our loop's per-epoch line (in a sweep: the run's sweep.log)
    assert [r.getMessage().split()[:2] for r in caplog.records
            if r.getMessage().startswith("epoch ")] == [["epoch", "1/2"], ["epoch", "2/2"]]
    out = tmp_path / "run"
    rows = _rows(out / "steps.csv")
    # 192 training samples, batch 16, accumulation 2: 6 optimizer steps an epoch, 2 epochs.
    assert len(rows) == 12 and {r["micro_batches"] for r in rows} == {"2"}
    assert SCHEDULER_STEPPED in rows[0] and rows[0]["scheduler_stepped"] == "1"
    assert float(rows[0]["lr"]) == pytest.approx(0.01)  # train.lr reached the optimizer
    assert any(r["clipped"] == "1" for r in rows)  # clip.* reached the trainer
    assert all(float(r["grad_l2_post_clip"]) <= 0.3 + 1e-6 for r in rows)
    assert (out / "layer_norms.csv").exists() and (out / "checkpoints" / "best.pt").exists()
    cfg = to_run_config(raw)
    [run] = _runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.tags[Tag.FINGERPRINT] == fingerprint(cfg)
    assert run.data.tags[Tag.LOSS_NAME] == "BCE"
    assert run.data.params["task._target_"] == target
    assert run.data.metrics["best_val_loss"] == pytest.approx(best)
    assert run.data.metrics["optimizer_steps"] == 12
    # The cost metrics of our loop, measured the same way (core.cost.run_costs).
    m, p = run.data.metrics, run.data.params
    assert m["step_time_median_s"] > 0 and m["peak_memory_mb"] > 0
    assert (m["effective_batch"], m["grad_syncs"], m["final_scaler_scale"]) == (32, 12, 1.0)
    # Params are what ran: the trainer's optimizer, schedule and batch, not our loop's defaults.
    lightning = target == LIGHTNING
    assert p["trainer"] == ("lightning" if lightning else "hf")
    assert p["optim._target_"] == "torch.optim.AdamW" and float(p["optim.lr"]) == 0.01
    assert p["optim.betas"] == "(0.9, 0.999)" and p["train.batch_size"] == "16"
    assert p["train.weight_decay"] == ("0.01" if lightning else "0.0")  # not our 0.001
    assert p["schedule._target_"] == ("torch.optim.lr_scheduler.StepLR" if lightning
                                      else "torch.optim.lr_scheduler.LambdaLR")
    assert p["precision.plugin"] == ("Precision(32-true)" if lightning else "accelerate(no)")
    assert "train.num_workers" not in p and "telemetry.update_ratio" not in p
    # Both tasks are classifiers: validation accuracy (HF: from the task's metrics()).
    assert 0.4 <= m["best_val_acc"] <= 1.0
    # The report rebuilds the winner through the task from its checkpoint: the trainer's own
    # evaluation of the rebuilt model gives the validation loss it was selected on.
    from stability.integrations import backends
    from stability.report.sealed.evaluate import rebuild_model

    state = torch.load(out / "checkpoints" / "best.pt", weights_only=True)
    model = rebuild_model(cfg, state)
    backend = backends.of(cfg)
    task = backend.task(cfg)
    val = (task.datamodule().val_dataloader().dataset if target == LIGHTNING
           else task.train_val()[1])
    got = backend.evaluate(cfg, task, model, val, "cpu")
    assert got["loss"] == pytest.approx(best, abs=1e-6)
    assert got["acc"] == pytest.approx(m["best_val_acc"])  # the test's accuracy comes the same way


def test_the_same_seed_trains_the_same_lightning_steps(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    for name in ("a", "b"):
        run_job(_raw(tmp_path / name, LIGHTNING, "seed=7", "tracking.enabled=false"))
    a, b = ((tmp_path / name / "steps.csv").read_bytes() for name in ("a", "b"))
    assert a == b


def test_the_skip_rate_monitor_ends_a_trainer_run_as_diverged(tmp_path: Path) -> None:
    """fp16 from a scale that overflows every step: the monitor, the last sink, ends the fit."""
    pytest.importorskip("lightning.pytorch")
    from stability.integrations import backends

    cfg = to_run_config(_raw(tmp_path, LIGHTNING, "precision=fp16", "precision.init_scale=1e30",
                             "monitor.window=4", "monitor.abort_after=4",
                             "tracking.enabled=false"))
    result = backends.of(cfg).train(cfg)
    assert result.status == "diverged" and "skip" in result.reason
    rows = _rows(tmp_path / "steps.csv")
    assert 4 <= len(rows) < 12 and all(r["skipped"] == "1" for r in rows)
    assert result.summary["diverged"] == 1 and result.summary["skip_alerts"] >= 1


@pytest.mark.parametrize(("target", "overrides", "options", "message"), [
    (HF, ["precision=fp16"], {}, "precision=fp16 is invalid for the HF Trainer on cpu"),
    (HF, ["clip.enabled=true", "clip.method=value"], {}, "clip.method='value' is invalid"),
    (HF, [], {"own": {"learning_rate": 0.1}},
     "training_arguments() sets learning_rate, which the study sets from train.lr"),
    (LIGHTNING, ["optim=sgd"], {}, "optim._target_='torch.optim.SGD' is invalid for a "
                                   "lightning task"),
    (LIGHTNING, ["schedule=warmup"], {}, "schedule._target_="),
    (LIGHTNING, ["fault.inf_grad_at_step=2"], {}, "fault.* is invalid for a lightning task"),
    ("tests.helpers.trainer_tasks.NotATrainerTask", [], {},
     "declares trainer='keras': allowed values are ours | lightning | hf"),
])
def test_a_setting_the_trainer_cannot_honour_fails_before_anything_exists(
        tmp_path: Path, target: str, overrides: list[str], options: dict, message: str) -> None:
    pytest.importorskip("lightning.pytorch" if target == LIGHTNING else "transformers")
    raw = _raw(tmp_path / "run", target, *overrides, *_tracked(tmp_path), **options)
    with pytest.raises(ConfigError) as err:
        run_job(raw)
    assert message in str(err.value) and "allowed" in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "steps.csv").exists()
    assert not (tmp_path / "mlflow.db").exists() or not _runs(tmp_path)


def test_fp16_of_an_hf_task_on_cpu_exits_2_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    folder = ROOT / "examples" / "hf_task"
    monkeypatch.chdir(folder)  # `stability sweep` from the example's folder finds its task
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    proc = in_process(["sweep", "--config-dir", str(folder), "task=gpt2", "precision=fp16",
                       "device=cpu", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
                       f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert proc.code == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: precision=fp16 is invalid for the HF Trainer on cpu")
    assert not (tmp_path / "run" / "steps.csv").exists()


def test_the_verdict_names_a_scheduler_stepped_on_skipped_steps() -> None:
    from stability.report.examine.health import judge_config
    from stability.report.options import Thresholds

    def steps(sched: list[int]) -> pd.DataFrame:
        n = len(sched)
        return pd.DataFrame({"loss": [1.0] * n, "skipped": [1, 1, 1] + [0] * (n - 3),
                             "scaler_scale": [4.0, 2.0, 1.5] + [1.5] * (n - 3),
                             "clipped": [0] * n, SCHEDULER_STEPPED: sched})

    runs = pd.DataFrame({"run_id": ["a", "b"], "outcome": ["finished"] * 2})
    lightning = judge_config(runs, {"a": steps([1] * 100), "b": steps([1, 0, 0] + [1] * 97)},
                             False, Thresholds(skip_rate_marginal=1.0, skip_rate_unstable=1.0))
    assert "scheduler advanced on up to 3 skipped step(s)" in lightning.reason
    assert "(2/2 seeds)" in lightning.reason and str(lightning.verdict) == "marginal"
    ours = judge_config(runs, {"a": steps([1] * 100).drop(columns=SCHEDULER_STEPPED),
                               "b": steps([0] * 100)}, False,
                        Thresholds(skip_rate_marginal=1.0, skip_rate_unstable=1.0))
    assert "scheduler" not in ours.reason


def _example(cmd: str, folder: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{folder}", "MLFLOW_TRACKING_URI": ""}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / f"{cmd}.py"), *args,
                           f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_lightning_study_sweeps_resumes_reports_and_registers_its_winner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The example's sweep (fp16 from a start scale that overflows: skipped steps on which
    Lightning steps the user's scheduler), the sweep again (nothing left to run), the report:
    the winner tested alone, registered, the scheduler-on-skip verdict.

    The first sweep is ``experiments/sweep.py`` in its own process, its runs in the launcher's
    worker; the sweep again and the report call the same entry point in this process
    (``in_process``): what they prove (nothing left to run, the report) is not the process."""
    pytest.importorskip("lightning.pytorch")
    import mlflow

    folder = ROOT / "examples" / "lightning_task"
    store = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    grid = ["-m", "--config-dir", str(folder), "task=spirals", "precision=fp32,fp16",
            "precision.init_scale=1e9", "clip.enabled=false", "train.epochs=1",
            "tracking.experiment=spirals-e2e", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    first = _example("sweep", folder, tmp_path, *grid)
    assert first.returncode == 0, first.stderr[-3000:]
    said = first.stdout + first.stderr
    assert "finished=4" in said
    [sweep_id] = re.findall(r"\[sweep\] sweep (\S+): parent run", said)
    monkeypatch.chdir(folder)  # `stability` from the example's folder finds its task
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    again = in_process(["sweep", *grid, store], capsys)
    assert again.code == 0, again.stderr[-3000:]
    assert "skipped 4 points already FINISHED" in again.stdout + again.stderr
    report = in_process(["report", "experiment=spirals-e2e", f"sweep_id={sweep_id}",
                         "task_target=spirals.SpiralTask", f"output_dir={tmp_path / 'reports'}",
                         store], capsys)
    assert report.code == 0, report.stderr[-3000:]
    text = next((tmp_path / "reports").glob("*/report.md")).read_text()
    [verdict] = [ln for ln in text.splitlines() if ln.startswith("- `fp16 noclip acc=1`:")]
    assert "scheduler advanced on up to" in verdict and "(2/2 seeds)" in verdict
    c = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("spirals-e2e")
    runs = c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = 'train'")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    tested = [r for r in runs if "test_loss" in r.data.metrics]
    assert len(tested) == 2 and len({r.data.tags[Tag.FINGERPRINT] for r in tested}) == 1
    version = c.get_model_version_by_alias("spirals-e2e-winner", "champion")
    assert version.run_id in {r.info.run_id for r in tested}


def test_an_hf_train_resumed_from_its_checkpoint_writes_the_same_files(tmp_path: Path) -> None:
    """Crash in epoch 2 after the epoch-1 checkpoint, resume from it: ``steps.csv`` and
    ``layer_norms.csv`` are byte-identical to those of a train never interrupted (the
    recorder's state is saved beside each Trainer checkpoint, ``hf.STATE_NAME``)."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stability.integrations.hf import STATE_NAME, StabilityCallback
    from tests.helpers.trainer_tasks import TinyHFTask

    class Crash(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 15:
                raise RuntimeError("crash")

    task = TinyHFTask()
    train_set, val_set = task.train_val()

    def fit(folder: Path, out: Path, crash: bool = False, resume: str | None = None) -> None:
        torch.manual_seed(0)
        args = TrainingArguments(output_dir=str(out), num_train_epochs=3, seed=0,
                                 eval_strategy="epoch", save_strategy="epoch", use_cpu=True,
                                 report_to="none", disable_tqdm=True, logging_strategy="no",
                                 max_grad_norm=0.3, **task.training_arguments())
        trainer = Trainer(model=task.model(), args=args, train_dataset=train_set,
                          eval_dataset=val_set)
        StabilityCallback(folder, per_layer=True).attach(trainer)
        if crash:
            trainer.add_callback(Crash())
        trainer.train(resume_from_checkpoint=resume)

    fit(tmp_path / "whole", tmp_path / "hf-whole")
    with pytest.raises(RuntimeError, match="crash"):
        fit(tmp_path / "resumed", tmp_path / "hf", crash=True)
    crashed = _rows(tmp_path / "resumed" / "steps.csv")
    assert len(crashed) == 15 and (tmp_path / "hf" / "checkpoint-12" / STATE_NAME).exists()
    fit(tmp_path / "resumed", tmp_path / "hf", resume=str(tmp_path / "hf" / "checkpoint-12"))
    for name in ("steps.csv", "layer_norms.csv"):
        whole = (tmp_path / "whole" / name).read_bytes()
        assert (tmp_path / "resumed" / name).read_bytes() == whole, name
    assert len(_rows(tmp_path / "whole" / "steps.csv")) == 36


# Where each tiny task's training is killed: epoch 2 of 3 after two of its 6 steps (12 batches
# an epoch, accumulation 2), and the trainer's own checkpoint the point resumes from.
KILLS = {LIGHTNING: {"epoch": 1, "batch": 5}, HF: {"forwards": 17}}
TRAINER_CHECKPOINTS = {LIGHTNING: ("checkpoints/lightning-epoch*.ckpt",
                                   "checkpoints/lightning-epoch1.ckpt"),
                       HF: ("hf/checkpoint-*", "hf/checkpoint-6")}


@pytest.mark.parametrize("target", [LIGHTNING, HF])
def test_a_killed_trainer_point_resumes_its_epoch_and_its_mlflow_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """SIGTERM in epoch 2 of 3 (after 2 of its steps were written), then the same point again:
    one MLflow run, continued from the trainer's epoch-1 checkpoint (the rerun trains epochs 2
    and 3 only); steps.csv and layer_norms.csv byte-identical to a fit never interrupted (cut
    back to the checkpoint, then written again); no resume files left once it finished."""
    pytest.importorskip("lightning.pytorch" if target == LIGHTNING else "transformers")
    import mlflow

    from stability.core.signals import Terminated
    from tests.helpers import trainer_tasks

    args = ("train.epochs=3", "seed=5", "train.accum_steps=2", "telemetry.per_layer=true")
    run_job(_raw(tmp_path / "whole", target, *args, "tracking.enabled=false"))
    raw = _raw(tmp_path / "run", target, *args, *_tracked(tmp_path))
    for key, value in KILLS[target].items():
        monkeypatch.setitem(trainer_tasks.SIGTERM_AT, key, value)
    with pytest.raises(Terminated):
        run_job(raw, in_sweep=True)
    out = tmp_path / "run"
    killed = _rows(out / "steps.csv")
    assert [int(r["epoch"]) for r in killed] == [1] * 6 + [2] * 2
    [run] = _runs(tmp_path)
    assert run.info.status == "KILLED"
    assert (out / "checkpoints" / "last.pt").exists()
    pattern, saved = TRAINER_CHECKPOINTS[target]
    assert [p.relative_to(out).as_posix() for p in out.glob(pattern)] == [saved]

    for key in KILLS[target]:
        monkeypatch.setitem(trainer_tasks.SIGTERM_AT, key, None)
    monkeypatch.setitem(trainer_tasks.TRAINED, "micro_batches", 0)
    run_job(raw, in_sweep=True)
    assert trainer_tasks.TRAINED["micro_batches"] == 2 * 12  # epochs 2 and 3 only: resumed
    for name in ("steps.csv", "layer_norms.csv"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    [again] = _runs(tmp_path)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    history = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_metric_history(
        run.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 19))  # each step once
    assert again.data.metrics["optimizer_steps"] == 18
    assert not list(out.glob("checkpoints/last.pt")) + list(out.glob(pattern))
