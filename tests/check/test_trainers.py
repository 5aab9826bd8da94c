"""``stability check`` through the trainers' own mechanics: Lightning and the HF Trainer.

The probes step a real ``lightning.pytorch.Trainer`` / ``transformers.Trainer`` (tiny models,
a few samples). What they measure is the trainers' behaviour, read from their sources:
Lightning divides every micro-batch's loss by ``accumulate_grad_batches``, a short last window
included, and steps its LR scheduler on a skipped fp16 step (#5558, #16228); transformers 5.24
counts a GPT-2 LM head's tokens without the label shift (its ``loss_type`` is None), so the
gradient is ``(T - 1) / T`` of the larger batch's.
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

from stability.check.accumulation import probe_accumulation
from stability.check.amp import probe_clip, probe_skip
from stability.check.result import Status
from stability.check.rig import Template
from stability.check.sanity import probe_determinism
from stability.check.subject import no_dropout
from stability.integrations import hf_check, lightning_check
from tests.helpers.examples import example_module

ROOT = Path(__file__).resolve().parents[2]
LIGHTNING = ROOT / "examples" / "lightning_task"
HF = ROOT / "examples" / "hf_task"


def _by_name(results):
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def spirals():
    return example_module(LIGHTNING, "spirals")


def _lightning(spirals, k=4, b=8):
    torch.manual_seed(0)
    build = lambda: spirals.SpiralMLP(hidden=8)  # noqa: E731
    x, y = spirals.spirals(k * b, 0.02, 0)
    micro = [[x[i : i + b], y[i : i + b]] for i in range(0, k * b, b)]
    return Template(model=build(), loss_fn=None, seed=0,
                    loss_of=lightning_check.module_loss), build, micro


def test_lightning_accumulation_is_a_larger_batch_except_its_short_last_window(spirals):
    template, _, micro = _lightning(spirals)
    got = _by_name(probe_accumulation(template, lightning_check.step, micro, 4))
    assert got["accumulation.full"].status is Status.PASS, got
    short = got["accumulation.short_window"]
    # 2 of 4 micro-batches, each divided by accumulate_grad_batches=4: half the gradient
    assert short.status is Status.FAIL and short.measured == pytest.approx(0.5, abs=1e-4)


def test_lightning_clips_unscaled_gradients_and_steps_its_schedule_on_a_skip(spirals):
    template, build, micro = _lightning(spirals)
    clip = probe_clip(template, lightning_check.step, micro[:1], baseline=lightning_check.step)
    assert clip.status is Status.PASS and clip.measured < 1e-2, clip
    skip = probe_skip(template, lightning_check.step, micro[:1])
    # params, optimizer state and the scale are right; the schedule advanced: one broken
    assert skip.status is Status.FAIL and skip.measured == 1, skip
    assert skip.meaning.startswith("FAIL: LR schedule advanced (last_epoch 1 -> 2")
    same = probe_determinism(build, template, lightning_check.step, [micro[:2], micro[2:]])
    assert same.status is Status.PASS and same.measured == 0


def _gpt2(seq_len: int, loss_type: str | None = None):
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_check.quiet()

    def build():
        model = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=seq_len, n_embd=16,
                                           n_layer=1, n_head=2, bos_token_id=0,
                                           eos_token_id=0))
        if loss_type is not None:
            model.loss_type = loss_type
        return no_dropout(model)

    torch.manual_seed(0)
    ids = torch.randint(0, 20, (4 * 4, seq_len), generator=torch.Generator().manual_seed(1))
    micro = [{"input_ids": ids[i : i + 4], "labels": ids[i : i + 4]} for i in range(0, 16, 4)]
    return Template(model=build(), loss_fn=None, seed=0, loss_of=hf_check.model_loss), micro


def test_hf_trainer_counts_a_gpt2_lm_heads_tokens_without_the_shift():
    seq_len = 8
    template, micro = _gpt2(seq_len)
    got = _by_name(probe_accumulation(template, hf_check.step, micro, 4))
    for name in ("accumulation.full", "accumulation.short_window"):
        # num_items_in_batch = B * T where the loss sums B * (T - 1) tokens: 1/T too small
        assert got[name].status is Status.FAIL, got
        assert got[name].measured == pytest.approx(1 / seq_len, rel=1e-3)


def test_hf_trainer_accumulation_is_a_larger_batch_once_the_loss_type_says_it_shifts():
    template, micro = _gpt2(8, loss_type="ForCausalLM")
    got = probe_accumulation(template, hf_check.step, micro, 4)
    assert [r.status for r in got] == [Status.PASS, Status.PASS], got


def _cli(args, cwd, **env):
    return subprocess.run([sys.executable, "-m", "stability.cli", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "task", "fails", "na"), [
    (LIGHTNING, "spirals", {"accumulation.short_window": 0.5, "skip.is_skip": 1.0},
     ["sanity.init_loss"]),
    (HF, "gpt2", {"accumulation.full": 1 / 32, "accumulation.short_window": 1 / 32},
     ["clip.unscaled", "skip.is_skip", "sanity.init_loss"]),
], ids=["lightning", "hf"])
def test_cli_check_on_the_trainer_examples(tmp_path, folder, task, fails, na):
    out = tmp_path / "c.json"
    done = _cli(["--config-dir", ".", f"task={task}", f"check.output={out}",
                 "tracking.enabled=false"], folder)
    assert done.returncode == 1, done.stderr[-2000:]
    body = json.loads(out.read_text())
    got = {p["name"]: p for p in body["probes"]}
    assert len(got) == 11 and body["exit_status"] == 1
    assert {n for n, p in got.items() if p["status"] == "fail"} == set(fails)
    for name, value in fails.items():
        assert float(got[name]["measured"]) == pytest.approx(value, rel=1e-3)
    assert [n for n, p in got.items() if p["status"] == "n/a"] == na
    for name in na:
        assert got[name]["meaning"].startswith(
            "n/a: the task declares no expected_init_loss" if name == "sanity.init_loss"
            else "n/a: accelerate refuses fp16 on CPU")
        assert f"{name:<25}  n/a" in done.stdout
    assert all(p["status"] in ("pass", "fail", "n/a") for p in got.values())
    if folder == LIGHTNING:  # its own faults, named as such with the issue and the way out
        assert "the trainer's own fault" in got["accumulation.short_window"]["meaning"]
        assert "check.accept=[lightning.skip_schedule]" in got["skip.is_skip"]["meaning"]
    assert not any(math.isnan(float(got[n]["measured"])) for n in fails)


@pytest.mark.slow
def test_cli_lightnings_own_faults_accepted_by_name_exit_0(tmp_path):
    out = tmp_path / "c.json"
    done = _cli(["--config-dir", ".", "task=spirals", f"check.output={out}",
                 "tracking.enabled=false",
                 "check.accept=[lightning.short_window,lightning.skip_schedule]"], LIGHTNING)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    got = {p["name"]: p for p in json.loads(out.read_text())["probes"]}
    assert got["accumulation.short_window"]["status"] == "accepted"
    assert "Lightning #19987" in got["accumulation.short_window"]["meaning"]
    assert got["skip.is_skip"]["status"] == "accepted"
    assert "accumulation.short_window  accepted" in done.stdout
    assert json.loads(out.read_text())["exit_status"] == 0


# --- an HF Trainer subclass with its own compute_loss, a dynamic-padding collator ------------

def pad_collate(samples):
    """Dynamic padding: each batch padded to its own longest sample (labels -100 there)."""
    n = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), n, dtype=torch.long)
    mask = torch.zeros(len(samples), n, dtype=torch.long)
    labels = torch.full((len(samples), n), -100, dtype=torch.long)
    for i, s in enumerate(samples):
        m = int(s.get("attention_mask", torch.ones(len(s["input_ids"]))).sum())
        ids[i, :m], mask[i, :m], labels[i, :m] = s["input_ids"][:m], 1, s["input_ids"][:m]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _trainer_classes():
    from transformers import Trainer

    class PerBatchMean(Trainer):
        """compute_loss as often written: the model's mean, num_items_in_batch ignored."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    class TokenSum(Trainer):
        """compute_loss over the window's token count (num_items_in_batch), as the fix."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            logits = model(**inputs).logits[:, :-1].float()
            target = labels[:, 1:]
            total = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100,
                reduction="sum")
            n = num_items_in_batch if num_items_in_batch is not None else (target != -100).sum()
            return total / n

    return PerBatchMean, TokenSum


def _padded_gpt2(trainer_class):
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_check.quiet()
    hf = hf_check.HFLoop(trainer_class, pad_collate)

    def build():
        model = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=16, n_embd=16,
                                           n_layer=1, n_head=2, bos_token_id=0,
                                           eos_token_id=0))
        model.loss_type = "ForCausalLM"  # the Trainer counts the shifted tokens
        return no_dropout(model)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    samples = [{"input_ids": torch.randint(1, 20, (int(n),), generator=g)}
               for n in torch.randint(3, 16, (16,), generator=g)]
    collate = hf_check.collated(pad_collate)  # the Trainer collates the raw samples itself
    micro = [collate(samples[i : i + 4]) for i in range(0, 16, 4)]
    return Template(model=build(), loss_fn=None, seed=0, loss_of=hf.loss, join=hf.join), hf, micro


def test_hf_dynamic_padding_with_the_stock_trainer_is_a_larger_batch():
    template, hf, micro = _padded_gpt2(None)
    assert len({m["input_ids"].shape[1] for m in micro}) > 1  # padded per micro-batch
    got = probe_accumulation(template, hf.step, micro, 4)
    assert [r.status for r in got] == [Status.PASS, Status.PASS], got


def test_hf_trainer_subclass_compute_loss_ignoring_num_items_fails_and_its_fix_passes():
    per_batch_mean, token_sum = _trainer_classes()
    template, hf, micro = _padded_gpt2(per_batch_mean)
    full = _by_name(probe_accumulation(template, hf.step, micro, 4))["accumulation.full"]
    # the Trainer does not divide a loss it believes scaled by num_items_in_batch: the sum of
    # 4 per-micro-batch means, unequally weighted
    assert full.status is Status.FAIL and full.measured > 1, full
    assert "weighted unequally" in full.meaning, full.meaning
    assert "not divided by the window's 4 micro-batches" in full.meaning, full.meaning
    template, hf, micro = _padded_gpt2(token_sum)
    got = probe_accumulation(template, hf.step, micro, 4)
    assert [r.status for r in got] == [Status.PASS, Status.PASS], got
