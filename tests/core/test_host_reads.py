"""Host reads per steady-state optimizer step, counted on CPU (``benchmarks.host_reads``).

On CUDA every host read (``.item()``, ``.tolist()``, ``bool``/``float``/``int`` of a tensor,
``.cpu()``, ``.numpy()``) is a device sync; on CPU it cannot be timed but it can be counted.
Each route is counted over its steady-state steps (after a warm-up, within an epoch) and the
reads made by our code are pinned per step: our loop (fp32 and fp16, accumulation 1 and 4),
the Lightning and HF callbacks and ``stability.track``. The one read our loop keeps is the
skip decision (docs/performance.md, "Host reads per optimizer step"). The same steps under
``torch.cuda.set_sync_debug_mode("error")`` run where a GPU is (skipped here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from benchmarks.host_reads import HostReads, StepBoundaries, counted
from stability.core.config import ClipConfig, PrecisionConfig, RunConfig, TrainConfig
from stability.core.loop import train
from stability.tasks.sign_sum import DataConfig

ROOT = Path(__file__).resolve().parents[2]
# 640 sequences: a training split of 448 = 28 micro-batches of 16, whole windows of 4.
SAMPLES, BATCH = 640, 16
# Reads our code makes per steady-state optimizer step, by route. Before issue 48 (main
# 6a33f8f): our loop 1 per micro-batch (the loss's finiteness) + 1 (measure) + 1 (per-layer
# table), fp16 + 1 (get_scale) + GradScaler.step's found_inf (torch's) + the underflow share's
# 2 per gradient tensor every 25th step.
OUR_LOOP = 1


def _cfg(tmp: Path, precision: str, accum: int, **sections: object) -> RunConfig:
    return RunConfig(seed=0, device="cpu", output_dir=str(tmp),
                     data=DataConfig(num_samples=SAMPLES), precision=PrecisionConfig(precision),
                     train=TrainConfig(epochs=2, batch_size=BATCH, accum_steps=accum),
                     **sections)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("accum", [1, 4])
def test_our_loop_reads_the_host_once_per_step(tmp_path: Path, precision: str,
                                               accum: int) -> None:
    """The default task (per-layer table and update ratio on), underflow sampled every step:
    one read per optimizer step, whatever the accumulation and the precision; no read of
    GradScaler's own (``scaler.step`` is not called: the step decided already)."""
    cfg = _cfg(tmp_path, precision, accum)
    cfg = RunConfig(**{**vars(cfg), "monitor": type(cfg.monitor)(
        **{**vars(cfg.monitor), "underflow_every": 1})})
    with counted() as steps:
        train(cfg, sinks=[steps])
    taken = steps.taken()
    assert len(taken) >= 5
    assert set(taken) == {OUR_LOOP}, steps.where
    assert set(steps.taken("scaler")) == {0}, steps.where
    # fp16 overflows now and then: a skipped step also names the bad parameter (one read)
    # and backs the scale off; never more than three
    assert all(s["ours"] + s["scaler"] <= 3 for s in steps.steps), steps.where


def test_value_clipping_reads_once_more(tmp_path: Path) -> None:
    """``clip.method=value`` decides finiteness before it clamps (inf would become a finite
    bound): one more read, as measure's docstring says."""
    cfg = _cfg(tmp_path, "fp32", 1, clip=ClipConfig(enabled=True, method="value",
                                                    clip_value=0.05))
    with counted() as steps:
        train(cfg, sinks=[steps])
    assert steps.per_step("ours") == OUR_LOOP + 1, steps.where


def _lightning(tmp: Path, steps: StepBoundaries, accum: int) -> None:
    pytest.importorskip("lightning.pytorch")
    from tests.integrations.test_lightning import _cfg as lcfg
    from tests.integrations.test_lightning import fit_lightning

    fit_lightning(lcfg(tmp, "fp32", accum), tmp / "pl", sinks=(steps,))


