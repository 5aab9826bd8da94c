"""``experiments/report_identity.py``: a refactor keeps report.md and summary.csv of two fixed
stores, the header line aside; the comparison names any other difference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "report_identity.py"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _outputs(folder: Path, header: str, summary: str) -> Path:
    folder.mkdir()
    for which in ("a", "b"):
        (folder / f"{which}-report.md").write_text(f"# Report\n\n{header}\n\n## Answer\nx\n")
        (folder / f"{which}-summary.csv").write_text(summary)
    return folder


def test_only_the_header_line_may_differ(tmp_path: Path) -> None:
    before = _outputs(tmp_path / "before", "Generated 10:00 (git aaa)", "label,loss\nx,0.5\n")
    after = _outputs(tmp_path / "after", "Generated 11:00 (git bbb)", "label,loss\nx,0.5\n")
    same = _run("compare", str(before), str(after), cwd=tmp_path)
    assert same.returncode == 0 and "identical except the header line" in same.stdout
    (after / "b-summary.csv").write_text("label,loss\nx,0.6\n")
    (after / "a-report.md").write_text("# Report\n\nGenerated 11:00\n\n## Answer\ny\n")
    differ = _run("compare", str(before), str(after), cwd=tmp_path)
    assert differ.returncode == 1 and "differ: a-report.md, b-summary.csv" in differ.stdout


@pytest.mark.slow
def test_two_reports_of_the_fixed_stores_are_identical_but_for_the_header(tmp_path: Path) -> None:
    env_dir = tmp_path / "fixed"
    assert _run("build", str(env_dir), cwd=tmp_path).returncode == 0
    for out in ("one", "two"):
        done = _run("report", str(env_dir), str(tmp_path / out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "one" / "a-report.md").read_text() != (
        tmp_path / "two" / "a-report.md").read_text()  # the header: another time and run id
    same = _run("compare", str(tmp_path / "one"), str(tmp_path / "two"), cwd=tmp_path)
    assert same.returncode == 0, same.stdout
    summary = (tmp_path / "one" / "b-summary.csv").read_text()
    assert "seeds_diverged" in summary and summary.count("\n") == 5  # 4 configs and the head
