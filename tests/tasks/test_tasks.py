"""Tasks as plugins: a user's task defined here runs end to end; bad tasks fail before training.

``TinyTask`` is what a user writes: one class, no subclassing of ours, called with the
section's plain values by ``build_task`` from ``task._target_: tests.tasks.test_tasks.TinyTask``.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from stability.core import distributed
from stability.core.config import (
    ConfigError,
    RunConfig,
    TaskConfig,
    TrackingConfig,
    TrainConfig,
    to_run_config,
)
from stability.core.identity import fingerprint
from stability.core.loop import train
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]
TINY = "tests.tasks.test_tasks.TinyTask"


class _Pairs(Dataset):
    """A plain map-style dataset (not a TensorDataset): exercises the DataLoader path."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class TinyTask:
    """Noisy linear regression: the smallest user task (model, data, loss, metrics, test)."""

    def __init__(self, n: int = 256, dim: int = 4, out_dim: int = 1, poison: bool = False,
                 tensor: bool = True, seed: int = 7) -> None:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, dim, generator=g)
        y = x @ torch.randn(dim, generator=g) + 0.1 * torch.randn(n, generator=g)
        if poison:
            x[0, 0] = float("nan")
        self.dim, self.out_dim = dim, out_dim
        wrap = TensorDataset if tensor else _Pairs
        cut, val = n * 6 // 10, n * 8 // 10
        self.parts = {"train": wrap(x[:cut], y[:cut]), "val": wrap(x[cut:val], y[cut:val]),
                      "test": wrap(x[val:], y[val:])}

    def model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.dim, self.out_dim), nn.Flatten(0))

    def train_val(self) -> tuple[Dataset, Dataset]:
        return self.parts["train"], self.parts["val"]

    def sealed_test(self, *, winner: str) -> Dataset:
        assert winner
        return self.parts["test"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output.float(), target)

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"mae": (output.float() - target).abs().sum()}


@dataclasses.dataclass(frozen=True)
class TinyData:
    """The typed ``data`` section a user task may declare (``section_types``)."""

    n: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 20:
            raise ConfigError(f"data.n={self.n!r} is invalid: allowed values are an integer >= 20")


class TypedTask(TinyTask):
    """TinyTask taking a typed ``data`` section and naming its loss."""

    loss_name = "MSE"
    section_types = {"data": TinyData}

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(n=data["n"])


class NoTestTask(TinyTask):
    """A task whose author forgot the test split (a subclass only to keep this file short)."""

    sealed_test = None  # type: ignore[assignment]


