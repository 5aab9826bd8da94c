"""Sweeps: the grid, de-duplication, launchers, resume, failures and what lands in MLflow.

The end-to-end tests run ``experiments/sweep.py -m`` as a subprocess against the real
``mlflow server`` fixture; the grid tests drive the real sweeper on the real ``conf/``.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import joblib
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.types import HydraContext, RunMode
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf, open_dict

from stability.core.config import (
    ClipConfig,
    ConfigError,
    PrecisionConfig,
    RunConfig,
    to_run_config,
)
from stability.sweep.display import Display
from stability.sweep.eta import Eta
from stability.sweep.grid import SweepPoint, chunks, dedupe, make_point
from stability.sweep.progress import Progress, format_duration
from stability.sweep.strategy_base import (
    FINISHED,
    GridStrategy,
    PointResult,
    Strategy,
    with_override,
)
from stability.sweep.strategy_registry import load_strategy
from stability.sweep.sweeper import StabilitySweeper
from stability.tracking.contract import STEP_METRICS
from stability.tracking.server import free_port
from tests.helpers.in_process import in_process
from tests.helpers.stores import sqlite_store

PROJECT = Path(__file__).resolve().parents[2]
TINY = ["+sweep=smoke", "device=cpu"]  # 300 samples, 2 epochs


def sweep(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """``python experiments/sweep.py -m ARGS`` from the project root, no inherited store."""
    return subprocess.run([sys.executable, "experiments/sweep.py", "-m", *args], cwd=PROJECT,
                          capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"MLFLOW_TRACKING_URI": ""})


def runs_of(uri: str, experiment: str, kind: str = "train") -> list:
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment} missing"
    return c.search_runs([exp.experiment_id], filter_string=f"tags.`stability.kind` = '{kind}'",
                         max_results=1000)


def in_process_sweeper(args: list[str]) -> StabilitySweeper:
    """The real sweeper on the real conf/, set up as Hydra does for ``-m ARGS``."""
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(PROJECT / "conf")))
    config = loader.load_configuration("config", overrides=args, run_mode=RunMode.MULTIRUN)
    params = OmegaConf.to_container(config.hydra.sweeper, resolve=True)
    params.pop("_target_")
    sweeper = StabilitySweeper(**params)
    sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=None)
    sweeper.config = config
    return sweeper


# --- the grid -----------------------------------------------------------------------------

def test_clip_off_points_run_once_without_irrelevant_overrides() -> None:
    points = []
    for enabled in (False, True):
        for max_norm in (1.0, 5.0):
            for seed in (0, 1):
                cfg = RunConfig(seed=seed, clip=ClipConfig(enabled=enabled, max_norm=max_norm))
                points.append(make_point([f"clip.enabled={enabled}", f"clip.max_norm={max_norm}",
                                          "precision=fp32", f"seed={seed}"], cfg))
    unique = dedupe(points)
    assert len(points) == 8 and len(unique) == 6
    off = [p for p in unique if not p.cfg.clip.enabled]
    assert [p.cfg.seed for p in off] == [0, 1]
    assert all(not any(o.startswith("clip.max_norm") for o in p.overrides) for p in off)
    on = [p for p in unique if p.cfg.clip.enabled]
    assert sorted((p.cfg.clip.max_norm, p.cfg.seed) for p in on) == [
        (1.0, 0), (1.0, 1), (5.0, 0), (5.0, 1)]
    assert all("clip.max_norm=" in " ".join(p.overrides) for p in on)


def test_gradscaler_knobs_only_distinguish_fp16_points() -> None:
    def point(name: str, growth: int) -> object:
        cfg = RunConfig(precision=PrecisionConfig(name,
                                                  growth_interval=growth))
        return make_point([f"precision={name}", f"precision.growth_interval={growth}"], cfg)

    assert len(dedupe([point("bf16", 100), point("bf16", 2000)])) == 1
    assert len(dedupe([point("fp16", 100), point("fp16", 2000)])) == 2
    assert point("bf16", 100).overrides == ("precision=bf16",)


def test_chunks_split_points_into_batches_of_at_most_size() -> None:
    pts = dedupe([make_point([f"seed={s}"], RunConfig(seed=s)) for s in range(5)])
    assert [len(b) for b in chunks(pts, 2)] == [2, 2, 1]
    assert [len(b) for b in chunks(pts, 0)] == [5]


def test_format_duration() -> None:
    assert format_duration(3725) == "1h02m05s" and format_duration(65) == "1m05s"
    assert format_duration(7.4) == "7s"


def progress(total: int = 4, skipped: int = 0) -> tuple[Progress, list[float]]:
    now = [100.0]
    kinds = [("t", "fp32", 1)] * total
    labels = [f"fp32 clip={i % 2 + 1} acc=1 s={i // 2}" for i in range(total)]
    configs = [label.rsplit(" s=", 1)[0] for label in labels]
    return Progress(labels, configs, Eta(kinds, [1.0] * total, workers=2), skipped,
                    clock=lambda: now[0]), now


def test_progress_counts_runs_and_names_the_best_config_and_the_last_run() -> None:
    p, now = progress(skipped=3)
    assert p.line().startswith("runs 0/4 done, 0 running, 0 failed, 3 skipped; 0s elapsed, "
                               "ETA unknown; lowest mean so far: none yet")
    p.start(0)
    p.start(1)
    now[0] = 110.0
    p.end(0, 0.5)  # fp32 clip=1 acc=1 s=0
    p.end(1, math.inf)  # diverged
    p.start(2)
    now[0] = 120.0
    p.end(2, 0.7)  # fp32 clip=1 acc=1 s=1: that config's mean is 0.6 now
    assert p.line() == ("runs 2/4 done, 0 running, 1 failed, 3 skipped; 20s elapsed, ETA 10s; "
                        "lowest mean so far: fp32 clip=1 acc=1 (val loss 0.6000, 2 seeds); "
                        "last: fp32 clip=1 acc=1 s=1: best val loss 0.7000")
    p.start(3)
    assert p.running == 1
    p.end(3, None)
    assert p.eta_s() == 0.0 and "last: fp32 clip=2 acc=1 s=1: not finished" in p.line()


def test_plain_status_lines_come_at_most_every_n_seconds_and_once_at_the_end() -> None:
    p, now = progress(total=6)
    out = io.StringIO()  # not a terminal: plain lines
    with Display(p, "sweep-1", "auto", every_s=3600, stream=out) as display:
        assert not display.live
        for i in range(6):
            display.start(i, now[0])
            now[0] += 10
            display.end(i, 0.5)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first run's end, then the end of the sweep
    assert lines[0].startswith("[sweep] runs 1/6 done") and "runs 6/6 done" in lines[1]
    out = io.StringIO()
    with Display(progress(total=3)[0], "sweep-2", "plain", every_s=0, stream=out) as display:
        for i in range(3):
            display.end(i, 0.5)
    assert len(out.getvalue().splitlines()) == 3  # every_s=0: one a run, none repeated


def test_live_status_draws_the_area_and_leaves_its_last_frame() -> None:
    p, now = progress(total=2)
    out = io.StringIO()
    with Display(p, "sweep-3", "live", stream=out) as display:
        display.start(0, now[0])
        display.end(0, 0.25)
        print("a line printed meanwhile")  # goes above the area, not through it
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the terminal's escapes
    assert "sweep sweep-3" in text and "runs          1/2 done, 0 running, 0 failed" in text
    assert "a line printed meanwhile" in text
    assert text.rstrip().endswith("last          fp32 clip=1 acc=1 s=0: best val loss 0.2500")
    assert "lowest mean   fp32 clip=1 acc=1 (val loss 0.2500, 1 seed)" in text  # never "best"


def test_default_study_grid_and_dedup() -> None:
    """The conf/ default: clip x >=3 max_norm x accum 1,2,4,8 x 3 precisions x seeds 0-4."""
    s = in_process_sweeper([])
    size, points = s.plan([])
    grid = s.grid
    norms = grid["clip.max_norm"].split(",")
    assert grid["clip.enabled"] == "false,true" and len(norms) >= 3
    assert grid["train.accum_steps"] == "1,2,4,8"
    assert grid["precision"] == "fp32,fp16,bf16" and grid["seed"] == "0,1,2,3,4"
    assert size == 2 * len(norms) * 4 * 3 * 5
    assert len(points) == (1 + len(norms)) * 4 * 3 * 5
    assert Counter(p.cfg.clip.enabled for p in points)[False] == 4 * 3 * 5
    assert len({p.key for p in points}) == len(points)
    assert {p.cfg.precision.name for p in points} == {"fp32", "fp16", "bf16"}
    assert s.config.hydra.launcher.n_jobs == -1  # joblib, one run per core
    assert s.batch_size() == joblib.cpu_count()  # one batch fills every worker once


def test_smoke_preset_is_a_tiny_grid() -> None:
    s = in_process_sweeper(["+sweep=smoke"])
    size, points = s.plan(["+sweep=smoke"])
    assert (size, len(points)) == (16, 12)
    assert {p.cfg.data.num_samples for p in points} == {300}
    assert {p.cfg.train.epochs for p in points} == {2}
    assert {p.cfg.tracking.experiment for p in points} == {"smoke"}


def test_fast_composition_matches_hydra() -> None:
    """The sweeper's cached composition gives exactly what Hydra composes for each job."""
    args = ["+sweep=smoke", "precision=fp16,bf16", "precision.growth_interval=7,100",
            "train.lr=0.01"]
    s = in_process_sweeper(args)
    _, points = s.plan(args)
    assert len(points) == 2 * 3 * 2 + 2 * 3  # bf16 ignores growth_interval
    for p in points:
        cfg = s.hydra_context.config_loader.load_sweep_config(s.config, list(p.overrides))
        with open_dict(cfg):
            del cfg["hydra"]
            cfg.output_dir = "."
        assert to_run_config(OmegaConf.to_container(cfg, resolve=True)) == p.cfg


