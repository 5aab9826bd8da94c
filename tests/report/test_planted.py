"""Issue 46: runs planted into the store by anyone who can write to it, against the report.

Each test writes a real sweep (``tests/helpers/report_fixtures.py``) into a SQLite store in a
temp folder, plants one thing through the MLflow client as a hostile teammate would, and runs
the real report path (``build_report``); nothing is mocked.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from stability.core.identity import fingerprint, flatten
from stability.report import ReportConfig, build_report
from stability.tracking.contract import Tag
from tests.helpers.report_fixtures import Spec, make_sweep, run_config
from tests.helpers.stores import sqlite_store

WINNER = Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41})
BASELINE = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52})


def planted_sweep(tmp_path: Path, name: str) -> tuple[str, MlflowClient, str, str]:
    """A real two-config sweep; ``(uri, client, experiment id, parent run id)``."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, name, name, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name(name).experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    return uri, c, exp_id, parent


def plant(c: MlflowClient, exp_id: str, parent: str, sweep: str, spec: Spec, seed: int,
          status: str, outcome: str, metrics: dict[str, float], user: str = "mallory") -> str:
    """A run with the contract's tags and params and only ``metrics``, ended ``status``."""
    cfg = run_config(spec, seed, Path("."))
    fp = fingerprint(cfg)
    rid = c.create_run(exp_id, tags={
        Tag.KIND: "train", Tag.SWEEP_ID: sweep, Tag.FINGERPRINT: fp, Tag.SEED: str(seed),
        Tag.OUTCOME: outcome, Tag.PARENT_RUN_ID: parent, "mlflow.user": user}).info.run_id
    ts = int(time.time() * 1000)
    params = [Param(k, str(v)) for k, v in flatten(cfg).items() if k != "output_dir"]
    for i in range(0, len(params), 100):
        c.log_batch(rid, params=params[i:i + 100])
    c.log_batch(rid, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()])
    c.set_terminated(rid, status=status)
    return rid


def report(uri: str, sweep: str, out: Path) -> tuple[object, str]:
    """The real report of ``sweep``; ``(result, report.md)``."""
    result = build_report(ReportConfig(tracking_uri=uri, experiment=sweep, sweep_id=sweep,
                                       output_dir=str(out), device="cpu", register=False,
                                       plots=False))
    return result, (out / sweep / "report.md").read_text()