def _cfg(tmp: Path, options: dict[str, Any] | None = None, target: str = TINY,
         **train: Any) -> RunConfig:
    return RunConfig(
        seed=0, device="cpu", output_dir=str(tmp),
        task=TaskConfig(target=target, options=options or {}, sections=()), data={}, model={},
        train=TrainConfig(**({"epochs": 3, "batch_size": 16, "lr": 1e-2} | train)),
        tracking=TrackingConfig(enabled=False),
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_a_user_task_trains_and_its_config_round_trips(tmp_path: Path) -> None:
    """The task's own metrics land in the summary; config.yaml rebuilds the same run."""
    cfg = _cfg(tmp_path, {"n": 200})
    result = train(cfg)
    rows = _rows(result.csv_path)
    assert len(rows) == 3 * 8  # 120 training samples / 16 = 8 micro-batches an epoch
    assert result.epochs[-1].val_loss < result.epochs[0].val_loss  # it learns
    assert result.summary["best_val_mae"] > 0
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["task"] == {"_target_": TINY, "n": 200}
    again = to_run_config(saved)
    # config.yaml holds no tracking.* (issue 19: no URI, no credentials in a run's files)
    assert "tracking" not in saved
    assert dataclasses.replace(again, tracking=cfg.tracking) == cfg
    assert fingerprint(again) == fingerprint(cfg)
    assert fingerprint(_cfg(tmp_path, {"n": 201})) != fingerprint(cfg)  # task options count


def test_the_dataloader_path_gives_the_same_steps_as_direct_indexing(tmp_path: Path) -> None:
    """A plain Dataset through DataLoader workers sees the same batches as a TensorDataset."""
    direct = train(_cfg(tmp_path / "tensor", {"tensor": True}, accum_steps=3))
    loaded = train(_cfg(tmp_path / "loader", {"tensor": False}, accum_steps=3, num_workers=1))
    assert direct.csv_path.read_bytes() == loaded.csv_path.read_bytes()
    # 153 training samples: 10 micro-batches of <= 16, windows of 3 with a short last one.
    assert [int(r["micro_batches"]) for r in _rows(direct.csv_path)][:4] == [3, 3, 3, 1]


def test_the_default_task_keeps_its_fingerprint() -> None:
    """Ids from before tasks existed stay valid: the default task adds nothing to the hash."""
    default = RunConfig()
    assert default.task.target == "stability.tasks.sign_sum.SignSumTask"
    assert fingerprint(default) == "0f7301c49a29"  # the default config's id before this change


@pytest.mark.parametrize(("overrides", "expected"), [
    (["task=adding"], "7499c560d1e7"), (["task=char_lm"], "77461b436a28"),
    (["precision=fp16", "data.seed=1"], "6f5beba079de"),
    (["model.cell=gru", "clip.enabled=true"], "bc0269849f26"),
])
def test_built_in_tasks_keep_the_fingerprints_their_stores_hold(overrides: list[str],
                                                                 expected: str) -> None:
    """Ids of the built-in tasks' configs as main recorded them (resume and de-dup match)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["tracking.enabled=false", *overrides])
    cfg.output_dir = "."
    assert fingerprint(to_run_config(OmegaConf.to_container(cfg, resolve=True))) == expected


def test_a_task_declares_its_typed_sections_and_their_errors_join_the_run_configs() -> None:
    """Any task (not the default alone) may type its sections: one error lists every mistake."""
    raw = {"task": {"_target_": "tests.tasks.test_tasks.TypedTask", "data": "${data}"}}
    with pytest.raises(ConfigError) as err:
        to_run_config(raw | {"data": {"n": 3, "m": 1}, "train": {"lr": -1}})
    message = str(err.value)
    assert message.startswith("3 invalid keys: ")
    for part in ("unknown key data.m: allowed keys are n", "data.n=3 is invalid",
                 "train.lr=-1 is invalid"):
        assert part in message
    cfg = to_run_config(raw | {"data": {"n": 40}})
    assert cfg.data == TinyData(n=40)
    # Its target is hashed (only a task declaring hash_target=False leaves it out).
    assert fingerprint(cfg) != fingerprint(dataclasses.replace(
        cfg, task=dataclasses.replace(cfg.task, target=TINY)))


@pytest.mark.parametrize(("target", "expected"), [
    ("stability.tasks.adding.AddingTask", "MSE"),
    ("stability.tasks.char_lm.CharLMTask", "cross-entropy"),
    ("stability.tasks.sign_sum.SignSumTask", "BCE"),
    (TINY, "loss"),  # a user task that names no loss: the neutral word
])
def test_the_loss_a_task_names_reaches_the_figures_loss_axis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, expected: str) -> None:
    """Task -> the run's stability.loss_name tag -> the report's runs -> the axis label.

    ``Figure.savefig`` is wrapped (a seam, it still writes the file) to read the axis label off
    the very figure the report draws: a PNG's pixels cannot be read back as text.
    """
    import matplotlib.figure
    import pandas as pd

    from stability.report.evidence import fetch
    from stability.report.examine import plotted
    from stability.report.present import plots
    from stability.tracking.contract import Tag
    from stability.tracking.run import run_record

    record = run_record(RunConfig(output_dir=str(tmp_path),
                                  task=TaskConfig(target=target, sections=())))
    assert record.tags[Tag.LOSS_NAME] == expected
    runs = pd.DataFrame([{"run_id": "a", "loss_name": record.tags[Tag.LOSS_NAME]}])
    saved: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (saved.append(fig), save(fig, *a, **k))[1])
    series = plotted.Series("winner", "fp32 noclip acc=1", "tab:red")
    fig = plots.val_loss_curves([(series, {0: pd.Series([0.9, 0.5], index=[1, 2])})],
                                tmp_path, fetch.loss_name(runs))
    assert fig is not None and (tmp_path / fig.file).is_file()
    assert saved[-1].axes[0].get_ylabel() == f"validation loss ({expected})"


def test_runs_recorded_before_the_loss_tag_read_as_a_neutral_loss() -> None:
    import pandas as pd

    from stability.report.evidence.fetch import loss_name

    assert loss_name(pd.DataFrame([{"run_id": "a", "loss_name": ""}])) == "loss"
    assert loss_name(pd.DataFrame([{"run_id": "a"}])) == "loss"


@pytest.mark.parametrize(("options", "target", "message"), [
    ({"out_dim": 3}, TINY, r"task\._target_=.*output of shape \(48,\) is rejected by task\.loss"),
    ({"poison": True}, TINY, r"task\._target_=.*first training batch's inputs hold inf/nan"),
    ({}, "tests.tasks.test_tasks.NoTestTask", r"task\._target_=.*has no test split"),
    ({"bogus": 1}, TINY, r"task\._target_=.*cannot be built: TypeError"),
])
def test_bad_tasks_fail_before_any_training(tmp_path: Path, options: dict, target: str,
                                            message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        train(_cfg(tmp_path, options, target))
    assert not (tmp_path / "steps.csv").exists()


def test_a_target_that_does_not_import_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"task\._target_='tests\.nope\.Task' is invalid: it "
                                          r"does not import \(ModuleNotFoundError"):
        to_run_config({"task": {"_target_": "tests.nope.Task"}})


def _sweep(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "sweep.py"), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("body", "key"), [
    ("_target_: tests.nope.Task", "task._target_='tests.nope.Task' is invalid"),
    ("_target_: tests.tasks.test_tasks.TinyTask\nout_dim: 3", "is rejected by task.loss"),
    ("_target_: tests.tasks.test_tasks.NoTestTask", "has no test split"),
])
def test_a_bad_task_from_a_user_config_dir_exits_2_with_one_line(
        tmp_path: Path, body: str, key: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--config-dir with task/<name>.yaml selects a user's task; a bad one: exit 2, one line."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "bad.yaml").write_text(body + "\n")  # package: task
    monkeypatch.chdir(tmp_path)
    proc = in_process(["sweep", "--config-dir", str(tmp_path), "task=bad",
                       "tracking.enabled=false", f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert proc.code == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: task._target_=") and key in last
    assert not (tmp_path / "run" / "steps.csv").exists()


def _preset(tmp: Path, *overrides: str, study: str = "adding") -> RunConfig:
    """A study's run config, composed by Hydra from conf/ as ``+study=<study>`` does."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"+study={study}", "tracking.enabled=false",
                                           "device=cpu", *overrides])
    cfg.output_dir = str(tmp)
    raw = OmegaConf.to_container(cfg, resolve=True)
    return to_run_config(raw)


