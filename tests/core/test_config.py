"""Configuration errors: named key, allowed values, before any training, clean CLI exit."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from stability.core.config import (
    ClipConfig,
    ConfigError,
    PrecisionConfig,
    RunConfig,
    TrainConfig,
    to_run_config,
)
from stability.tasks.sign_sum import DataConfig, ModelConfig
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]

CASES: list[tuple[type, dict[str, Any], str, str]] = [
    (ClipConfig, {"max_norm": 0}, "clip.max_norm", "number > 0"),
    (ClipConfig, {"max_norm": -1.0}, "clip.max_norm", "number > 0"),
    (ClipConfig, {"max_norm": math.nan}, "clip.max_norm", "number > 0"),
    (ClipConfig, {"method": "l1"}, "clip.method", "norm | value"),
    (TrainConfig, {"accum_steps": 0}, "train.accum_steps", "an integer >= 1"),
    (TrainConfig, {"accum_steps": 1.5}, "train.accum_steps", "an integer >= 1"),
    (TrainConfig, {"batch_size": 0}, "train.batch_size", "an integer >= 1"),
    (TrainConfig, {"batch_size": True}, "train.batch_size", "an integer >= 1"),
    (TrainConfig, {"lr": math.inf}, "train.lr", "> 0"),
    (PrecisionConfig, {"name": "fp8"}, "precision", "fp32 | fp16 | bf16"),
    (PrecisionConfig, {"name": "fp16", "init_scale": math.inf},
     "precision.init_scale", "> 0"),
    (ModelConfig, {"cell": "transformer"}, "model.cell", "rnn | gru | lstm"),
    (RunConfig, {"device": "tpu"}, "device", "auto | cpu | cuda"),
    (DataConfig, {"num_samples": 5}, "data.num_samples", ">= 20"),
]


@pytest.mark.parametrize(("cls", "kwargs", "key", "allowed"), CASES,
                         ids=[f"{c[0].__name__}-{c[2]}-{c[1]}" for c in CASES])
def test_invalid_value_names_key_and_allowed_values(
    cls: type, kwargs: dict[str, Any], key: str, allowed: str,
) -> None:
    """Each bad value raises ConfigError whose message has the dotted key and allowed values."""
    with pytest.raises(ConfigError) as err:
        cls(**kwargs)
    message = str(err.value)
    assert message.startswith(key)
    assert allowed in message


def test_max_norm_is_validated_even_with_clipping_off() -> None:
    """A nonsensical threshold is a mistake even while clip.enabled=false."""
    with pytest.raises(ConfigError, match="clip.max_norm"):
        to_run_config({"clip": {"enabled": False, "max_norm": 0}})


def test_unknown_key_lists_allowed_keys() -> None:
    """A typo in a section key is named together with the keys that exist."""
    with pytest.raises(ConfigError, match=r"unknown key clip\.max_nrom") as err:
        to_run_config({"clip": {"max_nrom": 2.0}})
    assert "max_norm" in str(err.value)


def test_to_run_config_converts_nested_mapping() -> None:
    """A valid plain mapping becomes the frozen RunConfig with every section typed."""
    cfg = to_run_config({
        "seed": 3, "device": "cpu", "output_dir": "/tmp/x",
        "precision": {"name": "fp16", "scaler": True},  # a legacy key, dropped on load
        "clip": {"enabled": True, "max_norm": 0.5},
        "train": {"accum_steps": 4, "batch_size": 8},
        "fault": {"inf_grad_at_step": 5},
        "hydra": {"ignored": True},
    })
    assert cfg.seed == 3 and cfg.clip.max_norm == 0.5 and cfg.train.accum_steps == 4
    assert cfg.precision.name == "fp16" and cfg.fault.inf_grad_at_step == 5
    with pytest.raises(AttributeError):
        cfg.seed = 4  # type: ignore[misc]


CLI_CASES = [
    ("clip.max_norm=0", "clip.max_norm", "number > 0"),
    ("precision=fp8", "precision=fp8", "allowed values are bf16 | fp16 | fp32"),
    ("device=cuda", "device=cuda", "auto | cpu"),  # only asserted where no GPU exists
]


@pytest.fixture(scope="module")
def cli_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every CLI case of this module, started at once (each is a ~3 s interpreter start)."""
    procs = {}
    for override, _, _ in CLI_CASES:
        run_dir = tmp_path_factory.mktemp("cli") / "run"
        args = [sys.executable, "experiments/sweep.py", override, "tracking.enabled=false",
                f"hydra.run.dir={run_dir}"]
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        procs[override] = (args, proc, run_dir)
    results = {}
    for override, (args, proc, run_dir) in procs.items():
        out, err = proc.communicate(timeout=180)
        results[override] = (subprocess.CompletedProcess(args, proc.returncode, out, err), run_dir)
    return results


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
@pytest.mark.parametrize(("override", "key", "allowed"), CLI_CASES,
                         ids=[c[0] for c in CLI_CASES])
