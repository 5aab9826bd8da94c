"""Chaos (issue 19): a small sweep against a real server that is SIGKILLed and restarted
several times while one training worker is SIGKILLed too; then the same command again.

Afterwards MLflow holds one FINISHED run per point, nothing RUNNING (training runs and sweep
parents), and one per-step point per ``steps.csv`` row for every per-step metric of every
finished run. Real processes, a real ``mlflow server`` on a free 127.0.0.1 port, temp dirs.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.core import rundir
from stability.tracking.contract import STEP_METRICS, Tag
from stability.tracking.server import MlflowServer, free_port, start_server
from tests.helpers.processes import ENV, PROJECT, rows

pytestmark = [pytest.mark.slow, pytest.mark.server]
SEEDS = (0, 1, 2)
SERVER_KILLS = 3


def _sweep(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "experiments/sweep.py", *args], cwd=PROJECT,
                            env=ENV, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _worker_pid(folder: Path) -> int | None:
    """The training process of a run folder (``stability.process`` in its journal)."""
    try:
        first = json.loads((folder / rundir.JOURNAL_NAME).read_text().splitlines()[0])
        return int(first["tags"][Tag.PROCESS].rsplit(":", 1)[1])
    except (OSError, IndexError, KeyError, ValueError):
        return None


class Chaos:
    """SIGKILLs and restarts the server ``SERVER_KILLS`` times, and SIGKILLs one worker."""

    def __init__(self, server: MlflowServer, root: Path, port: int, sweep_dir: Path,
                 sweep: subprocess.Popen) -> None:
        self.server, self.root, self.port = server, root, port
        self.sweep_dir, self.sweep = sweep_dir, sweep
        self.server_kills, self.worker_kills = 0, 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _kill_a_worker(self) -> None:
        for folder in sorted(p for p in self.sweep_dir.iterdir() if p.name.isdigit()):
            pid = _worker_pid(folder)
            if pid and pid != self.sweep.pid and rows(folder / rundir.CSV_NAME) > 9:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.worker_kills += 1
                return

    def _run(self) -> None:
        try:
            while self.sweep.poll() is None and (self.server_kills < SERVER_KILLS
                                                 or not self.worker_kills):
                time.sleep(0.5)
                if not self.worker_kills:
                    self._kill_a_worker()
                if self.server_kills < SERVER_KILLS and self.sweep.poll() is None:
                    os.killpg(self.server.process.pid, signal.SIGKILL)
                    self.server.process.wait(timeout=30)
                    self.server_kills += 1
                    time.sleep(0.5)
                    self.server = start_server(self.root, self.port)
        except BaseException as err:  # reported by join()
            self.error = err


def test_a_sweep_survives_server_and_worker_kills(tmp_path: Path) -> None:
    t0 = time.monotonic()
    root, port, sweep_dir = tmp_path / "server", free_port(), tmp_path / "sweep"
    server = start_server(root, port)
    args = ["-m", "data.num_samples=200", "device=cpu", "clip.enabled=false",
            "clip.max_norm=1.0", "train.accum_steps=1", "precision=fp32", "train.epochs=30",
            f"seed={','.join(map(str, SEEDS))}", "hydra.launcher.n_jobs=2",
            f"tracking.uri={server.uri}", "tracking.experiment=chaos",
            f"hydra.sweep.dir={sweep_dir}"]
    first = _sweep(args, tmp_path / "first.log")
    chaos = None
    try:
        deadline = time.monotonic() + 120
        while not list(sweep_dir.glob(f"*/{rundir.JOURNAL_NAME}")):  # the parent run exists
            assert first.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "first.log").read_text()[-3000:])
            time.sleep(0.1)
        chaos = Chaos(server, root, port, sweep_dir, first)
        chaos.start()
        first.wait(timeout=300)
        chaos.join()
        server = chaos.server
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    # Up to SERVER_KILLS while the sweep runs: how many fit depends on the machine's speed (a
    # restart takes seconds), so the test needs at least one of each, not all three.
    assert chaos.server_kills >= 1 and chaos.worker_kills == 1, (
        chaos.server_kills, chaos.worker_kills, (tmp_path / "first.log").read_text()[-3000:])

    t_first = time.monotonic() - t0
    again = _sweep(args, tmp_path / "again.log")
    try:
        assert again.wait(timeout=300) == 0, (tmp_path / "again.log").read_text()[-3000:]
        c = MlflowClient(server.uri)
        exp = c.get_experiment_by_name("chaos")
        runs = c.search_runs([exp.experiment_id], max_results=1000)
        assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
        train = [r for r in runs if r.data.tags.get(Tag.KIND) == "train"]
        finished = [r for r in train if r.info.status == "FINISHED"]
        assert Counter(r.data.tags[Tag.SEED] for r in finished) == Counter(map(str, SEEDS))
        assert len({r.data.tags[Tag.FINGERPRINT] for r in finished}) == 1
        for r in finished:
            with (Path(r.data.tags[Tag.OUTPUT_DIR]) / rundir.CSV_NAME).open() as f:
                steps = [int(row["step"]) for row in csv.DictReader(f)]
            assert len(steps) == 90  # 30 epochs x 3 optimizer steps
            for key in STEP_METRICS:
                got = sorted(m.step for m in c.get_metric_history(r.info.run_id, key))
                assert got == steps, (r.info.run_id, key)
        parents = [r for r in runs if r.data.tags.get(Tag.KIND) == "sweep"]
        assert len(parents) == 2 and parents[0].info.status in ("FINISHED", "KILLED")
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
        server.stop()
    elapsed = time.monotonic() - t0
    print(f"chaos: {len(SEEDS)} points, {len(train)} training runs, {chaos.server_kills} server "
          f"kills, 1 worker kill, {elapsed:.0f} s ({t_first:.0f} s until the rerun)")
    # No bound on the time: a hang is caught by the waits' own timeouts above (tests assert
    # behaviour, never wall-clock times).