def _norms(result: Any, column: str) -> list[float]:
    return [float(r[column]) for r in _rows(result.csv_path) if r["skipped"] == "0"]


@pytest.mark.slow
def test_adding_clip_off_has_spikes_and_clip_on_never_exceeds_max_norm(tmp_path: Path) -> None:
    """At the preset: max pre-clip norm >= 10x its median; clipped, post <= max_norm."""
    off = _preset(tmp_path / "off", "clip.enabled=false")
    assert off.task.target == "stability.tasks.adding.AddingTask" and off.data["seq_len"] == 50
    pre = _norms(train(off), "grad_l2_pre_clip")
    median = statistics.median(pre)
    assert max(pre) >= 10 * median, (max(pre), median)

    on = _preset(tmp_path / "on", "clip.enabled=true", "clip.max_norm=1.0")
    result = train(on)
    post, pre_on = _norms(result, "grad_l2_post_clip"), _norms(result, "grad_l2_pre_clip")
    assert max(pre_on) > 1.0  # clipping had something to do
    assert max(post) <= 1.0 * (1 + 1e-5)
    print(f"adding clip off: median {median:.3f} max {max(pre):.2f} ({max(pre) / median:.1f}x); "
          f"clip on 1.0: max post {max(post):.4f}, clipped {result.summary['clip_fraction']:.2f}")


