"""Mixed-precision policy: autocast dtype, GradScaler only for fp16, device resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from stability.core.config import ConfigError, PrecisionConfig
from stability.core.precision import (
    Precision,
    autocast,
    fp16_underflow_fraction,
    make_scaler,
    resolve_device,
)
from stability.tasks.sign_sum import ModelConfig, SequenceClassifier


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)],
)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_autocast_computes_the_recurrent_cell_in_the_policy_dtype(
    precision: str, dtype: torch.dtype, cell: str,
) -> None:
    """fp16 -> float16, bf16 -> bfloat16, fp32 -> float32, for the RNN output on CPU."""
    model = SequenceClassifier(ModelConfig(cell=cell, hidden_size=8))
    seen: list[torch.dtype] = []
    model.rnn.register_forward_hook(lambda _m, _i, out: seen.append(out[0].dtype))
    with autocast(precision, "cpu"):
        model(torch.randn(4, 10, 1))
    assert seen == [dtype]


def test_fp32_autocast_is_not_active() -> None:
    """fp32 uses no autocast context at all."""
    with autocast("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_scaler_is_enabled_only_for_fp16(precision: str) -> None:
    """make_scaler builds a GradScaler with enabled=(precision == "fp16") and the knobs set."""
    cfg = PrecisionConfig(name=precision, init_scale=1024.0, growth_interval=7)
    scaler = make_scaler(cfg, "cpu")
    assert scaler.is_enabled() == (precision == "fp16")
    if precision == "fp16":
        assert scaler.get_scale() == 1024.0
        assert scaler.get_growth_interval() == 7


@pytest.mark.parametrize("name", ["fp8", "FP16", "float16", "", None])
def test_the_precision_enum_rejects_an_unknown_name_with_the_allowed_values(name: object) -> None:
    """One enum spells the names: an unknown one is a ConfigError listing all three."""
    with pytest.raises(ConfigError) as err:
        Precision.parse(name)
    assert str(err.value) == (f"precision={name!r} is invalid: allowed values are "
                              "fp32 | fp16 | bf16")
    assert [Precision.parse(p) for p in ("fp32", "fp16", "bf16")] == list(Precision)
    assert [p for p in Precision if p.scaled] == [Precision.FP16]  # the GradScaler's one


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "fp8"}, "precision='fp8' is invalid: allowed values are fp32 | fp16 | bf16"),
        ({"name": "fp16", "init_scale": 0.0}, "precision.init_scale=0.0 is invalid"),
        ({"name": "fp16", "growth_interval": 0}, "precision.growth_interval=0 is invalid"),
    ],
)
def test_invalid_precision_names_the_key_and_allowed_values(kwargs: dict, needle: str) -> None:
    """An unknown policy or a non-positive scaler knob is refused, naming the key."""
    with pytest.raises(ConfigError) as err:
        PrecisionConfig(**kwargs)
    assert needle in str(err.value)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_shipped_precision_files_enable_the_scaler_for_fp16_alone(name: str) -> None:
    """conf/precision/<name>.yaml builds a policy whose GradScaler is on exactly for fp16."""
    path = Path(__file__).resolve().parents[2] / "conf" / "precision" / f"{name}.yaml"
    cfg = PrecisionConfig(**yaml.safe_load(path.read_text()))
    assert cfg.name == name
    assert make_scaler(cfg, "cpu").is_enabled() == (name == "fp16")


def test_resolve_device_on_cpu() -> None:
    """auto and cpu resolve to cpu; an unknown device lists the allowed ones."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: test_resolve_device_on_cuda covers this machine")
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="device=cuda") as err:
        resolve_device("cuda")
    assert "auto | cpu" in str(err.value)
    with pytest.raises(ConfigError, match="auto | cpu | cuda"):
        resolve_device("tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resolve_device_on_cuda() -> None:
    """With a GPU, auto picks cuda and cuda is accepted."""
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cuda") == "cuda"


def test_fp16_underflow_fraction_counts_flushed_nonzero_elements() -> None:
    """Share of nonzero elements that become 0 in float16 (1e-9 flushes, 1e-3 does not)."""
    grads = [torch.tensor([1e-9, 1.0, 0.0]), torch.tensor([1e-3, -1e-10, 0.0])]
    assert fp16_underflow_fraction(grads) == pytest.approx(2 / 4)
    assert fp16_underflow_fraction([torch.zeros(5)]) == 0.0


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_every_cell_trains_a_low_precision_step_on_cpu(precision: str, cell: str) -> None:
    """fp16/bf16 forward+backward works for every cell; grads land in the fp32 parameters."""
    torch.manual_seed(0)
    model = SequenceClassifier(ModelConfig(cell=cell, hidden_size=8))
    x = torch.randn(6, 10, 1)
    y = (x.sum(dim=(1, 2)) > 0).float()
    with autocast(precision, "cpu"):
        logits = model(x)
    assert logits.dtype == (torch.float16 if precision == "fp16" else torch.bfloat16)
    torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), y).backward()
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
        assert bool(torch.isfinite(p.grad).all())
    assert float(model.rnn.weight_hh_l0.grad.abs().sum()) > 0


def test_rnn_autocast_matches_explicit_low_precision_cell() -> None:
    """For nn.RNN the model's low-precision path equals plain CPU autocast bit for bit."""
    torch.manual_seed(0)
    model = SequenceClassifier(ModelConfig(cell="rnn", hidden_size=8))
    x = torch.randn(6, 10, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        ours = model(x)
        reference = model.head(model.rnn(x)[0][:, -1]).squeeze(-1)
    assert torch.equal(ours, reference)
