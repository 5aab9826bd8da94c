"""The max_norm recommendation on constructed clip-off runs whose norm quantiles are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stability.report.examine.advice import against, nearest_swept, recommend
from stability.report.options import ClipAdviceConfig
from stability.report.present.sections.max_norm_advice import draw_max_norm_advice, max_norm_advice


def steps(norms: np.ndarray, skipped: int = 0) -> pd.DataFrame:
    df = pd.DataFrame({"step": np.arange(1, len(norms) + 1), "grad_l2_pre_clip": norms,
                       "skipped": 0})
    df.loc[: skipped - 1, ["skipped", "grad_l2_pre_clip"]] = (1, np.inf)
    return df


def table():
    """Clip-off runs at accum 1 (seeds 0, 1) and accum 4 (seed 0); norms 1..100 scaled."""
    runs = pd.DataFrame({
        "run_id": ["a", "b", "c", "d", "e"], "seed": [0, 1, 0, 0, 1],
        "outcome": ["finished", "finished", "finished", "finished", "diverged"],
        "clip.enabled": [False, False, False, True, False],
        "train.accum_steps": [1, 1, 4, 1, 1]})
    ramp = np.arange(1, 101, dtype=float)  # the 95% quantile of 1..100 is 95.05
    tables = {"a": steps(ramp / 100), "b": steps(ramp / 50, skipped=3), "c": steps(ramp / 10),
              "d": steps(ramp), "e": steps(ramp * 1000)}
    configs = pd.DataFrame({"max_norm": [np.nan, 0.5, 1.0]})
    return runs, configs, tables


def test_recommendation_is_the_quantile_that_clips_the_target_share_per_accum():
    runs, configs, tables = table()
    recs = {r.accum_steps: r for r in recommend(runs, configs, tables, ClipAdviceConfig(0.05))}
    assert set(recs) == {1, 4}
    one = recs[1]  # seed 0: norms 0.01..1.00; seed 1: 0.02..2.00 minus the 3 skipped steps
    q0 = float(np.quantile(np.arange(1, 101) / 100, 0.95))
    q1 = float(np.quantile(np.arange(4, 101) / 50, 0.95))
    assert one.per_seed == pytest.approx({0: q0, 1: q1})
    assert one.max_norm == pytest.approx((q0 + q1) / 2)  # the median of two seeds
    assert (one.low, one.high) == pytest.approx((q0, q1))
    assert one.steps == 100 + 97  # clip-on and diverged runs are not used
    pooled = np.concatenate([np.arange(1, 101) / 100, np.arange(4, 101) / 50])
    assert one.swept_share == pytest.approx({0.5: (pooled > 0.5).mean(), 1.0: (pooled > 1).mean()})
    assert nearest_swept(one) == 1.0
    assert recs[4].max_norm == pytest.approx(float(np.quantile(np.arange(1, 101) / 10, 0.95)))
    assert "would clip 5% of steps (2 seeds" in one.sentence()
    assert one.tag().startswith("acc=1:")


def test_a_larger_target_share_gives_a_lower_threshold_and_the_figure_is_drawn(tmp_path):
    runs, configs, tables = table()
    low = recommend(runs, configs, tables, ClipAdviceConfig(0.10))[0].max_norm
    high = recommend(runs, configs, tables, ClipAdviceConfig(0.05))[0].max_norm
    assert low < high
    recs = recommend(runs, configs, tables, ClipAdviceConfig())
    drawn = draw_max_norm_advice(recs)
    assert len(drawn.axes) == len(recs) == 2  # one panel per accumulation setting
    suptitle = drawn.texts[0].get_text()
    assert suptitle.startswith("Gradient norms of the clip-off runs")
    for ax, rec in zip(drawn.axes, recs, strict=True):
        assert ax.get_title() == f"accum_steps={rec.accum_steps} ({len(rec.per_seed)} seeds, " \
                                 f"{rec.steps} steps)"
        assert ax.get_xlabel() == "pre-clip global gradient L2 norm (log axis)"
        assert ax.get_ylabel() == "optimizer steps"
        # the histogram holds every step's norm; the red line stands at the recommendation
        (bars,) = ax.containers
        assert sum(bar.get_height() for bar in bars) == len(rec.norms) == rec.steps
        red = [line for line in ax.get_lines() if line.get_color() == "tab:red"]
        assert [line.get_xdata()[0] for line in red] == pytest.approx([rec.max_norm])
        grey = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert grey == sorted(rec.swept_share)
    fig = max_norm_advice(recs, tmp_path)
    assert fig is not None and (tmp_path / fig.file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_clip_off_run_means_no_recommendation(tmp_path):
    runs, configs, tables = table()
    runs["clip.enabled"] = True
    assert recommend(runs, configs, tables, ClipAdviceConfig()) == []
    assert max_norm_advice([], tmp_path) is None


def test_the_advice_says_how_it_stands_to_the_decision():
    """Issue 49: "max_norm 12.9 ... nearest swept value 10" beside "clip off" must not read as
    the answer's choice."""
    runs, configs, tables = table()
    off = type("Row", (), {"clip_enabled": False, "max_norm": float("nan"), "accum_steps": 1})
    rec = recommend(runs, configs, tables, ClipAdviceConfig(), off)[0]
    assert "the decision is **clip off**" in rec.sentence()
    on = type("Row", (), {"clip_enabled": True, "max_norm": nearest_swept(rec),
                          "accum_steps": rec.accum_steps})
    assert against(rec, True, on.max_norm, on.accum_steps) == \
        f"it agrees with the decision's max_norm {on.max_norm:g}"
    other = against(rec, True, 0.5 if on.max_norm != 0.5 else 1.0, 4)
    assert "was not itself tested" in other and "the decision chose accum 4" in other
    assert recommend(runs, configs, tables, ClipAdviceConfig())[0].decided == ""
