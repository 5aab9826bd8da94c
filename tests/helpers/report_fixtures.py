"""Sweeps with known validation losses, written to a real MLflow store as docs/TRACKING.md says.

The report tests import ``make_sweep`` from here: each run gets the contract's tags, params
(``stability.core.identity.flatten`` of a real ``RunConfig``), summary/epoch/step metrics, and real
artifacts (a ``steps.csv`` from ``CsvStepWriter``, ``config.yaml``, and a ``state_dict`` of a
real ``SequenceClassifier`` as ``checkpoints/best.pt``; with ``Spec.layer_norms`` also a
``layer_norms.csv`` from ``LayerNormRecorder``). The test below checks that the data
really follows the contract, so the report tests read what a real sweep writes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from stability.core.config import RunConfig, to_run_config
from stability.core.identity import fingerprint, flatten
from stability.core.layers import LayerNormRecorder
from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME, write_config
from stability.core.rundir import LAYER_NORMS_NAME
from stability.core.steplog import CsvStepWriter, StepLog
from stability.tasks.sign_sum import SequenceClassifier

OUTCOME_STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED"}
EPOCHS = 2
STEPS_PER_EPOCH = 3
# In layer_norms.csv a skipped step holds inf in this parameter (by named_parameters index)
# and nan in a later one: the first non-finite parameter is not the table's first column.
FIRST_BAD = 1
LOSS_INIT = 0.7  # every fixture run's validation loss before training (contract: loss_init)


@dataclass(frozen=True)
class Spec:
    """One config of a fixture sweep: ``losses[seed]`` is its best validation loss, or the
    outcome (``"diverged"`` / ``"failed"``) of a seed that did not finish; absent seeds are
    missing from the sweep."""

    precision: str = "fp32"
    clip: float | None = None
    accum: int = 1
    losses: dict[int, float | str] = field(default_factory=dict)
    skips: int = 0  # skipped steps per run (fp16 only, to exercise the scaler figure)
    layer_norms: bool = False  # write layer_norms.csv (telemetry.per_layer=true)
    seq_len: int = 30  # the task's sequence length: another input signature for the model
    lr: float = 2e-3  # train.lr (the default keeps every fixture's fingerprint)
    # params logged as given instead of the config's (a teammate's hostile run), per seed
    planted: tuple[tuple[int, str, str], ...] = ()


def run_config(spec: Spec, seed: int, out: Path, sweep_id: str = "", parent: str = "") -> RunConfig:
    """A real, tiny ``RunConfig`` for one (spec, seed)."""
    return to_run_config({
        "seed": seed, "device": "cpu",
        "data": {"num_samples": 300, "seq_len": spec.seq_len},
        "model": {"hidden_size": 8},
        "train": {"epochs": EPOCHS, "accum_steps": spec.accum, "lr": spec.lr},
        "precision": {"name": spec.precision,
                      "growth_interval": 100 if spec.precision == "fp16" else 2000},
        "clip": {"enabled": spec.clip is not None, "max_norm": spec.clip or 1.0},
        "tracking": {"sweep_id": sweep_id, "parent_run_id": parent},
        "output_dir": str(out),
    })


def _steps_csv(path: Path, spec: Spec, seed: int) -> list[StepLog]:
    writer = CsvStepWriter(path)
    logs = []
    scale = 2.0**16 if spec.precision == "fp16" else 1.0
    for step in range(1, EPOCHS * STEPS_PER_EPOCH + 1):
        skipped = step <= spec.skips
        norm = math.inf if skipped else 0.5 + 0.1 * step + 0.01 * seed
        clipped = spec.clip is not None and not skipped and norm > spec.clip
        s = StepLog(step=step, lr=2e-3, grad_l2_pre_clip=norm,
                    grad_l2_post_clip=min(norm, spec.clip) if clipped else norm,
                    loss=0.69 - 0.01 * step, skipped=skipped,
                    skip_reason="nonfinite_grad" if skipped else "", scaler_scale=scale,
                    clipped=clipped, micro_batches=spec.accum, samples=64 * spec.accum,
                    skips_cumulative=min(step, spec.skips))
        writer.on_step(s, epoch=(step - 1) // STEPS_PER_EPOCH + 1)
        logs.append(s)
        if skipped and spec.precision == "fp16":
            scale /= 2
    writer.close()
    return logs


def _layer_norms(path: Path, cfg: RunConfig, logs: list[StepLog]) -> None:
    """A real ``LayerNormRecorder`` fed known gradients: 0.01 * step * (index + 1) per element."""
    model = SequenceClassifier(cfg.model)
    params = list(model.parameters())
    recorder = LayerNormRecorder(model, cfg.clip.enabled and cfg.clip.method == "norm", path)
    for s in logs:
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, 0.01 * s.step * (i + 1))
        if s.skipped:
            params[FIRST_BAD].grad.view(-1)[0] = math.inf
            params[FIRST_BAD + 2].grad.view(-1)[0] = math.nan
        recorder.on_step(s)
    recorder.flush()


def log_run(c: MlflowClient, exp_id: str, spec: Spec, seed: int, root: Path, sweep_id: str,
            parent: str) -> str:
    """One training run with every field of the contract; returns its run id."""
    value = spec.losses[seed]
    outcome = value if isinstance(value, str) else "finished"
    out = root / (f"{sweep_id}-{spec.precision}-{spec.clip}-{spec.accum}-{spec.seq_len}-"
                  f"{spec.lr:g}-{seed}")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    cfg = run_config(spec, seed, out, sweep_id, parent)
    tags = {"stability.kind": "train", "stability.sweep_id": sweep_id,
            "stability.fingerprint": fingerprint(cfg), "stability.seed": str(seed),
            "stability.overrides": "", "stability.git_commit": "", "stability.outcome": outcome,
            "mlflow.parentRunId": parent}
    if outcome != "finished":
        tags["stability.reason"] = f"fixture: seed {seed} {outcome}"
    run = c.create_run(exp_id, tags=tags, run_name=f"{spec.precision} s={seed}")
    rid = run.info.run_id
    planted = {k: v for s, k, v in spec.planted if s == seed}
    params = [Param(k, planted.get(k, str(v))) for k, v in flatten(cfg).items()
              if k != "output_dir"]
    for i in range(0, len(params), 100):
        c.log_batch(rid, params=params[i:i + 100])
    logs = _steps_csv(out / CSV_NAME, spec, seed)
    if spec.layer_norms:
        _layer_norms(out / LAYER_NORMS_NAME, cfg, logs)
    write_config(cfg, out / CONFIG_NAME)
    torch.manual_seed(seed)
    torch.save(SequenceClassifier(cfg.model).state_dict(), out / CHECKPOINT_NAME)
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(getattr(s, k)), ts, s.step) for s in logs
               for k in ("grad_l2_pre_clip", "skipped", "scaler_scale")]
    if outcome == "finished":
        best = float(value)
        for epoch, (vl, va) in enumerate([(best + 0.05, 0.6), (best, 0.7 + 0.01 * seed)], 1):
            metrics += [Metric("val_loss", vl, ts, epoch), Metric("val_acc", va, ts, epoch)]
        clip_count = sum(s.clipped for s in logs)
        summary = {"best_val_loss": best, "best_epoch": EPOCHS, "clip_count": clip_count,
                   "clip_fraction": clip_count / len(logs), "skip_count": spec.skips,
                   "fp16_underflow_fraction": 0.01 if spec.precision == "fp16" else math.nan,
                   "diverged": 0, "wall_time_s": 1.0 + seed, "optimizer_steps": len(logs),
                   "loss_init": LOSS_INIT,
                   # the cost metrics every loop records (core.cost.RUN_COST_METRICS)
                   "step_time_median_s": 0.01, "peak_memory_mb": 300.0,
                   "effective_batch": 64.0 * spec.accum, "grad_syncs": len(logs),
                   "final_scaler_scale": 65536.0 if spec.precision == "fp16" else 1.0}
        metrics += [Metric(k, float(v), ts, 0) for k, v in summary.items()]
    elif outcome == "diverged":
        metrics += [Metric(k, float(v), ts, 0) for k, v in
                    {"best_val_loss": 0.05, "best_epoch": 1, "diverged": 1,
                     "skip_count": len(logs), "loss_init": LOSS_INIT}.items()]
    c.log_batch(rid, metrics=metrics)
    c.log_artifact(rid, str(out / CSV_NAME))
    c.log_artifact(rid, str(out / CONFIG_NAME))
    if spec.layer_norms:
        c.log_artifact(rid, str(out / LAYER_NORMS_NAME))
    c.log_artifact(rid, str(out / CHECKPOINT_NAME), artifact_path="checkpoints")
    c.set_terminated(rid, status=OUTCOME_STATUS[outcome])
    return rid


def make_sweep(uri: str, experiment: str, sweep_id: str, specs: list[Spec], root: Path,
               parent_run: bool = True) -> dict[tuple[str, int], str]:
    """Write a sweep (parent run + one run per spec and seed); ``{(fingerprint, seed): run_id}``.

    A new SQLite experiment keeps its artifacts under ``root`` (not the project's mlruns/).
    """
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is not None:
        exp_id = exp.experiment_id
    elif uri.startswith("sqlite"):
        exp_id = c.create_experiment(experiment, artifact_location=(root / "art").as_uri())
    else:
        exp_id = c.create_experiment(experiment)
    parent = ""
    if parent_run:
        parent = c.create_run(exp_id, run_name=f"sweep {sweep_id}", tags={
            "stability.kind": "sweep", "stability.sweep_id": sweep_id}).info.run_id
    ids = {}
    for spec in specs:
        for seed in spec.losses:
            rid = log_run(c, exp_id, spec, seed, root, sweep_id, parent)
            ids[(fingerprint(run_config(spec, seed, root)), seed)] = rid
    if parent:
        c.set_terminated(parent)
    return ids


@pytest.mark.server
def test_fixture_runs_follow_the_tracking_contract(mlflow_server, tmp_path):
    spec = Spec(precision="fp16", clip=1.0, accum=2, losses={0: 0.4, 1: "diverged"}, skips=1,
                layer_norms=True)
    ids = make_sweep(mlflow_server.uri, "fixture-contract", "fx", [spec], tmp_path)
    c = MlflowClient(mlflow_server.uri)
    (fp, _), rid = next(iter(ids.items()))
    run = c.get_run(rid)
    assert run.data.tags["stability.kind"] == "train"
    assert run.data.tags["stability.fingerprint"] == fp
    assert run.data.params["precision.name"] == "fp16"
    assert run.data.params["clip.enabled"] == "True"
    assert run.data.metrics["best_val_loss"] == 0.4
    assert [m.step for m in c.get_metric_history(rid, "val_loss")] == [1, 2]
    assert c.get_run(ids[(fp, 1)]).data.tags["stability.outcome"] == "diverged"
    files = {a.path for a in c.list_artifacts(rid)} | {
        a.path for a in c.list_artifacts(rid, "checkpoints")}
    assert {"steps.csv", "config.yaml", "checkpoints/best.pt", "layer_norms.csv"} <= files
    local = Path(c.download_artifacts(rid, "", str(tmp_path / "dl")))
    state = torch.load(local / "checkpoints" / "best.pt", weights_only=True)
    cfg = to_run_config(yaml.safe_load((local / "config.yaml").read_text()))
    SequenceClassifier(cfg.model).load_state_dict(state)
    assert fingerprint(cfg) == fp