# --------------------------------------------------------------------------- DDP on a user task


def _scenario_user_task_ddp(rank: int, root: str) -> dict[str, Any]:
    """Train TinyTask on this rank, counting the real gradient all-reduces of its DDP."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls: list[int] = []
    plain_wrap = distributed.wrap

    def hook(state, bucket):  # noqa: ANN001, ANN202 (DDP rejects string annotations)
        if bucket.index() == 0:
            calls.append(1)
        return default_hooks.allreduce_hook(state, bucket)

    def counting_wrap(model: nn.Module, device: str) -> nn.parallel.DistributedDataParallel:
        ddp = plain_wrap(model, device)
        ddp.register_comm_hook(None, hook)
        return ddp

    distributed.wrap = counting_wrap  # the real DDP, with a counting comm hook
    try:
        result = train(_cfg(Path(root, f"rank{rank}"), {"n": 200}, accum_steps=2, batch_size=8),
                       world_size=2)
    finally:
        distributed.wrap = plain_wrap
    return {"allreduces": len(calls), "steps": result.summary["optimizer_steps"]}


@pytest.mark.slow
def test_two_ranks_on_a_user_task_all_reduce_once_per_optimizer_step(tmp_path: Path) -> None:
    from tests.core.test_distributed import _launch

    got = _launch(_scenario_user_task_ddp, tmp_path, root=str(tmp_path))
    assert got.exitcodes == [0, 0], got.errors
    for r in got.results:
        # 120 samples / 2 ranks / batch 8 = 8 micro-batches a rank, 4 windows of 2, 3 epochs.
        assert r["steps"] == 12
        assert r["allreduces"] == r["steps"]


# --------------------------------------------------------------------------- the Transformer task


def _lm_run(tmp: Path, precision: str) -> list[dict[str, str]]:
    cfg = _preset(tmp, f"precision={precision}", "train.epochs=1", "data.num_samples=200",
                  "fault.loss_spike_at_step=3", study="char_lm")
    return _rows(train(cfg).csv_path)


@pytest.mark.slow
def test_char_lm_loss_spike_fp16_backs_off_and_skips_bf16_steps_unscaled(tmp_path: Path) -> None:
    """A x1e8 target spike overflows fp16's backward (skip, halve the scale); bf16 takes it."""
    fp16 = _lm_run(tmp_path / "fp16", "fp16")
    bf16 = _lm_run(tmp_path / "bf16", "bf16")
    spiked = {r["step"]: r for r in fp16}["3"]
    assert spiked["skipped"] == "1" and spiked["skip_reason"] == "nonfinite_grad"
    assert float(fp16[3]["scaler_scale"]) == float(spiked["scaler_scale"]) / 2  # backed off
    assert [r["skipped"] for r in fp16].count("1") == 1
    assert all(r["skipped"] == "0" and float(r["scaler_scale"]) == 1.0 for r in bf16)
    assert float(bf16[2]["loss"]) > 1e6 and float(bf16[2]["grad_l2_pre_clip"]) > 1e3


# --------------------------------------------------------------------------- per-layer norms