def test_cli_config_error_exits_cleanly_before_training(
    cli_results: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
    override: str, key: str, allowed: str,
) -> None:
    """sweep.py with a bad value: exit 2, one line with the key and allowed values, no traceback."""
    if override == "device=cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is present: device=cuda is valid here (see the CUDA test)")
    proc, run_dir = cli_results[override]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert key in output and allowed in output, output
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: "), output
    assert "Traceback" not in output, output
    assert not (run_dir / "steps.csv").exists()


def test_an_unknown_group_option_is_one_line_naming_every_option() -> None:
    """precision=fp8 (alone or in a sweep's list) names the group and all its options; choices
    Hydra's grammar must read, and command lines that add config folders, are left to Hydra."""
    from stability.groups import bad_group_choice

    line = "error: precision=fp8 is invalid: allowed values are bf16 | fp16 | fp32"
    assert bad_group_choice(["precision=fp8"]) == line
    assert bad_group_choice(["-m", "seed=0,1", "precision=fp16,fp8"]) == line
    assert bad_group_choice(["optim=lion"]).endswith("allowed values are adam | adamw | sgd")
    assert bad_group_choice(["precision=fp16,bf16", "+task=adding", "optim=sgd",
                             "schedule=warmup", "clip.max_norm=0", "hydra/launcher=basic",
                             "precision=choice(fp16,fp8)", "~precision"]) is None
    assert bad_group_choice(["hydra.searchpath=[file:///x]", "precision=fp8"]) is None