# --- end to end ---------------------------------------------------------------------------

GRID = ["clip.enabled=false,true", "clip.max_norm=1.0,5.0", "train.accum_steps=1,2",
        "precision=fp32", "seed=0",  # one seed: de-duplication and resume are per point
        # 300 samples, batch 64: 4 micro-batches an epoch, so accum 1 takes 8 optimizer steps
        # and reaches the inf gradient at step 5 (then aborts: any skip is too many); accum 2
        # takes 4 steps and finishes.
        "fault.inf_grad_at_step=5", "monitor.max_skip_rate=0", "monitor.abort_after=1"]


@pytest.mark.slow
@pytest.mark.server
def test_sweep_lands_in_mlflow_and_resumes(mlflow_server, tmp_path: Path) -> None:
    uri, exp = mlflow_server.uri, f"sweep-{uuid.uuid4().hex[:8]}"
    args = [*TINY, *GRID, f"tracking.uri={uri}", f"tracking.experiment={exp}"]
    first = sweep([*args, f"hydra.sweep.dir={tmp_path / 'one'}"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "grid: 8 points, 6 after de-duplication" in first.stdout
    assert "skipped 0 points already FINISHED" in first.stdout
    assert "runs 3/6 done, 0 running, 3 failed, 0 skipped" in first.stdout

    c = MlflowClient(uri)
    (parent,) = runs_of(uri, exp, "sweep")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["stability.grid_size"] == "8"
    assert parent.data.tags["stability.grid_unique"] == "6"
    assert parent.data.metrics["runs_launched"] == 6
    assert parent.data.metrics["runs_finished"] == 3
    assert parent.data.metrics["runs_diverged"] == 3
    assert parent.data.params["grid.seed"] == "0"
    assert parent.data.params["grid.clip.max_norm"] == "1.0,5.0"
    runs = runs_of(uri, exp)
    assert len(runs) == 6
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    assert {r.data.tags["stability.sweep_id"] for r in runs} == {
        parent.data.tags["stability.sweep_id"]}
    names = Counter(r.info.run_name for r in runs)
    assert names["fp32 noclip acc=1 s=0"] == names["fp32 clip=5 acc=2 s=0"] == 1
    assert sum(n.count("noclip") for n in names) == 2  # once per accum, not per max_norm

    for r in runs:
        acc = int(r.data.params["train.accum_steps"])
        assert r.data.params["data.num_samples"] == "300"
        assert r.data.params["clip.enabled"] == str(" noclip " not in f" {r.info.run_name} ")
        assert "tracking" not in r.data.tags["stability.overrides"]
        if acc == 1:  # the injected inf gradient at step 5 aborts these
            assert r.info.status == "FAILED"
            assert r.data.tags["stability.outcome"] == "diverged"
            assert "monitor.max_skip_rate" in r.data.tags["stability.reason"]
        else:
            assert r.info.status == "FINISHED"
            assert r.data.tags["stability.outcome"] == "finished"
        steps = int(r.data.metrics["optimizer_steps"])
        assert steps == (5 if acc == 1 else 4)
        arts = {a.path for a in c.list_artifacts(r.info.run_id)}
        assert {"steps.csv", "config.yaml", "checkpoints"} <= arts
        local = c.download_artifacts(r.info.run_id, "steps.csv", str(tmp_path / r.info.run_id))
        csv_text = Path(local).read_text()
        assert len(list(csv.DictReader(io.StringIO(csv_text)))) == steps
        for key in STEP_METRICS:
            history = c.get_metric_history(r.info.run_id, key)
            assert sorted(m.step for m in history) == list(range(1, steps + 1)), key

    # Same sweep again: the finished points are skipped, the diverged ones run again.
    second = sweep([*args, "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path / 'two'}"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "skipped 3 points already FINISHED" in second.stdout
    assert "runs 0/3 done, 0 running, 3 failed, 3 skipped" in second.stdout
    runs = runs_of(uri, exp)
    assert len(runs) == 9
    assert Counter(r.data.tags["stability.outcome"] for r in runs) == {"finished": 3,
                                                                       "diverged": 6}
    parents = runs_of(uri, exp, "sweep")
    assert sorted(p.data.metrics["runs_skipped_done"] for p in parents) == [0, 3]
    # hydra/launcher=basic runs one job at a time: the rerun's runs never overlap.
    rerun = sorted((r.info.start_time, r.info.end_time) for r in runs
                   if r.data.tags["stability.sweep_id"] != parent.data.tags["stability.sweep_id"])
    assert all(end <= nxt for (_, end), (nxt, _) in zip(rerun, rerun[1:], strict=False))


@pytest.mark.slow
@pytest.mark.server
def test_submitit_local_launcher(mlflow_server, tmp_path: Path) -> None:
    uri, exp = mlflow_server.uri, f"submitit-{uuid.uuid4().hex[:8]}"
    done = sweep([*TINY, "hydra/launcher=submitit_local", "clip.enabled=false",
                  "train.accum_steps=1", "precision=fp32", "seed=0,1", f"tracking.uri={uri}",
                  f"tracking.experiment={exp}", f"hydra.sweep.dir={tmp_path}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runs 2/2 done," in done.stdout
    (parent,) = runs_of(uri, exp, "sweep")
    runs = runs_of(uri, exp)
    assert sorted(r.info.run_name for r in runs) == ["fp32 noclip acc=1 s=0",
                                                     "fp32 noclip acc=1 s=1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    assert list(tmp_path.glob(".submitit/*/*_result.pkl"))  # really went through submitit


@pytest.mark.slow  # the product's bounded retries of the dead port
def test_unreachable_server_fails_before_any_job(tmp_path: Path, monkeypatch, capsys) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.chdir(PROJECT)
    done = in_process(["sweep", "-m", *TINY, "seed=0,1", f"tracking.uri={uri}",
                       f"hydra.sweep.dir={tmp_path}"], capsys)
    assert done.code == 1, done.stderr[-2000:]  # the docs' exit status for the environment
    assert f"error: tracking server {uri} is not reachable" in done.stderr
    assert "Traceback" not in done.stderr
    assert "Launching" not in done.stdout + done.stderr
    assert not list(tmp_path.glob("*/steps.csv"))


def test_bad_grid_value_fails_before_any_job(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(PROJECT)
    done = in_process(["sweep", "-m", *TINY, "train.accum_steps=1,0", "tracking.enabled=false",
                       f"hydra.sweep.dir={tmp_path}"], capsys)
    assert done.code == 2
    assert "error: train.accum_steps=0 is invalid: allowed values are an integer >= 1" in (
        done.stderr)
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*/steps.csv"))


@pytest.mark.slow
@pytest.mark.server
def test_sigterm_stops_the_sweep_and_closes_every_run(mlflow_server, tmp_path: Path) -> None:
    """SIGTERM to the sweeper alone: forwarded to the joblib workers, nothing left RUNNING."""
    uri, exp = mlflow_server.uri, f"sigterm-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "experiments/sweep.py", "-m", *TINY, "train.epochs=500",
           "clip.enabled=false", "train.accum_steps=1", "precision=fp32", "seed=0,1,2,3",
           "hydra.launcher.n_jobs=2", f"tracking.uri={uri}", f"tracking.experiment={exp}",
           f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.Popen(cmd, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=os.environ | {"MLFLOW_TRACKING_URI": ""})
    csvs = [tmp_path / "0" / "steps.csv", tmp_path / "1" / "steps.csv"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if all(p.exists() and len(p.read_text().splitlines()) > 20 for p in csvs):
            break
        time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output.split("SIGTERM: running jobs")[-1]

    (parent,) = runs_of(uri, exp, "sweep")
    assert parent.info.status == "KILLED"
    assert parent.data.metrics["runs_launched"] == 2  # the second batch never started
    runs = runs_of(uri, exp)
    assert len(runs) == 2
    c = MlflowClient(uri)
    for r in runs:
        assert r.info.status == "KILLED"
        assert r.data.tags["stability.outcome"] == "killed"
        local = c.download_artifacts(r.info.run_id, "steps.csv", str(tmp_path / r.info.run_id))
        rows = list(csv.DictReader(io.StringIO(Path(local).read_text())))
        assert [int(x["step"]) for x in rows] == list(range(1, len(rows) + 1))
        assert len(rows) > 20


# --- the strategy seam ----------------------------------------------------------------------

class AddOneSeed(GridStrategy):
    """Round 1: the grid; round 2: seed 7 of the first point that finished; then done.

    What each ``next`` call received is kept in ``ROUNDS`` (the sweeper builds the instance).
    """

    ROUNDS: list[list[PointResult]] = []

    def next(self, results: Sequence[PointResult]) -> list[SweepPoint] | None:
        AddOneSeed.ROUNDS.append(list(results))
        if len(AddOneSeed.ROUNDS) > 1:
            return None
        first = next(r for r in results if r.status == FINISHED)
        assert self.make is not None
        return [self.make(with_override(first.point.overrides, "seed", 7))]


def test_grid_strategy_is_the_whole_grid_in_one_round() -> None:
    pts = dedupe([make_point([f"seed={s}"], RunConfig(seed=s)) for s in range(3)])
    grid = GridStrategy(pts)
    assert isinstance(grid, Strategy)
    assert [p.key for p in grid.initial()] == [p.key for p in pts]
    assert grid.next([PointResult(p, FINISHED, 0.5) for p in pts]) is None
    assert load_strategy(None) is GridStrategy and load_strategy("grid") is GridStrategy
    assert load_strategy("tests.sweep.test_sweep.AddOneSeed") is AddOneSeed
    with pytest.raises(ConfigError, match=r"hydra.sweeper.strategy=no.such.Strategy is invalid: "
                                          r"allowed values are grid, adaptive, decide or an "
                                          r"importable class"):
        load_strategy("no.such.Strategy")


@pytest.mark.slow
def test_a_strategy_adds_a_second_round_to_the_same_sweep(tmp_path: Path, capsys,
                                                          monkeypatch) -> None:
    """A custom strategy drives a real sweep in-process; its second round's seed runs in it."""
    from hydra.core.global_hydra import GlobalHydra

    from stability import cli

    uri = sqlite_store(tmp_path / "mlflow.db")
    AddOneSeed.ROUNDS.clear()
    monkeypatch.setattr(sys, "argv", [
        "stability-sweep", "-m", *TINY, "hydra/launcher=basic", "clip.enabled=false",
        "train.accum_steps=2", "precision=fp32", "seed=0", f"tracking.uri={uri}",
        "tracking.experiment=rounds", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.sweeper.strategy=tests.sweep.test_sweep.AddOneSeed"])
    try:
        cli.sweep()
    finally:
        GlobalHydra.instance().clear()
    out = capsys.readouterr().out

    first, second = AddOneSeed.ROUNDS
    assert [(r.seed, r.status) for r in first] == [(0, FINISHED)]
    assert [(r.seed, r.status) for r in second] == [(7, FINISHED)]
    assert second[0].fingerprint == first[0].fingerprint  # the same config, another seed
    assert all(math.isfinite(r.best_val_loss) for r in (*first, *second))
    assert "[sweep] round 2: 1 more points to run" in out
    runs = runs_of(uri, "rounds")
    assert sorted(int(r.data.params["seed"]) for r in runs) == [0, 7]
    (parent,) = runs_of(uri, "rounds", "sweep")
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    assert {r.data.tags["stability.sweep_id"] for r in runs} == {
        parent.data.tags["stability.sweep_id"]}
    assert parent.data.metrics["runs_launched"] == 2 and parent.data.metrics["runs_unique"] == 2
    losses = {int(r.data.params["seed"]): r.data.metrics["best_val_loss"] for r in runs}
    assert losses == pytest.approx({0: first[0].best_val_loss, 7: second[0].best_val_loss})
