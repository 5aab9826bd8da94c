"""The LR axis of the report (report/examine/lr.py): synthetic studies whose answer is known."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection

from stability.report.decide import factors, select
from stability.report.examine import health, lr
from stability.report.options import Thresholds
from stability.report.present.sections import lr_sensitivity as lr_plot
from tests.helpers.stores import sqlite_store

LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
LOSS_INIT = 0.7
NAN = math.nan


def _runs(losses: dict[tuple[bool, str], list[float]], seeds: int = 3) -> pd.DataFrame:
    """One row per (clip, precision, lr, seed); NaN in ``losses`` means the run diverged."""
    rows = []
    rng = np.random.default_rng(0)
    for (clip, precision), per_lr in losses.items():
        for lr_value, loss in zip(LRS, per_lr, strict=True):
            fp = f"{'c' if clip else 'n'}-{precision}-{lr_value:g}"
            for seed in range(seeds):
                finished = math.isfinite(loss)
                value = loss + 0.01 * rng.standard_normal() if finished else NAN
                rows.append({
                    "run_id": f"{fp}-{seed}", "fingerprint": fp, "seed": seed,
                    "outcome": "finished" if finished else "diverged",
                    "best_val_loss": value, "val_loss": value,
                    "loss_init": LOSS_INIT + 0.001 * seed,
                    "clip.enabled": clip, "clip.method": "norm",
                    "clip.max_norm": 1.0 if clip else NAN, "precision.name": precision,
                    "train.accum_steps": 1, "train.lr": str(lr_value), "wall_time_s": 1.0,
                })
    return pd.DataFrame(rows)


def _study(runs: pd.DataFrame) -> tuple[list[lr.LrCurve], pd.DataFrame]:
    configs = select.aggregate(runs)
    configs = health.judge(runs, configs, {}, Thresholds())
    return lr.curves(runs, configs), configs


WIDENS = {(False, "fp32"): [0.4, 0.3, NAN, NAN, NAN],
          (True, "fp32"): [0.4, 0.3, 0.25, 0.3, NAN]}


def test_clipping_that_widens_the_stable_range_is_found() -> None:
    found, configs = _study(_runs(WIDENS))
    by = {dict(c.setting)["clipping"]: c for c in found}
    assert set(by) == {"off", "max_norm 1"}
    off, on = by["off"], by["max_norm 1"]
    assert off.stable == (True, True, False, False, False) and off.stable_max == 3e-3
    assert on.stable_max == 3e-2
    assert off.loss_init == pytest.approx(LOSS_INIT + 0.001)
    # Wortsman: mean(min(L, L0)) - min L; diverged runs count as loss_init
    assert off.sensitivity == pytest.approx(np.mean([0.4, 0.3, 0.701, 0.701, 0.701]) - 0.3,
                                            abs=0.01)
    assert on.sensitivity == pytest.approx(np.mean([0.4, 0.3, 0.25, 0.3, 0.701]) - 0.25,
                                           abs=0.01)
    assert len(off.sensitivity_seeds) == 3
    text = lr.sentences(found, {"clipping": "off"})
    assert len(text) == 1
    assert text[0].startswith("Clipping at max_norm 1 widens the stable LR range from <=3e-3 "
                              "to <=3e-2 (LR sensitivity 0.2")


def test_clipping_that_changes_nothing_is_reported_as_such() -> None:
    same = {(False, "fp32"): [0.4, 0.3, NAN, NAN, NAN],
            (True, "fp32"): [0.41, 0.31, NAN, NAN, NAN]}
    found, _ = _study(_runs(same))
    assert [c.stable_max for c in found] == [3e-3, 3e-3]
    text = lr.sentences(found, {"clipping": "off"})
    assert text[0].startswith("Clipping at max_norm 1 leaves the stable LR range at <=3e-3")


def test_per_precision_settings_and_a_loss_above_loss_init_is_not_stable() -> None:
    losses = {**WIDENS, (False, "bf16"): [0.4, 0.8, 0.9, NAN, NAN],
              (True, "bf16"): [0.4, 0.3, 0.3, 0.3, 0.3]}
    found, _ = _study(_runs(losses))
    ranges = {c.label: c.stable_max for c in found}
    # finished but above loss_init at 3e-3: it learned nothing, so the range ends at 1e-3
    assert ranges == {"clip off, bf16": 1e-3, "max_norm 1, bf16": 1e-1,
                      "clip off, fp32": 3e-3, "max_norm 1, fp32": 3e-2}
    text = lr.sentences(found, {"clipping": "off", "precision": "fp32"})
    assert "from <=1e-3 to <=1e-1 (every swept LR) (LR sensitivity" in text[0]
    assert "at bf16" in text[0]
    bf16 = next(t for t in text if t.startswith("bf16 (vs fp32) "))
    assert "narrows the stable LR range from <=3e-3 to <=1e-3 (LR sensitivity 0.261 -> " \
        "0.237) at clip off" in bf16 and "widens the stable LR range from <=3e-2 to <=1e-1" in bf16
    rows = lr.table_rows(found)
    assert [r[0] for r in rows] == ["clip off, fp32", "clip off, bf16", "max_norm 1, fp32",
                                    "max_norm 1, bf16"]  # each factor's reference first
    assert rows[1][:4] == ["clip off, bf16", "1e-3 3e-3 1e-2 3e-2 1e-1", "ok x x x x", "<=1e-3"]


def test_the_lr_is_a_factor_of_the_factor_analysis() -> None:
    runs = _runs(WIDENS)
    configs = select.aggregate(runs)
    an = factors.analyse(runs, configs, margin=0.01)
    lr_factor = next(f for f in an.factors if f.name == "train.lr")
    assert lr_factor.levels == tuple(str(x) for x in LRS)  # numeric order, 1e-3 the reference
    assert {e.level for e in an.main if e.factor == "train.lr"} == {str(x) for x in LRS[1:]}


def test_no_lr_axis_no_curves_and_no_figure(tmp_path: Path) -> None:
    runs = _runs(WIDENS)
    runs = runs[runs["train.lr"] == str(1e-3)]
    found, _ = _study(runs)
    assert found == [] and lr_plot.lr_sensitivity(found, tmp_path) is None


def test_the_figure_draws_one_curve_per_setting_with_its_crosses_and_labels(
        tmp_path: Path) -> None:
    found, _ = _study(_runs(WIDENS))
    drawn = lr_plot.draw(found, "MSE")
    (ax,) = drawn.axes
    assert ax.get_xscale() == "log"
    assert ax.get_xlabel() == "learning rate (train.lr)"
    assert ax.get_ylabel() == "final validation loss (MSE), capped at loss_init"
    assert ax.get_title().startswith("Final validation loss vs learning rate")
    curves = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(curves) == len(found) == 2
    for line, curve in zip(curves, found, strict=True):  # each curve at every swept LR
        assert list(line.get_xdata()) == list(curve.lrs) == list(LRS)
        assert np.allclose(line.get_ydata(), curve.loss)
        assert line.get_label().startswith(f"{curve.label}: sensitivity")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [c.get_label() for c in curves]
    # a min-max band per curve; a cross at each LR a setting does not train stably at
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2
    crosses = sorted(len(c.get_offsets()) for c in ax.collections
                     if isinstance(c, PathCollection))
    assert crosses == sorted(c.stable.count(False) for c in found) == [1, 3]
    fig = lr_plot.lr_sensitivity(found, tmp_path, "MSE")
    assert fig is not None and (tmp_path / fig.file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sensitivity_of_a_flat_curve_is_zero_and_capped_at_loss_init() -> None:
    assert lr.sensitivity(np.array([0.2, 0.2, 0.2]), 1.0) == pytest.approx(0.0, abs=1e-12)
    assert lr.sensitivity(np.array([0.2, np.nan, 5.0]), 1.0) == pytest.approx(
        np.mean([0.2, 1.0, 1.0]) - 0.2)


@pytest.mark.slow
def test_a_swept_lr_reaches_the_report_with_its_sentence_table_and_figure(tmp_path: Path) -> None:
    """Through MLflow and build_report: clip off breaks above 3e-3, clip at 1 above 3e-2."""
    from stability.report import ReportConfig, build_report
    from tests.helpers.report_fixtures import Spec, make_sweep

    specs = []
    for clip, per_lr in ((None, [0.4, 0.3, "diverged", "diverged"]),
                         (1.0, [0.4, 0.3, 0.25, 0.3])):
        for lr_value, loss in zip(LRS[:4], per_lr, strict=True):
            specs.append(Spec(clip=clip, lr=lr_value, losses={
                s: loss if isinstance(loss, str) else loss + 0.01 * s for s in (0, 1)}))
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "report-lr", "lr1", specs, tmp_path)
    out = build_report(ReportConfig(tracking_uri=uri, experiment="report-lr",
                                    output_dir=str(tmp_path / "reports"), device="cpu",
                                    register=False))
    md = (out.folder / "report.md").read_text()
    assert ("- Clipping at max_norm 1 widens the stable LR range from <=3e-3 to <=3e-2 (every "
            "swept LR) (LR sensitivity 0.222 -> 0.062).") in md
    assert "## Learning rate (LR sensitivity per setting)" in md
    assert "| clip off | 1e-3 3e-3 1e-2 3e-2 | ok ok x x | <=3e-3 | 0.7 |" in md
    assert f"(plots/{lr_plot.FILE})" in md  # what the figure shows: the test above
    assert (out.folder / "plots" / lr_plot.FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