def test_per_layer_norms_recompose_the_pre_clip_norm_and_change_nothing(tmp_path: Path) -> None:
    """layer_norms.csv: sqrt(sum of squares) of a row is that step's grad_l2_pre_clip, also on
    clipped steps; the injected inf shows in the first parameter; steps.csv is unchanged."""
    import math

    from stability.core.config import ClipConfig, FaultConfig, TelemetryConfig

    def run(folder: str, per_layer: bool) -> Any:
        cfg = _cfg(tmp_path / folder, {"n": 200}, accum_steps=2)
        cfg = type(cfg)(**{**vars(cfg), "clip": ClipConfig(enabled=True, max_norm=0.5),
                           "fault": FaultConfig(inf_grad_at_step=4),
                           "telemetry": TelemetryConfig(per_layer=per_layer)})
        return train(cfg)

    on, off = run("on", True), run("off", False)
    assert on.csv_path.read_bytes() == off.csv_path.read_bytes()
    assert not (tmp_path / "off" / "layer_norms.csv").exists()
    with (tmp_path / "on" / "layer_norms.csv").open() as f:
        table = list(csv.reader(f))
    assert table[0] == ["step", "0.weight", "0.bias"]
    steps = _rows(on.csv_path)
    assert len(table) - 1 == len(steps)
    clipped = 0
    for row, step in zip(table[1:], steps, strict=True):
        assert row[0] == step["step"]
        if step["skipped"] == "1":
            assert row[1] == "inf"  # the first parameter, where the fault wrote inf
            continue
        total = math.sqrt(sum(float(v) ** 2 for v in row[1:]))
        assert total == pytest.approx(float(step["grad_l2_pre_clip"]), rel=1e-5)
        clipped += step["clipped"] == "1"
    assert clipped > 0  # the rescaling to pre-clip was exercised


@pytest.mark.parametrize("task", ["adding", "char_lm"])
def test_a_built_in_task_round_trips_through_config_yaml_and_hashes_its_data(
    tmp_path: Path, task: str,
) -> None:
    """config.yaml rebuilds the same run; task data counts, DataLoader workers do not."""
    from hydra import compose, initialize_config_dir

    from stability.core.config import to_yaml_dict

    def composed(*overrides: str) -> RunConfig:
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=[f"task={task}", *overrides])
        cfg.output_dir = str(tmp_path)
        return to_run_config(OmegaConf.to_container(cfg, resolve=True))

    cfg = composed()
    assert cfg.task.sections == ("data", "model") and cfg.task.options == {}
    saved = yaml.safe_load(yaml.safe_dump(to_yaml_dict(cfg)))
    assert saved["task"]["data"] == "${data}"
    assert to_run_config(saved) == cfg
    assert fingerprint(composed("data.seq_len=40")) != fingerprint(cfg)
    assert fingerprint(composed("train.num_workers=2")) == fingerprint(cfg)


def test_char_lm_reports_token_accuracy_and_perplexity(tmp_path: Path) -> None:
    """val_acc is the token accuracy; best_val_perplexity = exp(best per-token CE)."""
    import math

    cfg = _preset(tmp_path, "train.epochs=1", "data.num_samples=100", study="char_lm")
    s = train(cfg).summary
    assert s["best_val_perplexity"] == pytest.approx(math.exp(s["best_val_loss"]))
    assert 0 < s["best_val_acc"] < 1
    assert s["best_val_perplexity"] < 28  # below uniform guessing over the 28 characters


@pytest.mark.slow
@pytest.mark.server
def test_a_user_task_from_this_module_sweeps_and_reports_against_a_server(
    tmp_path: Path, mlflow_server: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """-m sweep + report of TinyTask (no accuracy metric) against a real mlflow server.

    The sweep is ``experiments/sweep.py`` in its own process (the task imported there from
    ``PYTHONPATH``); the report calls the same entry point as ``stability report`` in this
    process (``in_process``): the report is what is checked, not its process."""
    import mlflow

    from stability.tracking.contract import Kind, Tag

    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "tiny.yaml").write_text(f"_target_: {TINY}\nn: 200\n")
    uri = f"tracking.uri={mlflow_server.uri}"
    sweep = _sweep(tmp_path, "-m", "--config-dir", str(tmp_path), "task=tiny", uri,
                   "hydra/launcher=basic", "clip.enabled=false,true", "clip.max_norm=1.0",
                   "train.accum_steps=1", "precision=fp32", "seed=0,1", "train.epochs=3",
                   "tracking.experiment=tiny-e2e")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    # The winner is rebuilt only through a task the report is told about (issue 19).
    monkeypatch.chdir(tmp_path)
    report = in_process(["report", "experiment=tiny-e2e", uri,
                         f"output_dir={tmp_path / 'reports'}", f"task_target={TINY}"], capsys)
    assert report.code == 0, report.stderr[-3000:]
    assert next((tmp_path / "reports").glob("*/report.md")).read_text().count("Train with") == 1
    c = mlflow.MlflowClient(mlflow_server.uri)
    exp = c.get_experiment_by_name("tiny-e2e")
    runs = c.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = '{Kind.TRAIN}'")
    assert len(runs) == 4 and {r.data.params["task._target_"] for r in runs} == {TINY}
    assert all("best_val_mae" in r.data.metrics for r in runs)  # the task's own metric
    tested = [r for r in runs if "test_loss" in r.data.metrics]
    assert len(tested) == 2  # the winner's two seeds, and no other run
    assert len({r.data.tags[Tag.FINGERPRINT] for r in tested}) == 1