def _hf(tmp: Path, steps: StepBoundaries, accum: int) -> None:
    pytest.importorskip("transformers")
    from tests.integrations.test_hf import _cfg as hcfg
    from tests.integrations.test_hf import fit_hf

    cfg = hcfg(tmp)
    cfg = RunConfig(**{**vars(cfg), "train": TrainConfig(**{**vars(cfg.train),
                                                             "accum_steps": accum})})
    fit_hf(cfg, tmp / "hf", sinks=(steps,))


# (route, accumulation) -> reads of ours per step: the callback's record needs the norm and
# the loss on the host (one read each); the trainer stepped already, nothing waits on them.
CALLBACKS = {("lightning", 1): 2, ("lightning", 2): 2, ("hf", 1): 2, ("hf", 2): 2}


@pytest.mark.parametrize(("route", "accum"), sorted(CALLBACKS))
def test_trainer_callbacks_read_twice_per_step(tmp_path: Path, route: str,
                                               accum: int) -> None:
    """The Lightning and HF callbacks (norm clip on: the trainer's norm is the record's)."""
    with counted(warmup=2) as steps:
        (_lightning if route == "lightning" else _hf)(tmp_path, steps, accum)
    assert len(steps.steps) >= 4
    assert steps.per_step("ours") == CALLBACKS[route, accum], steps.where


def test_track_reads_once_per_step(tmp_path: Path) -> None:
    """``stability.track``'s ``run.step`` on a plain loop: the norms and the loss, one read."""
    from stability.core.config import TrackingConfig
    from stability.integrations.track import track
    from stability.tasks.sign_sum import SignSumTask

    task = SignSumTask(data={"num_samples": SAMPLES})
    train_set, _ = task.train_val()
    torch.manual_seed(0)
    model = task.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    where = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with HostReads() as reads, track(tmp_path / "run", task="stability.tasks.sign_sum.SignSumTask",
                                     sweep_id="reads", tracking=where,
                                     clip=ClipConfig(enabled=True, max_norm=1.0)) as run:
        steps = StepBoundaries(reads)
        for _ in range(2):
            for x, y in torch.utils.data.DataLoader(train_set, batch_size=BATCH):
                opt.zero_grad()
                loss = task.loss(model(x), y)
                loss.backward()
                log = run.step(model, loss, lr=0.05, samples=len(y))
                if not log.skipped:
                    opt.step()
                steps.on_step(log)
            run.epoch(0.5)
            steps.on_epoch(None)
    assert steps.per_step("ours") == 1, steps.where


