"""The decision's mutants: each broken rule, in a scratch copy, must fail the suite.

``python experiments/mutants.py`` copies ``stability/``, ``tests/`` and ``conf/`` once per
mutant, applies one edit (a broken rule the decision audit named), runs the decision's tests
and prints a Markdown table: ``killed`` (a test failed, as it must) or ``SURVIVED``. Exit 1 if
any survived. About a minute per mutant on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = [
    ("fallback -> argmin of the means", "stability/stats/best.py",
     "within,\n                    np.where(near.any(axis=-1, keepdims=True), near, lowest))",
     "within, lowest)"),
    ("fallback -> cheapest not shown worse (the old rule)", "stability/stats/best.py",
     "    near = avail & (status != WORSE) & (gap <= d)\n    low",
     "    near = avail & (status != WORSE)\n    low"),
    ("shown worse judged at 0, not the margin", "stability/stats/best.py",
     "np.where(lower > delta, WORSE, OPEN)", "np.where(lower > 0, WORSE, OPEN)"),
    ("cost spread threshold x10", "stability/stats/cost.py",
     "shown = lower > np.maximum(s, np.log1p(floor))",
     "shown = lower > 10 * np.maximum(s, np.log1p(floor))"),
    ("conservative two-sided MCB quantile", "stability/stats/best.py",
     "t = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None]",
     "t = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None] / 2"),
    ("z for t in the shown interval", "stability/stats/effects.py",
     "half = stats.t.ppf((1 + confidence) / 2, e.df) * e.se",
     "half = stats.norm.ppf((1 + confidence) / 2) * e.se"),
    ("TOST at 2 alpha in the verdicts", "stability/stats/effects.py",
     "return np.where(p_equiv_holm < alpha, EQUIVALENT,",
     "return np.where(p_equiv_holm < 2 * alpha, EQUIVALENT,"),
    ("alpha not split over the choices", "stability/report/winner.py",
     "delta, alpha / len(parts),", "delta, alpha,"),
    ("decide: full alpha at every look (no spending)", "stability/stats/shown.py",
     "share = float(plan.spend[k])", "share = float(plan.alpha)"),
]
TESTS = ["tests/stats", "tests/report/test_decision.py", "tests/report/test_decision_simulation.py",
         "tests/stats/test_effects.py"]


def main() -> int:
    """Run every mutant; 1 if one survived."""
    print("| mutant | suite | first failing test |\n|---|---|---|")
    survived = 0
    for name, file, old, new in MUTANTS:
        survived += not _killed(name, file, old, new)
    return int(survived > 0)


def _killed(name: str, file: str, old: str, new: str) -> bool:
    tmp = Path(tempfile.mkdtemp(prefix="mutant-"))
    try:
        for d in ("stability", "tests", "conf"):
            shutil.copytree(ROOT / d, tmp / d)
        shutil.copy(ROOT / "pyproject.toml", tmp)
        src = (tmp / file).read_text()
        if src.count(old) != 1:
            raise SystemExit(f"mutant {name!r}: the code it edits has changed ({file})")
        (tmp / file).write_text(src.replace(old, new))
        env = {**os.environ, "PYTHONPATH": str(tmp)}
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-x", "-n", "0", *TESTS], cwd=tmp, capture_output=True, text=True,
                           env=env)
    finally:
        shutil.rmtree(tmp)
    failed = [line.split(" ")[1] for line in p.stdout.splitlines() if line.startswith("FAILED")]
    print(f"| {name} | {'killed' if p.returncode else 'SURVIVED'} | "
          f"{failed[0] if failed else '-'} |", flush=True)
    return p.returncode != 0


if __name__ == "__main__":
    sys.exit(main())