@pytest.mark.slow
def test_a_killed_run_tagged_finished_is_killed_not_the_winner(tmp_path: Path) -> None:
    """Item 4: a KILLED run tagged ``stability.outcome=finished`` with best_val_loss 0.0001
    and no artifacts won (and was tested on 0 sequences). Its status decides: killed."""
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p4")
    other = Spec(precision="fp16", clip=5.0, accum=1, losses={0: 0.0001})
    plant(c, exp_id, parent, "p4", other, 0, "KILLED", "finished",
                {"best_val_loss": 0.0001, "best_epoch": 2.0})
    result, text = report(uri, "p4", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert "0 sequences" not in text
    from stability.report.evidence.fetch import outcome_of
    assert outcome_of("finished", "KILLED") == "killed"
    assert outcome_of("diverged", "FAILED") == "diverged"
    assert outcome_of("finished", "FAILED") == "failed"
    assert outcome_of("nonsense", "FINISHED") == "finished"  # then its artifacts are checked
    assert outcome_of(None, "RUNNING") == "running"


def recorded_sweep(tmp_path: Path, name: str) -> tuple[str, MlflowClient, str, str, dict]:
    """``planted_sweep`` whose parent records its points and runs as a real sweep does."""
    from stability.tracking import children

    uri = sqlite_store(tmp_path / "mlflow.db")
    ids = make_sweep(uri, name, name, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name(name).experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    children.write(c, parent, ids.keys(), ids.values())
    return uri, c, exp_id, parent, ids


@pytest.mark.slow
def test_a_failed_run_of_a_seed_the_sweep_never_planned_vetoes_nothing(tmp_path: Path) -> None:
    """Item 5: one planted FAILED run with the winner's fingerprint and a new seed counted as
    an infinite loss and vetoed the winner ("missing seeds 2"). Now it is set aside, named."""
    uri, c, exp_id, parent, _ = recorded_sweep(tmp_path, "p5")
    rid = plant(c, exp_id, parent, "p5", WINNER, 2, "FAILED", "failed", {})
    result, text = report(uri, "p5", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert "missing seeds 2" not in text
    fp = fingerprint(run_config(WINNER, 2, tmp_path))
    assert (f"run {rid} (config {fp}, seed 2, created by mallory) set aside: "
            "the sweep never planned this seed of this config") in text


@pytest.mark.slow
def test_a_forged_copy_of_real_runs_is_set_aside_and_its_creator_named(tmp_path: Path) -> None:
    """Item 3: two real runs re-logged under new run ids with a lower best_val_loss (its
    val_loss history to match, config.yaml and steps.csv copied, best.pt altered) became the
    winner; the only trace was "2 superseded runs ignored". Now the sweep's record decides."""
    import torch

    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "p3")
    forged = []
    for seed in (0, 1):
        real = c.get_run(ids[(fingerprint(run_config(BASELINE, seed, tmp_path)), seed)])
        files = Path(c.download_artifacts(real.info.run_id, "", str(tmp_path / f"dl{seed}")))
        state = torch.load(files / "checkpoints" / "best.pt", weights_only=True)
        torch.save({k: v + 0.01 for k, v in state.items()}, files / "checkpoints" / "best.pt")
        rid = c.create_run(exp_id, tags={**real.data.tags, "mlflow.user": "mallory"},
                           run_name=real.info.run_name).info.run_id
        ts = int(time.time() * 1000)
        metrics = {**real.data.metrics, "best_val_loss": 0.01}
        c.log_batch(rid, metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()]
                    + [Metric("val_loss", v, ts, e) for e, v in ((1, 0.05), (2, 0.01))],
                    params=[Param(k, v) for k, v in real.data.params.items()][:100])
        c.log_batch(rid, params=[Param(k, v) for k, v in real.data.params.items()][100:])
        for name in ("config.yaml", "steps.csv"):
            c.log_artifact(rid, str(files / name))
        c.log_artifact(rid, str(files / "checkpoints" / "best.pt"), "checkpoints")
        c.set_terminated(rid)
        forged.append(rid)
    result, text = report(uri, "p3", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert "superseded" not in text
    for seed, rid in enumerate(forged):
        fp = fingerprint(run_config(BASELINE, seed, tmp_path))
        assert (f"run {rid} (config {fp}, seed {seed}, created by mallory) "
                "set aside: not a run the sweep's jobs created (its own run of this point "
                "stands)") in text


@pytest.mark.slow
def test_a_sweep_records_the_points_it_planned_and_the_runs_its_jobs_created(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Items 3 and 5: the real ``stability sweep`` writes ``sweep_runs.json`` on its parent."""
    from stability.tracking import children
    from tests.helpers.in_process import in_process

    uri = sqlite_store(tmp_path / "mlflow.db")
    done = in_process(["sweep", "-m", "data.num_samples=200", "device=cpu", "train.epochs=1",
                       "clip.enabled=false", "precision=fp32", "train.accum_steps=1",
                       "seed=0,1", "hydra/launcher=basic", f"tracking.uri={uri}",
                       "tracking.experiment=rec", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      capsys)
    assert done.code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("rec").experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    runs = c.search_runs([exp_id], "tags.`stability.kind` = 'train'")
    record = children.read(c, parent)
    assert record.launched == {r.info.run_id for r in runs}
    assert record.planned == {(r.data.tags[Tag.FINGERPRINT], int(r.data.tags[Tag.SEED]))
                              for r in runs}
    assert len(record.planned) == 2


@pytest.mark.slow
def test_a_diverged_run_with_a_thin_steps_csv_is_one_unreadable_run(tmp_path: Path) -> None:
    """Item 8: a diverged run's ``steps.csv`` of ``step,loss`` ended the report with
    ``KeyError: 'scaler_scale'`` (health.run_signs). Now that run is one line in Problems."""
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p8")
    other = Spec(precision="fp16", clip=5.0, accum=1, losses={0: "diverged"})
    rid = plant(c, exp_id, parent, "p8", other, 0, "FAILED", "diverged",
                {"best_val_loss": 0.05, "diverged": 1.0})
    thin = tmp_path / "thin" / "steps.csv"
    thin.parent.mkdir()
    thin.write_text("step,loss\n1,0.7\n")
    c.log_artifact(rid, str(thin))
    result, text = report(uri, "p8", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert (f"run {rid} is unreadable, left out of the stability verdicts: steps.csv has no "
            "column skipped, skip_reason, scaler_scale, clipped, grad_l2_pre_clip") in text


@pytest.mark.slow
def test_forty_planted_params_are_no_factors_and_their_runs_are_outside_the_grid(
        tmp_path: Path) -> None:
    """Item 9: forty extra params varying across two planted FAILED runs made forty factors
    (``ValueError: array is too big``, 2^40 cells). Now the factors are the sweep's own grid
    (its parent's ``grid.*`` params) and a run off the grid is set aside, one line each."""
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p9")
    c.log_batch(parent, params=[Param(f"grid.{k}", v) for k, v in {
        "precision": "fp32,bf16", "clip.enabled": "false,true", "clip.max_norm": "1.0",
        "train.accum_steps": "1,2", "seed": "0,1"}.items()])
    planted = []
    for seed in (0, 1):
        rid = plant(c, exp_id, parent, "p9", BASELINE, seed + 2, "FAILED", "failed", {})
        c.log_batch(rid, params=[Param(f"extra.k{i:02d}", str(seed + i)) for i in range(40)])
        planted.append(rid)
    result, text = report(uri, "p9", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    for seed, rid in enumerate(planted):
        assert (f"run {rid} set aside: not a point of the sweep's grid: param extra.k00="
                f"'{seed}' (and 39 more) is not swept and the sweep's runs have (absent)") in text
    assert "extra.k" not in text.replace("param extra.k00", "")


def alias_bomb(levels: int = 9) -> str:
    """A ~450-byte YAML document that a tree walk visits 10^levels times."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_a_yaml_alias_bomb_is_refused_before_any_walk(tmp_path: Path) -> None:
    """Item 6: a 450-byte config.yaml of nine levels of ten aliases hung the report
    (``trusted._interpolations`` walked it as a tree) and a resumed sweep (``Adoptable``).
    Now a recorded config with an anchor or alias is refused when it is read."""
    from stability.core.config import TrackingConfig
    from stability.sweep.parent import SweepSetup, open_sweep_run
    from stability.tracking.trusted import Untrusted, read_recorded

    bomb = tmp_path / "bomb" / "config.yaml"
    bomb.parent.mkdir()
    bomb.write_text(alias_bomb())
    assert len(bomb.read_bytes()) < 500
    with pytest.raises(Untrusted, match=r"YAML anchor or alias \(&/\*a0\) at line 1"):
        read_recorded(bomb)
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p6")
    rid = plant(c, exp_id, parent, "p6", Spec(precision="fp16", clip=5.0, accum=1,
                                              losses={0: 0.01}), 0, "FINISHED",
                "finished", {"best_val_loss": 0.01, "best_epoch": 2.0})
    c.log_artifact(rid, str(bomb))
    t0 = time.monotonic()
    result, text = report(uri, "p6", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert (f"run {rid} is unreadable, counted as not finished: unreadable run: its config.yaml "
            "is refused: config.yaml holds a YAML anchor or alias") in text
    fp = c.get_run(rid).data.tags[Tag.FINGERPRINT]
    setup = SweepSetup(sweep_id="again", grid_size=1, sweep_dir=tmp_path / "sweep")
    run, done = open_sweep_run(TrackingConfig(uri=uri, experiment="p6"), setup, 1, True)
    assert (fp, 0) not in done  # refused, not walked: the point runs again
    run.close("FINISHED", {})
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_memory_bombs_are_refused_by_their_declared_size(tmp_path: Path) -> None:
    """Item 7: a 50 MB steps.csv took the report to 5.4 GB (read whole, eight at a time); a
    0.97 MB DEFLATE-compressed best.pt inflated to 1 GB in torch.load before the shape check;
    char_lm at MAX_DATA_ELEMENTS would allocate ~35 GB building its data. Now each is refused
    by a size read before anything is loaded, one line for its run."""
    import resource
    import zipfile

    from stability.tracking.adoption import MAX_STEPS_BYTES
    from stability.tracking.trusted import MAX_DATA_ELEMENTS, Untrusted, trusted_config

    uri, c, exp_id, parent = planted_sweep(tmp_path, "p7")
    big = tmp_path / "big" / "steps.csv"
    big.parent.mkdir()
    row = "1,0.002,0.5,0.5,0.69,0,,1.0,1,0,1,64,0,nan,\n"
    with big.open("w") as f:
        f.write("step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason,"
                "scaler_scale,epoch,clipped,micro_batches,samples,skips_cumulative,"
                "underflow_frac,nonfinite_param\n")
        f.write(row * (MAX_STEPS_BYTES // len(row) + 1))
    finished = plant(c, exp_id, parent, "p7", Spec(precision="fp16", clip=5.0, accum=1,
                                                   losses={0: 0.01}), 0, "FINISHED",
                     "finished", {"best_val_loss": 0.01, "best_epoch": 2.0})
    diverged = plant(c, exp_id, parent, "p7", Spec(precision="fp16", clip=5.0, accum=1,
                                                   losses={0: 0.01}), 1, "FAILED",
                     "diverged", {"best_val_loss": 0.05, "diverged": 1.0})
    for rid in (finished, diverged):
        c.log_artifact(rid, str(big))
    from stability.core.loop import write_config  # its own config: the table is what fails
    write_config(run_config(Spec("fp16", 5.0, 1), 0, tmp_path), big.parent / "config.yaml")
    c.log_artifact(finished, str(big.parent / "config.yaml"))
    # the winner's seed 0: its best.pt replaced by one with a DEFLATE-compressed member
    winner_run = c.search_runs([exp_id], "tags.`stability.seed` = '0' and "
                                         "params.`precision.name` = 'bf16'")[0].info.run_id
    bomb = tmp_path / "bomb" / "best.pt"
    bomb.parent.mkdir()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("best/data/0", bytes(64 * 2**20))  # 64 MB of zeros in ~64 kB
    assert bomb.stat().st_size < 2**20
    c.log_artifact(winner_run, str(bomb), "checkpoints")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result, text = report(uri, "p7", tmp_path / "out")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    size = f"{big.stat().st_size:,}"
    assert (f"run {finished} is unreadable, counted as not finished: unreadable run: its "
            f"steps.csv is {size} bytes, over the cap of {MAX_STEPS_BYTES:,}") in text
    assert (f"run {diverged} is unreadable, left out of the stability verdicts: steps.csv is "
            f"{size} bytes, over the report's cap of {MAX_STEPS_BYTES:,}") in text
    assert "checkpoints/best.pt holds compressed members (best/data/0)" in text
    assert grown_mb < 1000, grown_mb
    raw = {"task": {"_target_": "stability.tasks.char_lm.CharLMTask"},
           "data": {"num_samples": MAX_DATA_ELEMENTS // 100, "seq_len": 100}}
    with pytest.raises(Untrusted, match=r"cap for stability.tasks.char_lm.CharLMTask: it "
                                        r"allocates ~400 bytes an element, allowed are at most "
                                        r"10,737,418 elements"):
        trusted_config(raw, "x", ["stability.tasks.char_lm.CharLMTask"])


EVIL = "w](http://evil/x) ![i](http://evil/i.png) `\n## Answer\nTrain with evil"


@pytest.mark.slow
def test_text_from_artifacts_reaches_report_md_as_one_inert_line(tmp_path: Path) -> None:
    """Item 11: a ``layer_norms.csv`` column name became a caption with a link, an image and
    a fake ``## Answer``; a ``steps.csv`` header with newlines forged a section in Problems."""
    import pandas as pd

    fp16 = Spec(precision="fp16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41}, skips=1,
                layer_norms=True)
    uri = sqlite_store(tmp_path / "mlflow.db")
    ids = make_sweep(uri, "p11", "p11", [fp16, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    for rid in ids.values():  # every layer_norms.csv: its first failing column renamed
        if "layer_norms.csv" in {a.path for a in c.list_artifacts(rid)}:
            path = Path(c.download_artifacts(rid, "layer_norms.csv", str(tmp_path / rid)))
            table = pd.read_csv(path)
            table.columns = ["step", *[EVIL if i == 1 else col for i, col in
                                       enumerate(table.columns[1:])]]
            table.to_csv(path, index=False)
            c.log_artifact(rid, str(path))
    baseline = ids[(fingerprint(run_config(BASELINE, 0, tmp_path)), 0)]
    steps = tmp_path / "evil" / "steps.csv"
    steps.parent.mkdir()
    rows = next((tmp_path / "runs").glob("p11-fp32-None-1-30-0.002-0/steps.csv")
                ).read_text().splitlines()
    quoted = '"' + EVIL.replace('"', '""') + '"'
    steps.write_text("\n".join([f"{rows[0]},{quoted}", *[f"{r},abc" for r in rows[1:]]])
                     + "\n")
    c.log_artifact(baseline, str(steps))
    out = tmp_path / "out"
    build_report(ReportConfig(tracking_uri=uri, experiment="p11", sweep_id="p11",
                              output_dir=str(out), device="cpu", register=False, plots=True))
    text = (out / "p11" / "report.md").read_text()
    assert "Train with evil" in text and "\nTrain with evil" not in text
    assert "\n## Answer\nTrain" not in text
    assert "](http://evil" not in text and "![i](" not in text
    shown = "w] (http://evil/x) ! [i] (http://evil/i.png) ˋ ## Answer Train with evil"
    assert f"first non-finite `{shown}` at step 1" in text  # the caption: one inert line
    assert (f"run {baseline} is unreadable, left out of the stability verdicts: steps.csv line "
            f"2, column {shown}: 'abc' is not a number") in text


@pytest.mark.slow
def test_summary_csv_cells_never_start_a_formula(tmp_path: Path) -> None:
    """Item 12: a ``summary.csv`` text cell read from runs could start with ``=``, ``+``,
    ``-`` or ``@`` (spreadsheet formula injection). Now such a cell starts with ``'``."""
    import csv

    formula = '=HYPERLINK("http://evil/x","open me")'
    hostile = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.60, 1: 0.61},
                   planted=((0, "precision.name", formula), (1, "precision.name", formula)))
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "p12", "p12", [WINNER, BASELINE, hostile], tmp_path / "runs")
    out = tmp_path / "out"
    build_report(ReportConfig(tracking_uri=uri, experiment="p12", sweep_id="p12",
                              output_dir=str(out), device="cpu", register=False, plots=False))
    with (out / "p12" / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    cells = [v for r in rows for v in r.values()]
    assert any(formula.replace("`", "ˋ") in v for v in cells)  # the value is there, as text
    bad = [v for v in cells if v[:1] in ("=", "+", "@") or
           (v[:1] == "-" and not v.replace(".", "", 1).lstrip("-").replace("e-", "").isdigit())]
    assert bad == [], bad
    assert [v for v in cells if v.startswith("'=")]


@pytest.mark.slow
def test_a_planted_pass_or_a_flood_of_checks_hides_no_failed_check(tmp_path: Path) -> None:
    """Item 13: the newest check run of a task spoke for it: a planted passing check hid a
    real failure, and a flood of check runs pushed it out of the 200 searched. Now only the
    sweep's own user's check runs count, its failures are searched on their own, and the
    newest failure within a week of the task's newest check wins over a pass."""
    uri, c, exp_id, parent = planted_sweep(tmp_path, "p13")
    train = c.search_runs([exp_id], "tags.`stability.kind` = 'train'")[0]
    task = [Param(k, v) for k, v in train.data.params.items() if k.startswith("task.")]
    now = int(time.time() * 1000)

    def check(outcome: str, start: int, user: str | None = None) -> str:
        tags = {Tag.KIND: "check", "stability.check_outcome": outcome}
        rid = c.create_run(exp_id, start_time=start, tags=tags | (
            {"mlflow.user": user} if user else {})).info.run_id
        c.log_batch(rid, params=[*task, Param("check.accumulation.full", outcome)],
                    metrics=[Metric("check.accumulation.full", 0.5, start, 0)])
        return rid

    real = check("fail", now - 3_600_000)  # the sweep's user (MLflow records 'unknown')
    check("pass", now - 60_000, user="mallory")  # another user's pass: not the sweep's
    check("pass", now - 30_000)  # a pass right after the failure does not hide it
    for i in range(201):  # a flood of the sweep's user's passes
        rid = c.create_run(exp_id, start_time=now - 20_000 + i, tags={
            Tag.KIND: "check", "stability.check_outcome": "pass"}).info.run_id
        c.log_batch(rid, params=task)
    _, text = report(uri, "p13", tmp_path / "out")
    assert (f"- `stability check` failed on this task (accumulation.full: 0.5): check run "
            f"`{real}`.") in text
