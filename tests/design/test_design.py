"""``design.Design``: built from a sweep's grid or from its runs, it is the same design.

The adaptive sweep seeds on the design of its grid's points (``sweep.adaptive.design_of``);
the report replays its looks on the design of the runs it fetched
(``report.decide.factors.design_of``). Both go through ``Design.of``; these tests build the runs
from the very points (their params as ``tracking.record.run_params`` logs them, typed as
``report.evidence.fetch`` reads them) and ask for equal ``Design`` objects, including for grids that
vary a param that is never a factor.
"""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

from stability.core.config import ConfigError
from stability.design.design import NEVER, Design, Factor
from stability.report.decide.factors import design_of
from stability.report.evidence.fetch import SWEPT, TYPED_PARAMS
from stability.sweep import adaptive
from stability.tracking.record import run_params
from tests.sweep.test_sweep import TINY, in_process_sweeper


def points_of(args: list[str]) -> list:
    s = in_process_sweeper(args)
    return s.plan(args)[1]


def runs_of(points: list) -> pd.DataFrame:
    """One row per point as ``fetch.fetch_runs`` would read its run back."""
    rows = []
    for p in points:
        params = {k: TYPED_PARAMS[k](v) if k in TYPED_PARAMS else v
                  for k, v in run_params(p.cfg).items() if k != "seed"}
        rows.append({"fingerprint": p.fingerprint, "seed": p.cfg.seed, **params})
    runs = pd.DataFrame(rows)
    runs.attrs[SWEPT] = tuple(sorted(adaptive.swept_keys(points)))
    return runs


def test_the_default_grid_gives_the_same_design_from_points_and_from_runs() -> None:
    points = points_of([])
    d = adaptive.design(points)
    assert d == design_of(runs_of(points))
    assert d.names == ("clipping", "accumulation", "precision") and d.shape == (4, 4, 3)
    assert d.full and len(d.configs) == 48


@pytest.mark.parametrize("never", ["train.threads=1,2", "monitor.window=500,1000"])
def test_a_swept_param_that_is_never_a_factor_is_left_out_on_both_sides(never: str) -> None:
    """The sweep's old list made ``train.threads`` and ``monitor.*`` factors, the report's did
    not: an adaptive study varying one was replayed on another design than it ran."""
    points = points_of([*TINY, "clip.enabled=false", "train.accum_steps=1,8",
                        "precision=fp32", never, "seed=0"])
    assert len({p.fingerprint for p in points}) == 4  # two configs per cell
    d = adaptive.design_of(points)
    assert d == design_of(runs_of(points))
    assert d.factors == (Factor("accumulation", ("1", "8")),)
    key = never.split("=")[0]
    assert key.startswith(NEVER)
    with pytest.raises(ConfigError, match=rf"got 4 configs over 2; {key} is swept but never a "
                                          "factor"):
        adaptive.design(points)


def test_a_plain_swept_param_is_a_factor_on_both_sides() -> None:
    points = points_of([*TINY, "clip.enabled=false", "train.accum_steps=1,8",
                        "precision=fp32,bf16", "train.lr=0.01,1e-3", "seed=0"])
    d = adaptive.design(points)
    assert d == design_of(runs_of(points))
    assert d.names == ("accumulation", "precision", "train.lr")
    assert d.levels == (("1", "8"), ("fp32", "bf16"), ("0.001", "0.01"))
    assert [f.name for f in d.constant] == ["clipping"]  # a figure's rows still show it
    assert [f.name for f in d.axes] == ["clipping", "accumulation", "precision", "train.lr"]


def test_the_runs_of_an_unknown_sweep_vary_any_setting_but_never_a_bookkeeping_one() -> None:
    params = {"a": {"clip.enabled": False, "train.lr": 0.1, "train.threads": 1,
                    "tracking.uri": "x", "monitor.enabled": True},
              "b": {"clip.enabled": False, "train.lr": 0.2, "train.threads": 2,
                    "tracking.uri": "y", "monitor.enabled": False}}
    d = Design.of(params)  # swept None: any param that varies
    assert d.names == ("train.lr",) and d.configs == ("a", "b") and d.cells == ((0,), (1,))
    assert d.level("b", "train.lr") == "0.2" and d.level("b", "clipping") == "off"
    assert Design.of(params, swept=["train.threads"]).factors == ()


def test_a_run_without_params_is_no_level_of_a_plain_factor() -> None:
    """A planted run records no params (NaN in the fetched table): its missing values do not
    make each of the sweep's forty settings a two-level factor (a cube of 2^40 cells); a
    setting that varies among the runs that recorded it still does."""
    nan = float("nan")
    own = {"clip.enabled": False, "data.num_samples": 300, "model.cell": "rnn"}
    params = {"a": {**own, "train.epochs": 2.0}, "b": {**own, "train.epochs": 2.0},
              "planted": {"clip.enabled": nan, "clip.max_norm": nan, "data.num_samples": nan,
                          "model.cell": None, "train.epochs": 18.0}}
    plain = [n for n in Design.of(params).names if "." in n]  # clipping: "max_norm nan" too
    assert plain == ["train.epochs"]
    del params["planted"]["train.epochs"]
    assert [n for n in Design.of(params).names if "." in n] == []


def test_the_heatmap_takes_rows_columns_and_panels_from_the_design(tmp_path, monkeypatch) -> None:
    """Clipping rows x accumulation columns, a panel per level of every other factor: a plain
    swept factor (here ``optim.weight_decay``) gets its panels with no figure code."""
    from stability.report.present import plots

    params, rows = {}, []
    for i, (clip, acc, prec, wd) in enumerate(itertools.product(
            (False, True), (1, 4), ("fp32", "bf16"), ("0.0", "0.1"))):
        params[f"c{i}"] = {"clip.enabled": clip, "clip.max_norm": 5.0, "train.accum_steps": acc,
                           "precision.name": prec, "optim.weight_decay": wd}
        rows.append({"fingerprint": f"c{i}", "loss_mean": 0.4 + 0.01 * i, "rank": i + 1})
    d = Design.of(params, ["clip.enabled", "train.accum_steps", "precision",
                           "optim.weight_decay"])
    seen = {}

    def save(fig, folder, name, tight=True):
        seen["titles"] = [ax.get_title() for ax in fig.axes if ax.get_title()]
        seen["rows"] = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        seen["columns"] = [t.get_text() for t in fig.axes[0].get_xticklabels()]

    monkeypatch.setattr(plots, "save", save)
    assert plots.heatmap(pd.DataFrame(rows), tmp_path, d) is not None
    assert seen == {"titles": ["fp32, optim.weight_decay=0.0", "fp32, optim.weight_decay=0.1",
                               "bf16, optim.weight_decay=0.0", "bf16, optim.weight_decay=0.1"],
                    "rows": ["clip off", "max_norm 5"], "columns": ["1", "4"]}
