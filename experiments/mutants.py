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
    ("fallback -> cheapest, simplest level near the margin (the second pass's rule)",
     "stability/stats/best.py",
     "    low = np.min(np.where(fair, gap, np.inf), axis=-1, keepdims=True)\n",
     "    low = np.maximum(np.min(np.where(fair, gap, np.inf), axis=-1, keepdims=True),\n"
     "                     np.asarray(delta)[..., None] if np.ndim(delta) else delta)\n"),
    ("no near tier: nothing within -> straight to the lowest estimate",
     "stability/stats/best.py", "np.where(single <= delta, NEAR, OPEN)", "OPEN"),
    ("near judged with the simultaneous quantile (the tier never differs from within)",
     "stability/stats/best.py",
     "t_one = stats.t.ppf(1 - np.asarray(alpha)[..., None, None]",
     "t_one = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None]"),
    ("fallback -> cheapest not shown worse (the first rule)", "stability/stats/best.py",
     "    lowest = fair & (gap <= low)\n", "    lowest = fair.copy()\n"),
    ("shown worse judged at 0, not the margin", "stability/stats/best.py",
     "        lower > delta, WORSE, np.where(", "        lower > 0, WORSE, np.where("),
    ("cost spread threshold x10", "stability/stats/cost.py",
     "shown = lower > s + np.log1p(floor)", "shown = lower > 10 * (s + np.log1p(floor))"),
    ("cost cut at the larger of spread and floor, not the floor beyond the spread",
     "stability/stats/cost.py",
     "shown = lower > s + np.log1p(floor)", "shown = lower > np.maximum(s, np.log1p(floor))"),
    ("1.645 se dropped from the shown-costlier bound", "stability/stats/cost.py",
     "    lower = cost.log_mean - cheapest - stats.norm.ppf(CONFIDENCE) * se\n",
     "    lower = cost.log_mean - cheapest\n"),
    ("no cost floor by default", "stability/stats/cost.py",
     "FLOOR = 0.10", "FLOOR = 0.0"),
    ("margin from the median config mean, not the lowest", "stability/design/margin.py",
     "return self.of(min((float(m) for m in means if not math.isnan(m)), default=math.inf))",
     "return self.of(__import__('statistics').median([float(m) for m in means\n"
     "                                                if not math.isnan(m)] or [math.inf]))"),
    ("seeds to decide with the pilot's own SD", "stability/stats/best.py",
     "        up = sd * math.sqrt((n0 - 1) / stats.chi2.ppf(1 - sd_confidence, n0 - 1))\n",
     "        up = sd\n"),
    ("seeds to decide without the power quantile", "stability/stats/best.py",
     "(stats.t.ppf(q, k - 1) + stats.t.ppf(q_power, k - 1))", "(stats.t.ppf(q, k - 1))"),
    ("conservative two-sided MCB quantile", "stability/stats/best.py",
     "t = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None]",
     "t = stats.t.ppf(1 - np.asarray(alpha_each)[..., None, None] / 2"),
    ("z for t in the shown interval", "stability/stats/effects.py",
     "half = stats.t.ppf((1 + confidence) / 2, e.df) * e.se",
     "half = stats.norm.ppf((1 + confidence) / 2) * e.se"),
    ("TOST at 2 alpha in the verdicts", "stability/stats/effects.py",
     "return np.where(p_equiv_holm < alpha, EQUIVALENT,",
     "return np.where(p_equiv_holm < 2 * alpha, EQUIVALENT,"),
    ("alpha not split over the choices", "stability/report/decide/winner.py",
     "alpha=alpha / len(parts),", "alpha=alpha,"),
    ("decide: full alpha at every look (no spending)", "stability/stats/shown.py",
     "share = float(plan.spend[k])", "share = float(plan.alpha)"),
]
TESTS = ["tests/stats", "tests/design/test_margin.py", "tests/report/test_decision.py",
         "tests/report/test_decision_simulation.py", "tests/report/test_decision_choice.py"]


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
