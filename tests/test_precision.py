"""Mixed-precision policy: autocast dtype, GradScaler only for fp16, device resolution."""

from __future__ import annotations

import pytest
import torch

from stability.core.config import ConfigError, ModelConfig, PrecisionConfig, StepConfig
from stability.core.precision import autocast, fp16_underflow_fraction, make_scaler, resolve_device
from stability.tasks.sign_sum import SequenceClassifier


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
    with autocast(StepConfig(precision=precision, device="cpu")):
        model(torch.randn(4, 10, 1))
    assert seen == [dtype]


def test_fp32_autocast_is_not_active() -> None:
    """fp32 uses no autocast context at all."""
    with autocast(StepConfig(precision="fp32", device="cpu")):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(StepConfig(precision="bf16", device="cpu")):
        assert torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_scaler_is_enabled_only_for_fp16(precision: str) -> None:
    """make_scaler builds a GradScaler with enabled=(precision == "fp16") and the knobs set."""
    cfg = StepConfig(precision=precision, device="cpu", init_scale=1024.0, growth_interval=7)
    scaler = make_scaler(cfg)
    assert scaler.is_enabled() == (precision == "fp16")
    if precision == "fp16":
        assert scaler.get_scale() == 1024.0
        assert scaler.get_growth_interval() == 7


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "fp16", "scaler": False}, "precision.scaler=false with precision=fp16"),
        ({"name": "bf16", "scaler": True}, "precision.scaler=true with precision=bf16"),
        ({"name": "fp32", "scaler": True}, "precision.scaler=true with precision=fp32"),
        ({"name": "fp8"}, "fp32 | fp16 | bf16"),
    ],
)
def test_precision_and_scaler_must_agree(kwargs: dict, needle: str) -> None:
    """fp16 needs the scaler; nothing else may use it; unknown names list the allowed ones."""
    with pytest.raises(ConfigError, match="precision") as err:
        PrecisionConfig(**kwargs)
    assert needle in str(err.value)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_valid_precision_configs(name: str) -> None:
    """The three shipped policies construct without error."""
    assert PrecisionConfig(name=name, scaler=name == "fp16").name == name


def test_resolve_device() -> None:
    """auto maps to what exists; cuda without CUDA is a ConfigError naming key and options."""
    has_cuda = torch.cuda.is_available()
    assert resolve_device("auto") == ("cuda" if has_cuda else "cpu")
    assert resolve_device("cpu") == "cpu"
    if has_cuda:
        assert resolve_device("cuda") == "cuda"
    else:
        with pytest.raises(ConfigError, match="device=cuda") as err:
            resolve_device("cuda")
        assert "auto | cpu" in str(err.value)
    with pytest.raises(ConfigError, match="auto | cpu | cuda"):
        resolve_device("tpu")


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
    with autocast(StepConfig(precision=precision, device="cpu")):
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
