"""Issue 55, item 4: artifacts bounded by their shape, not only their size.

A steps.csv of the report's columns plus 300k more number columns (~6 MB, under the 16 MB size
cap) logged into one of the victim's own finished runs, and a best.pt of 300k empty zip
members: each is refused by its shape before it is parsed. The report over the wide table runs
in a child process whose peak resident memory (its own ``VmHWM``, the high-water mark of the
child's process image, not ``ru_maxrss``: under vfork and exec that carries the test process's
peak, ~1.2 GB late in a full suite) must stay under 1 GB: the bound the issue sets; the process
loads torch, MLflow and pandas, ~0.5 GB of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stability.core.identity import fingerprint
from stability.core.steplog import CSV_COLUMNS
from stability.report.sealed.rebuild import (
    MAX_CHECKPOINT_MEMBERS,
    CheckpointMismatch,
    check_archive,
)
from stability.tracking.adoption import MAX_STEPS_BYTES, MAX_STEPS_COLUMNS
from tests.helpers.processes import PROJECT
from tests.helpers.report_fixtures import run_config
from tests.report.test_planted import BASELINE, WINNER, recorded_sweep, report

pytestmark = pytest.mark.slow
WIDE_COLUMNS = 300_000
FIELDS = WIDE_COLUMNS + len(CSV_COLUMNS)  # the fixture's table is ours: CSV_COLUMNS
RSS_BOUND_MB = 1024


def wide_steps(real: Path, dest: Path, extra: int = WIDE_COLUMNS) -> Path:
    """``real`` (a run's steps.csv) with ``extra`` more number columns on every line."""
    lines = real.read_text().splitlines()
    header = lines[0] + "".join(f",x{i}" for i in range(extra))
    rows = [line + ",0" * extra for line in lines[1:]]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join([header, *rows]) + "\n")
    return dest


def empty_members(dest: Path, n: int) -> Path:
    """A zip archive of ``n`` empty stored members (``best/data/<i>``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as z:
        for i in range(n):
            z.writestr(f"best/data/{i}", b"")
    return dest


def _report_in_child(uri: str, sweep: str, out: Path) -> tuple[int, float, str]:
    """The real report of ``sweep`` in a child process: its exit status, peak RSS in MB (the
    child's own ``VmHWM``, printed as its last line) and output."""
    code = ("import sys; from tests.report.test_planted import report; "
            "result, text = report(sys.argv[1], sys.argv[2], __import__('pathlib').Path("
            "sys.argv[3])); print(result.winner); "
            "print('VmHWM', open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        child = subprocess.Popen([sys.executable, "-c", code, uri, sweep, str(out)], cwd=PROJECT,
                                 stdout=f, stderr=subprocess.STDOUT)
        status = child.wait()
    output = log.read_text()
    peak = re.findall(r"^VmHWM (\d+)$", output, re.MULTILINE)
    return status, (int(peak[-1]) / 1024 if peak else float("inf")), output


def test_a_wide_steps_csv_in_a_real_run_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """Item 4: 150k extra columns (2.9 MB) took the report to 951 MB and past 150 s; 700k to
    5.9 GB. Now the table is one unreadable run, refused by its widest line."""
    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "w4")
    victim = ids[(fingerprint(run_config(BASELINE, 0, tmp_path)), 0)]
    real = Path(c.download_artifacts(victim, "steps.csv", str(tmp_path / "dl")))
    wide = wide_steps(real, tmp_path / "wide" / "steps.csv")
    assert wide.stat().st_size < MAX_STEPS_BYTES
    c.log_artifact(victim, str(wide))
    code, peak_mb, output = _report_in_child(uri, "w4", tmp_path / "out")
    assert code == 0, output[-3000:]
    assert fingerprint(run_config(WINNER, 0, tmp_path)) in output
    text = (tmp_path / "out" / "w4" / "report.md").read_text()
    assert (f"run {victim} is unreadable, counted as not finished: unreadable run: its steps.csv "
            f"line 1 has {FIELDS:,} fields, over the cap of {MAX_STEPS_COLUMNS} (its "
            "known columns and 32 more)") in text
    print(f"peak RSS of the report over a {wide.stat().st_size:,}-byte steps.csv of "
          f"{FIELDS:,} columns: {peak_mb:.0f} MB")
    assert peak_mb < RSS_BOUND_MB, peak_mb


def test_a_checkpoint_of_300k_empty_members_is_refused_by_its_end_record(tmp_path: Path) -> None:
    """Item 4: a best.pt of 300k empty zip members loaded (no member cap). Now it is refused
    from the archive's end record, before its directory is read; the winner's other seed is
    tested and the refused one says why."""
    bomb = empty_members(tmp_path / "bomb" / "best.pt", 300_000)
    with pytest.raises(CheckpointMismatch, match=(
            r"^checkpoints/best.pt declares 300,000 members in a [\d,]+-byte directory, over "
            rf"the report's cap of {MAX_CHECKPOINT_MEMBERS:,} members")):
        check_archive(bomb)
    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "z4")
    winner_run = ids[(fingerprint(run_config(WINNER, 0, tmp_path)), 0)]
    c.log_artifact(winner_run, str(bomb), "checkpoints")
    result, text = report(uri, "z4", tmp_path / "out")
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    assert "checkpoints/best.pt declares 300,000 members" in text


def test_a_config_whose_every_checkpoint_is_refused_cannot_win(tmp_path: Path) -> None:
    """Issue 55, item 7 (low): a config whose every checkpoint was refused still won and its
    answer read "split of 0 sequences". Now its runs are unreadable, one line names it, and
    the next config wins, tested on the sealed split."""
    bomb = empty_members(tmp_path / "bomb" / "best.pt", MAX_CHECKPOINT_MEMBERS + 1)
    uri, c, exp_id, parent, ids = recorded_sweep(tmp_path, "n7")
    fp = fingerprint(run_config(WINNER, 0, tmp_path))
    for seed in (0, 1):
        c.log_artifact(ids[(fp, seed)], str(bomb), "checkpoints")
    result, text = report(uri, "n7", tmp_path / "out")
    assert result.winner == fingerprint(run_config(BASELINE, 0, tmp_path))
    assert f"({fp}) cannot be the winner: none of its 2 finished runs has a checkpoint that " \
           "loads (seed 0: CheckpointMismatch: checkpoints/best.pt declares 10,001 members" in text
    assert "split of 0 sequences" not in text
    assert f"run {ids[(fp, 1)]} is unreadable" in text
