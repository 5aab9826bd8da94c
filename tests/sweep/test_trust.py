"""No code from a checkpoint, no folder a tag names, no adopted run unchecked (issue 31).

The sweep, tracking and integration side of the second trust pass: real MLflow stores (SQLite),
real run folders and the real HF Trainer; the hostile parts are planted as an attacker who can
write runs into the experiment (or files into a handed-over folder) would plant them.
"""

from __future__ import annotations

import pickle
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.stores import sqlite_store

MARKER = "stability-issue31-pwned"


class _Payload:
    """Unpickling this runs ``open(<marker>, 'w')``: the proof that a load ran code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickled_callback_state_in_an_hf_checkpoint_runs_no_code(tmp_path: Path) -> None:
    """B: an HF checkpoint whose ``stability_callback.pt`` is a pickle (not plain data):
    resuming from it refuses the file in one line, and the pickle never runs."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stability.integrations.hf import STATE_NAME, StabilityCallback
    from tests.helpers.trainer_tasks import TinyHFTask

    class Crash(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 14:
                raise RuntimeError("crash")

    task = TinyHFTask()
    train_set, val_set = task.train_val()

    def fit(crash: bool = False, resume: str | None = None) -> None:
        torch.manual_seed(0)
        args = TrainingArguments(output_dir=str(tmp_path / "hf"), num_train_epochs=2, seed=0,
                                 eval_strategy="epoch", save_strategy="epoch", use_cpu=True,
                                 report_to="none", disable_tqdm=True, logging_strategy="no",
                                 **task.training_arguments())
        trainer = Trainer(model=task.model(), args=args, train_dataset=train_set,
                          eval_dataset=val_set)
        StabilityCallback(tmp_path / "run").attach(trainer)
        if crash:
            trainer.add_callback(Crash())
        trainer.train(resume_from_checkpoint=resume)

    with pytest.raises(RuntimeError, match="crash"):
        fit(crash=True)
    saved = tmp_path / "hf" / "checkpoint-12" / STATE_NAME
    assert saved.exists()
    marker = tmp_path / MARKER
    planted = {"torch.save": lambda f: torch.save({"meter": _Payload(marker)}, f),
               "pickle": lambda f: pickle.dump({"meter": _Payload(marker)}, f)}
    for how, plant in planted.items():
        with saved.open("wb") as f:
            plant(f)
        with pytest.raises(Exception) as err:
            fit(resume=str(saved.parent))
        assert not marker.exists(), f"the {how} payload ran"
        assert isinstance(err.value, ValueError), err.value
        assert str(err.value).startswith(f"refusing {saved}: not plain data"), err.value
        assert "\n" not in str(err.value)


# -- C and D: no folder comes from a tag --------------------------------------------------------

class _Stop(Exception):
    """Ends a run the way a kill would: no end, ``checkpoints/last.pt`` stays."""


class _StopAtEpoch2:
    def on_step(self, log: Any, epoch: int) -> None:
        if epoch == 2:
            raise _Stop

    def on_epoch(self, log: Any) -> None:
        pass


def _killed_point(folder: Path) -> Any:
    """A point trained in ``folder`` up to its epoch-1 resume checkpoint, then stopped."""
    from stability.core.config import to_run_config
    from stability.core.loop import train

    cfg = to_run_config({"seed": 3, "device": "cpu", "output_dir": str(folder),
                         "data": {"num_samples": 200}, "train": {"epochs": 2},
                         "telemetry": {"per_layer": False}})
    with pytest.raises(_Stop):
        train(cfg, sinks=[_StopAtEpoch2()])
    assert (folder / "checkpoints" / "last.pt").exists()
    return cfg


def _sweep(tmp: Path, exp: str) -> Any:
    from stability.core.config import TrackingConfig
    from stability.sweep.parent import SweepSetup, open_sweep_run

    run, _ = open_sweep_run(TrackingConfig(uri=sqlite_store(tmp / "mlflow.db"), experiment=exp),
                            SweepSetup(sweep_id="s31", grid_size=1, sweep_dir=tmp / "sweep"), 1,
                            True)
    return run


def test_a_killed_run_tagged_with_an_outside_folder_is_not_resumed_there(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """C: an attacker's KILLED run of a point the victim is about to run, tagged
    ``stability.output_dir=<their folder>`` (a valid resume checkpoint there, its config.yaml a
    symlink to a victim file): the sweep does not resume in it and says so in one line; the
    same run tagged with a folder under the sweep's own folder does resume there."""
    from types import SimpleNamespace

    from stability.core.identity import fingerprint
    from stability.sweep.parent import resumable_folders
    from stability.tracking.contract import Kind, Tag
    from stability.tracking.uri import client

    victim_file = tmp_path / "victim.txt"
    victim_file.write_text("the victim's own file\n")
    attacker = tmp_path / "attacker"
    cfg = _killed_point(attacker)
    (attacker / "config.yaml").unlink()
    (attacker / "config.yaml").symlink_to(victim_file)
    ours = tmp_path / "sweep" / "0"
    _killed_point(ours)
    run = _sweep(tmp_path, "c31")
    key = (fingerprint(cfg), cfg.seed)
    point = SimpleNamespace(key=key, cfg=cfg)
    c = client(run.uri)

    def killed_run(folder: Path) -> str:
        rid = c.create_run(run.experiment_id, tags={
            Tag.KIND: Kind.TRAIN, Tag.FINGERPRINT: key[0], Tag.SEED: str(key[1]),
            Tag.OUTPUT_DIR: str(folder)}).info.run_id
        c.set_terminated(rid, status="KILLED")
        return rid

    rid = killed_run(attacker)
    with caplog.at_level("WARNING"):
        assert resumable_folders(run, [point]) == {}
    [line] = [r.getMessage() for r in caplog.records if "stability.output_dir" in r.getMessage()]
    assert line.startswith(f"ignoring run {rid}'s stability.output_dir '{attacker}' (not "
                           "resuming in it): not under ")
    # through a symlink inside the sweep's folder: the real path decides
    (tmp_path / "sweep" / "link").symlink_to(attacker)
    killed_run(tmp_path / "sweep" / "link")
    assert resumable_folders(run, [point]) == {}
    killed_run(ours)  # the newest KILLED run, in the sweep's own folder: resumed
    assert resumable_folders(run, [point]) == {key: ours.resolve()}
    assert victim_file.read_text() == "the victim's own file\n"
    run.close("FINISHED", {})


def test_a_stale_run_tagged_with_a_victim_folder_uploads_nothing_from_it(
        tmp_path: Path) -> None:
    """D: stale RUNNING runs tagged ``stability.output_dir=<victim folder>`` whose
    ``config.yaml`` holds a secret and whose ``checkpoints/best.pt`` is a symlink to a key: the
    sweep that ends them uploads nothing into them, whether the folder is outside its own
    folder, inside it but another run's (its journal names that one), or the run's own: then
    only the regular files go, never the symlink."""
    from stability.tracking import journal
    from stability.tracking.artifacts import uploaded
    from stability.tracking.contract import Kind, Tag
    from stability.tracking.orphans import end_stale_runs
    from stability.tracking.uri import client, ensure_experiment

    uri = sqlite_store(tmp_path / "mlflow.db")
    exp_id = ensure_experiment(uri, "d31")
    c = client(uri)
    key = tmp_path / "id_ed25519"
    key.write_text("PRIVATE KEY\n")

    def victim(folder: Path) -> Path:
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "config.yaml").write_text("password: SECRET-d31\n")
        (folder / "checkpoints" / "best.pt").symlink_to(key)
        return folder

    def stale(folder: Path) -> str:
        return c.create_run(exp_id, tags={Tag.KIND: Kind.TRAIN, Tag.OUTPUT_DIR: str(folder),
                                          Tag.HEARTBEAT: "1"}).info.run_id

    outside = stale(victim(tmp_path / "elsewhere"))
    theirs = stale(victim(tmp_path / "sweep" / "0"))
    journal.append(tmp_path / "sweep" / "0", "run_id", run_id="the-victims-own-run")
    own = stale(victim(tmp_path / "sweep" / "1"))
    journal.append(tmp_path / "sweep" / "1", "run_id", run_id=own)
    assert end_stale_runs(uri, "d31", roots=[tmp_path / "sweep"]) == 3
    for rid in (outside, theirs, own):
        assert c.get_run(rid).info.status == "KILLED"
    assert uploaded(c, outside) == {} and uploaded(c, theirs) == {}
    assert set(uploaded(c, own)) == {"config.yaml"}  # best.pt (a symlink) skipped


def test_a_run_posing_as_one_of_the_sweeps_orphans_gets_nothing_from_its_folders(
        tmp_path: Path) -> None:
    """D, at the sweep's end: a RUNNING run tagged with this sweep's id and one of its points
    is closed, but the point's job folder (its journal names our own run) uploads nothing into
    it; our own orphan gets its files."""
    from stability.tracking import journal
    from stability.tracking.artifacts import uploaded
    from stability.tracking.contract import Kind, Tag
    from stability.tracking.uri import client

    run = _sweep(tmp_path, "orphans31")
    c = client(run.uri)
    folder = tmp_path / "sweep" / "0"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 1\n")
    # both runs name a process of this host that has exited (a killed job's run does): the
    # sweep need not wait ORPHAN_WAIT_S for an end write that cannot come
    gone = subprocess.Popen(["true"])
    gone.wait()
    tags = {Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: run.sweep_id, Tag.FINGERPRINT: "f" * 12,
            Tag.SEED: "1", Tag.PROCESS: f"{socket.gethostname()}:{gone.pid}"}
    ours = c.create_run(run.experiment_id, tags=tags).info.run_id
    journal.append(folder, "run_id", run_id=ours)
    posing = c.create_run(run.experiment_id, tags=tags | {
        Tag.OUTPUT_DIR: str(folder)}).info.run_id
    assert run.close_orphans({("f" * 12, 1): folder}, killed=True) == 2
    assert uploaded(c, posing) == {}
    assert set(uploaded(c, ours)) == {"config.yaml"}
    run.close("KILLED", {})


@pytest.mark.parametrize("password", ["p@ssw0rd", "p:ss@w0rd", "p%40ss", "a@b:c@d"])
def test_a_password_with_at_colon_or_percent_is_redacted_as_urlsplit_reads_it(
        password: str) -> None:
    """F: the userinfo ends at the last "@" of the authority (urlsplit), not the first."""
    from urllib.parse import urlsplit

    from stability.tracking.credentials import redact_uri

    uri = f"http://alice:{password}@host:5000/path?q=1"
    assert urlsplit(uri).hostname == "host"
    assert redact_uri(f"at {uri} and sqlite:////tmp/a@b/mlflow.db") == (
        "at http://host:5000/path?q=1 and sqlite:////tmp/a@b/mlflow.db")


# -- G: a FINISHED run counts as done only when its artifacts back it ---------------------------

def _trained(tmp: Path, uri: str, exp: str, seed: int) -> Any:
    """A real tracked run of the tiny default config (its artifacts uploaded at its end)."""
    from stability.core.config import to_run_config
    from stability.sweep.job import train_tracked

    cfg = to_run_config({"seed": seed, "device": "cpu", "output_dir": str(tmp / f"own{seed}"),
                         "data": {"num_samples": 200}, "train": {"epochs": 1},
                         "telemetry": {"per_layer": False},
                         "tracking": {"uri": uri, "experiment": exp}})
    assert train_tracked(cfg).status == "finished"
    return cfg


def _planted(c: Any, exp_id: str, fp: str, seed: int, metrics: dict[str, float],
             files: dict[str, str] | None = None, val_loss: float | None = None) -> str:
    """A FINISHED training run as anyone with write access can log one."""
    import tempfile

    from stability.tracking.contract import Kind, Tag

    rid = c.create_run(exp_id, tags={Tag.KIND: Kind.TRAIN, Tag.FINGERPRINT: fp,
                                     Tag.SEED: str(seed), Tag.OUTCOME: "finished"}).info.run_id
    for k, v in metrics.items():
        c.log_metric(rid, k, v)
    if val_loss is not None:
        c.log_metric(rid, "val_loss", val_loss, step=1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (files or {}).items():
            (Path(tmp) / name).write_text(text)
            c.log_artifact(rid, str(Path(tmp) / name))
    c.set_terminated(rid, "FINISHED")
    return rid


def test_a_planted_finished_run_is_not_adopted_and_the_point_runs_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """G: FINISHED runs planted for points the sweep has not run (no artifacts; another
    config's config.yaml; a best_val_loss its own val_loss series contradicts; a steps.csv
    that ends elsewhere than its metrics) are not skipped as done, one line each; a real
    FINISHED run is, and of a point with both, the newest run that is backed stands."""
    from stability.core.config import TrackingConfig
    from stability.core.identity import fingerprint
    from stability.sweep.parent import SweepSetup, open_sweep_run
    from stability.tracking.uri import client, ensure_experiment

    uri = sqlite_store(tmp_path / "mlflow.db")
    exp_id = ensure_experiment(uri, "g31")
    cfg = _trained(tmp_path, uri, "g31", seed=0)
    fp, c = fingerprint(cfg), client(uri)
    config = (tmp_path / "own0" / "config.yaml").read_text()
    steps = (tmp_path / "own0" / "steps.csv").read_text()
    other = config.replace("hidden_size: 48", "hidden_size: 47")
    assert other != config
    backed = {"config.yaml": config, "steps.csv": steps}
    planted = {
        1: _planted(c, exp_id, fp, 1, {"best_val_loss": 0.0001}),
        2: _planted(c, exp_id, fp, 2, {"best_val_loss": 0.0001},
                    {"config.yaml": other, "steps.csv": steps}),
        3: _planted(c, exp_id, fp, 3, {"best_val_loss": 0.0001, "val_loss": 0.5}, backed,
                    val_loss=0.5),
        4: _planted(c, exp_id, fp, 4, {"best_val_loss": 0.0001, "optimizer_steps": 9}, backed),
        0: _planted(c, exp_id, fp, 0, {"best_val_loss": 0.0001}),  # newer than the real seed 0
    }
    with caplog.at_level("WARNING"):
        setup = SweepSetup(sweep_id="g31", grid_size=5, sweep_dir=tmp_path / "sweep")
        run, done = open_sweep_run(TrackingConfig(uri=uri, experiment="g31"), setup, 5, True,
                                   [cfg.task.target])
        assert [(fp, s) in done for s in range(5)] == [True, False, False, False, False]
    own = c.search_runs([exp_id], f"tags.`stability.seed` = '0' and tags.`stability.outcome` "
                        f"= 'finished' and attributes.run_id != '{planted[0]}'")[0]
    assert done[(fp, 0)].run_id == own.info.run_id
    lines = {rid: [r.getMessage() for r in caplog.records if rid in r.getMessage()]
             for rid in planted.values()}
    assert lines == {
        planted[0]: [f"not adopting FINISHED run {planted[0]} (config {fp}, seed 0): it has no "
                     "config.yaml; an older run of the point is checked"],
        planted[1]: [f"not adopting FINISHED run {planted[1]} (config {fp}, seed 1): it has no "
                     "config.yaml; the point runs again"],
        planted[2]: [f"not adopting FINISHED run {planted[2]} (config {fp}, seed 2): its "
                     "config.yaml is refused: config.yaml does not match the run's fingerprint "
                     "tag; the point runs again"],
        planted[3]: [f"not adopting FINISHED run {planted[3]} (config {fp}, seed 3): its "
                     "best_val_loss 0.0001 is not the lowest of its val_loss series (0.5); the "
                     "point runs again"],
        planted[4]: [f"not adopting FINISHED run {planted[4]} (config {fp}, seed 4): its "
                     "steps.csv ends at step 3, its optimizer_steps metric says 9; the point "
                     "runs again"],
    }
    run.close("FINISHED", {})
