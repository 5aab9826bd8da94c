"""A refactor keeps the report: report.md and summary.csv of two fixed stores, before and after.

The default task's ``steps.csv`` pins the training loop (docs/development.md); this pins the
report. Two SQLite MLflow stores are built once from tiny real trainings and kept as a tarball:
``a``, a full grid of clipping x accumulation x precision, 3 seeds; ``b``, configs with fp16
skips, clipping, accumulation and a diverged run, 2 seeds. Each report restores them (the
report writes its own run and model version into the store) and runs a checkout's
``experiments/report.py`` on each. Two reports of one store differ only in the header line
(time, commit, report run id), which ``compare`` leaves out.

    python experiments/report_identity.py build /tmp/fixed              # once, at the old commit
    python experiments/report_identity.py report /tmp/fixed /tmp/before --repo <old checkout>
    python experiments/report_identity.py report /tmp/fixed /tmp/after  # this checkout
    python experiments/report_identity.py compare /tmp/before /tmp/after  # exit 1 on a difference
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORES = ("a", "b")
OUTPUTS = ("report.md", "summary.csv")
HEADER_LINE = 3  # report.md's "Generated <time> (git <commit>) ... report run <id>" line


def _configs(which: str) -> dict[str, dict]:
    if which == "a":
        grid = itertools.product([None, 1.0], [1, 2], ["fp32", "bf16"])
        return {f"c{clip}-a{acc}-{prec}": {
            "precision": {"name": prec}, "train": {"accum_steps": acc},
            **({"clip": {"enabled": True, "max_norm": clip}} if clip else {})}
            for clip, acc, prec in grid}
    return {"fp32": {"precision": {"name": "fp32"}},
            "bf16-clip": {"precision": {"name": "bf16"},
                          "clip": {"enabled": True, "max_norm": 0.5}},
            "fp16-accum": {"precision": {"name": "fp16", "growth_interval": 100},
                           "train": {"accum_steps": 2}, "fault": {"inf_grad_at_step": 3}},
            "diverges": {"precision": {"name": "fp32"}, "fault": {"inf_grad_at_step": 1},
                         "monitor": {"max_skip_rate": 0.0, "abort_after": 1}}}


def build(folder: Path) -> None:
    """Train both stores' runs into ``folder/store-<x>`` and keep them as ``stores.tgz``."""
    from mlflow.tracking import MlflowClient

    from stability.core.config import to_run_config
    from stability.sweep.job import train_tracked
    from stability.tracking.uri import ensure_experiment

    for which in STORES:
        root = folder / f"store-{which}"
        root.mkdir(parents=True)
        uri, name = f"sqlite:///{root}/mlflow.db", f"fixed-{which}"
        c = MlflowClient(uri)
        parent = c.create_run(ensure_experiment(uri, name), run_name=f"sweep {name}", tags={
            "stability.kind": "sweep", "stability.sweep_id": name}).info.run_id
        for label, over in _configs(which).items():
            for seed in range(3 if which == "a" else 2):
                raw = {"seed": seed, "device": "cpu", "data": {"num_samples": 300},
                       "model": {"hidden_size": 16}, "output_dir": str(root / label / str(seed)),
                       "tracking": {"uri": uri, "experiment": name, "sweep_id": name,
                                    "parent_run_id": parent}}
                raw |= {k: raw.get(k, {}) | v for k, v in over.items()}
                raw["train"] = {"epochs": 2} | raw.get("train", {})
                train_tracked(to_run_config(raw))
        c.set_terminated(parent)
    with tarfile.open(folder / "stores.tgz", "w:gz") as tar:
        for which in STORES:
            tar.add(folder / f"store-{which}", arcname=f"store-{which}")


def report(folder: Path, out: Path, repo: Path) -> None:
    """Restore both stores and run ``repo``'s report on each; copy its outputs to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for which in STORES:
        root = folder / f"store-{which}"
        shutil.rmtree(root, ignore_errors=True)
        with tarfile.open(folder / "stores.tgz") as tar:  # our own tarball, in place
            tar.extractall(folder, members=[m for m in tar.getmembers()
                                            if m.name.startswith(f"store-{which}")],
                           filter="data")
        name = f"fixed-{which}"
        env = {**os.environ, "PYTHONPATH": str(repo), "MLFLOW_TRACKING_URI": ""}
        subprocess.run([sys.executable, str(repo / "experiments" / "report.py"),
                        f"tracking.uri=sqlite:///{root}/mlflow.db", f"experiment={name}",
                        f"output_dir={root / 'reports'}", "device=cpu",
                        f"registry.model_name={name}-winner"],
                       cwd=root, env=env, check=True, capture_output=True)
        for f in OUTPUTS:
            shutil.copy(root / "reports" / name / f, out / f"{which}-{f}")


def compare(before: Path, after: Path) -> list[str]:
    """The outputs that differ (report.md without its header line); empty when none does."""
    differ = []
    for which, f in itertools.product(STORES, OUTPUTS):
        old, new = ((p / f"{which}-{f}").read_text().splitlines() for p in (before, after))
        if f == "report.md":
            old, new = (lines[:HEADER_LINE - 1] + lines[HEADER_LINE:] for lines in (old, new))
        if old != new:
            differ.append(f"{which}-{f}")
    return differ


def main() -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("folder", type=Path)
    rep = sub.add_parser("report")
    rep.add_argument("folder", type=Path)
    rep.add_argument("out", type=Path)
    rep.add_argument("--repo", type=Path, default=ROOT)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        build(args.folder)
    elif args.command == "report":
        report(args.folder, args.out, args.repo.resolve())
    else:
        differ = compare(args.before, args.after)
        print("identical except the header line" if not differ
              else f"differ: {', '.join(differ)}")
        return int(bool(differ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