def test_fingerprint_separates_world_size_but_not_seed() -> None:
    """A 2-rank run has another effective batch: another config; the seed never matters."""
    from stability.core.config import RunConfig
    from stability.core.identity import fingerprint

    one, other_seed = RunConfig(seed=0), RunConfig(seed=3)
    assert fingerprint(one) == fingerprint(other_seed) == fingerprint(one, world_size=1)
    assert fingerprint(one, world_size=2) != fingerprint(one)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cli_device_cuda_trains_where_a_gpu_exists(
    cli_results: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
) -> None:
    """With a GPU, device=cuda trains (the same command is a config error on CPU)."""
    proc, run_dir = cli_results["device=cuda"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (run_dir / "steps.csv").read_text().splitlines()
    assert len(rows) > 1 and rows[0].startswith("step,")  # a header and the run's steps


# --------------------------------------------------------------------------- one config source


def _compose(*overrides: str) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    cfg.output_dir = "."
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_yaml_repeats_the_dataclass_defaults_exactly(precision: str) -> None:
    """Defaults live in the dataclasses; conf/ documents every key with the same value."""
    import dataclasses

    from stability.core.config import PrecisionConfig

    raw = _compose(f"precision={precision}")
    # the default run, with the precision option's own identity
    default = RunConfig(precision=PrecisionConfig(name=precision))
    sections = {f.name: getattr(default, f.name) for f in dataclasses.fields(RunConfig)
                if f.name != "task" and dataclasses.is_dataclass(getattr(default, f.name))}
    assert {"data", "model", "precision", "clip", "train", "tracking"} <= set(sections)
    assert {"optim", "schedule"} <= set(sections)
    for key, section in sections.items():
        as_written = section.as_yaml() if key in ("optim", "schedule") else None
        assert raw[key] == (as_written or dataclasses.asdict(section)), key
    assert {k: raw[k] for k in ("seed", "device")} == {"seed": RunConfig.seed,
                                                       "device": RunConfig.device}
    assert raw["task"]["_target_"] == RunConfig().task.target


def test_every_invalid_key_is_reported_at_once() -> None:
    """One error listing each bad key with its allowed values, across sections."""
    with pytest.raises(ConfigError) as err:
        to_run_config({"train": {"lr": -1, "epochs": 0, "bogus": 1},
                       "clip": {"max_norm": 0}, "model": {"cell": "cnn"}})
    message = str(err.value)
    assert message.startswith("5 invalid keys: ") and "\n" not in message
    for part in ("train.lr=-1", "train.epochs=0", "unknown key train.bogus", "clip.max_norm=0",
                 "model.cell='cnn' is invalid: allowed values are rnn | gru | lstm"):
        assert part in message


def test_every_invalid_key_reaches_the_command_line_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = in_process(["sweep", "train.lr=-1", "clip.max_norm=0", "tracking.enabled=false",
                       f"hydra.run.dir={tmp_path}"], capsys)
    assert proc.code == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: 2 invalid keys: clip.max_norm=0 is invalid: allowed values are a finite number "
        "> 0; train.lr=-1 is invalid: allowed values are a finite number > 0")


def test_a_bad_key_does_not_hide_the_other_bad_keys_of_its_section() -> None:
    with pytest.raises(ConfigError) as err:
        to_run_config({"precision": {"name": "fp8", "growth_interval": 0}})
    message = str(err.value)
    assert message.startswith("2 invalid keys: ")
    assert "precision='fp8' is invalid: allowed values are fp32 | fp16 | bf16" in message
    assert "precision.growth_interval=0 is invalid: allowed values are an integer >= 1" in message


def test_the_tasks_own_sections_join_the_one_error_of_the_run_config() -> None:
    """sign_sum's data/model schema lives with sign_sum, yet its mistakes come all at once."""
    with pytest.raises(ConfigError) as err:
        to_run_config({"data": {"num_samples": 5}, "model": {"cell": "transformer"},
                       "train": {"lr": -1}})
    message = str(err.value)
    assert message.startswith("3 invalid keys: ")
    for part in ("data.num_samples=5 is invalid", "model.cell='transformer' is invalid: "
                 "allowed values are rnn | gru | lstm", "train.lr=-1 is invalid"):
        assert part in message


def test_the_report_config_reports_every_invalid_key_at_once() -> None:
    """The report's config goes through the same helper: one line, each key named."""
    from stability.report.options import ReportError, to_report_config

    with pytest.raises(ReportError) as err:
        to_report_config({"alpha": 2.0, "history_workers": 0, "verdict": {"spike_factor": -1.0}})
    message = str(err.value)
    assert message.startswith("3 invalid keys: ") and "\n" not in message
    for key in ("alpha=2.0", "history_workers=0", "verdict.spike_factor=-1.0"):
        assert key in message


def test_the_benchmark_spec_reports_every_invalid_option_at_once() -> None:
    from benchmarks.spec import BenchSpec

    with pytest.raises(ConfigError) as err:
        BenchSpec(reps=0, max_norm=-1.0, precision="fp8")
    message = str(err.value)
    assert message.startswith("3 invalid keys: ")
    for key in ("--reps=0", "--max-norm=-1.0", "--precision='fp8'"):
        assert key in message