def test_each_task_yaml_repeats_its_task_defaults() -> None:
    """conf/task/<name>.yaml documents the task's own defaults: the two cannot drift."""
    import dataclasses

    import yaml

    from stability.tasks.adding import AddingTask
    from stability.tasks.char_lm import CorpusConfig, TransformerConfig

    def conf(name: str) -> dict:
        return yaml.safe_load((ROOT / "conf" / "task" / f"{name}.yaml").read_text())

    adding, default = conf("adding"), AddingTask()
    assert adding["data"] == dataclasses.asdict(default.data)
    assert adding["model"] == {"hidden_size": default.hidden_size,
                               "spectral_radius": default.spectral_radius}
    lm = conf("char_lm")
    assert lm["data"] == dataclasses.asdict(CorpusConfig())
    assert lm["model"] == dataclasses.asdict(TransformerConfig())


def test_the_gpu_study_composes_a_model_where_precision_matters(tmp_path: Path) -> None:
    """``+study=gpu_lm``: the char_lm Transformer at 6 x 512 with 256-character contexts, on
    CUDA, within the report's data cap; the grid is precision x clipping x accumulation."""
    cfg = _preset(tmp_path, study="gpu_lm")  # _preset sets device=cpu, as the CPU test runs it
    model, data = dict(cfg.model), dict(cfg.data)
    assert (model["d_model"], model["n_layers"], data["seq_len"]) == (512, 6, 256)
    assert cfg.task.target == "stability.tasks.char_lm.CharLMTask"
    text = (ROOT / "conf" / "study" / "gpu_lm.yaml").read_text()
    assert "\ndevice: cuda" in text and "precision: fp32,bf16,fp16" in text
    from stability.tracking.trusted import DATA_BYTES_PER_ELEMENT
    bytes_ = data["num_samples"] * data["seq_len"] * DATA_BYTES_PER_ELEMENT[cfg.task.target]
    assert bytes_ < 4 * 2**30


@pytest.mark.slow
def test_the_gpu_study_runs_shrunk_on_cpu_and_reports_precisions_speed_and_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The GPU preset with a tiny model on CPU: a sweep over fp32 / bf16 and its report, whose
    answer gives each precision's time against the chosen one and its peak memory."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = in_process(["sweep", "-m", "+study=gpu_lm", "device=cpu", "model.d_model=16",
                        "model.n_layers=1", "model.n_heads=2", "data.num_samples=64",
                        "data.seq_len=16", "data.words=50", "train.epochs=1",
                        "train.batch_size=8", "precision=fp32,bf16", "clip.enabled=false",
                        "train.accum_steps=1", "seed=0,1", "hydra/launcher=basic",
                        f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       capsys)
    assert sweep.code == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    report = in_process(["report", "experiment=gpu_lm", f"tracking.uri={uri}",
                         "registry.enabled=false", "plots=false"], capsys)
    assert report.code == 0, report.stderr[-2000:]
    assert "Precision" in report.stdout and "bf16" in report.stdout
    md = next(tmp_path.glob("reports/*/report.md")).read_text()
    assert "Peak memory by precision" in md and "fp32 " in md