def test_ddp_step_reads_twice_whatever_the_accumulation() -> None:
    """A DDP step (one rank, gloo): the ranks' agreement before the all-reducing backward
    (the non-finite flag rides in it) and ``measure``'s read; none per micro-batch."""
    import torch.distributed as dist
    from torch import nn

    from stability.core.step import TrainStep
    from stability.tasks.sign_sum import ModelConfig, SequenceClassifier

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(SequenceClassifier(ModelConfig(hidden_size=8)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ts = TrainStep(model, opt, nn.BCEWithLogitsLoss(), precision=PrecisionConfig("fp32"),
                       clip=ClipConfig(enabled=True, max_norm=1.0), accum_steps=4)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(16, 12, 1, generator=g)
        window = [(x, (x.sum(dim=(1, 2)) > 0).float())] * 4
        ts.step(window)
        with HostReads() as reads:
            for _ in range(3):
                ts.step(window)
        ours = sum(n for (origin, _, _), n in reads.counts.items() if origin == "ours")
        assert ours == 3 * 2, reads.counts
    finally:
        dist.destroy_process_group()


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("accum", [1, 4])
def test_on_cuda_one_sync_per_step(tmp_path: Path, precision: str, accum: int) -> None:
    """On a GPU: one read of a CUDA tensor per step, and the rest of the step runs under
    ``set_sync_debug_mode("error")`` (any other sync raises)."""
    from benchmarks.host_reads import SyncDebug

    cfg = _cfg(tmp_path, precision, accum)
    cfg = RunConfig(**{**vars(cfg), "device": "cuda"})
    per_epoch = SAMPLES * 7 // 10 // BATCH // accum  # 28 or 7 steps: epoch 2, inside it
    with counted(device="cuda") as steps:
        guard = SyncDebug(steps, first=per_epoch + 2, last=2 * per_epoch - 1)
        train(cfg, sinks=[guard])
    assert guard.checked >= 4
    assert set(steps.taken()) == {OUR_LOOP}, steps.where
    assert set(steps.taken("scaler")) == {0}, steps.where


def test_counting_leaves_tensors_as_they_were() -> None:
    """Entering and leaving ``HostReads`` puts torch's methods back (inherited again)."""
    before = {n: torch.Tensor.__dict__.get(n) for n in ("item", "tolist", "__bool__")}
    with warnings.catch_warnings(), HostReads() as reads:
        t = torch.tensor([1.5])
        assert t.item() == 1.5 and bool(t) and t.tolist() == [1.5]
    assert sum(reads.counts.values()) == 3
    assert {n: torch.Tensor.__dict__.get(n) for n in before} == before


# Run in a fresh interpreter whose torch (its site-packages) and checkout both import through a
# folder named ``stability``, as ``git clone`` names the clone (and make setup its .venv in it).
_IN_A_FOLDER_NAMED_STABILITY = textwrap.dedent("""
    import json, site, sys
    home, out = sys.argv[1], sys.argv[2]
    site.addsitedir(home + "/site-packages")  # -S: no other site-packages on the path
    sys.path.insert(0, home + "/checkout")
    import benchmarks, stability, torch
    from benchmarks.host_reads import counted
    from stability.check.raised import where_raised
    from stability.core.config import PrecisionConfig, RunConfig, TrainConfig
    from stability.core.loop import train
    from stability.tasks.sign_sum import DataConfig
    sys.path.insert(0, home)
    import users_task
    try:
        users_task.raise_here()
    except ValueError as err:
        raised = where_raised(err)
    cfg = RunConfig(seed=0, device="cpu", output_dir=out, data=DataConfig(num_samples=640),
                    precision=PrecisionConfig("fp32"),
                    train=TrainConfig(epochs=2, batch_size=16, accum_steps=1))
    with counted() as steps:
        train(cfg, sinks=[steps])
    print(json.dumps({"files": [m.__file__ for m in (benchmarks, stability, torch)],
                      "ours": steps.taken(), "optimizer": steps.taken("optimizer"),
                      "raised": raised}))
""")


def test_origin_by_module_in_a_folder_named_stability(tmp_path: Path) -> None:
    """Torch imported from ``.../stability/site-packages`` (a clone's ``.venv`` in a folder
    named ``stability``) and the checkout from ``.../stability/checkout``: AdamW's step
    counters still count as the optimizer's, our loop's one read as ours, and a user's file in
    that folder is the user's (``check.raised``), by the resolved file of each package. A
    check by the substring ``/stability/`` of the path counts torch's reads as ours here,
    whatever the CI clone's own folder is named."""
    home = tmp_path / "stability"
    home.mkdir()
    (home / "site-packages").symlink_to(Path(sysconfig.get_paths()["purelib"]).resolve())
    (home / "checkout").symlink_to(ROOT)
    (home / "users_task.py").write_text("def raise_here():\n    raise ValueError('bad')\n")
    proc = subprocess.run([sys.executable, "-S", "-c", _IN_A_FOLDER_NAMED_STABILITY, str(home),
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # the modules did import through the folder named stability (else the test proves nothing)
    assert all(Path(f).is_relative_to(home) for f in got["files"]), got["files"]
    assert len(got["ours"]) >= 5 and set(got["ours"]) == {OUR_LOOP}, got
    assert min(got["optimizer"]) >= 1, got  # AdamW's step counters: torch's, not ours
    assert got["raised"] == "raise_here (users_task.py:2)", got
