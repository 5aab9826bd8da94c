"""``design.Margin``: one parse of the margin syntax, for the report and the sweep alike."""

from __future__ import annotations

import math

import pytest

from stability.core.validation import ConfigError
from stability.design.margin import ALLOWED, Margin


def test_a_share_is_parsed_once_with_whitespace_ignored() -> None:
    for spec in ("5%", " 5%", "5% ", "\t5%\n", "5.0%"):
        assert Margin.parse(spec) == Margin(5.0, relative=True)
    assert Margin.parse("5%").of(0.08) == pytest.approx(0.004)
    assert Margin.parse("5%").of(-0.08) == pytest.approx(0.004)  # a share of |loss|
    assert math.isnan(Margin.parse("5%").of(math.inf))  # no finite best: nothing equivalent
    assert Margin.parse(" 2.5% ").spec == "2.5%"


def test_a_number_is_loss_units() -> None:
    assert Margin.parse(0.002) == Margin(0.002)
    assert Margin.parse(3).of(123.0) == 3.0
    assert Margin.parse(0.002).of(math.inf) == 0.002
    assert Margin.parse(0.002).spec == 0.002


@pytest.mark.parametrize("bad", ["five", "0%", "100%", "150%", "-1%", "nan%", "%", "0.002",
                                 0, -1.0, math.inf, math.nan, True, None, [1]])
def test_anything_else_is_refused_naming_the_key_and_the_allowed_values(bad: object) -> None:
    assert not Margin.ok(bad)
    with pytest.raises(ConfigError) as err:
        Margin.parse(bad, "hydra.sweeper.adaptive.margin")
    assert str(err.value) == (f"hydra.sweeper.adaptive.margin={bad!r} is invalid: allowed "
                              f"values are {ALLOWED}")


def test_the_report_and_the_sweep_accept_and_refuse_the_same_margins() -> None:
    from stability.report.options import to_report_config
    from stability.sweep.adaptive import Settings

    for spec in ("5%", " 5% ", 0.01):
        assert to_report_config({"margin": spec}).margin == spec
        assert Settings(margin=spec).margin == spec
    for spec in ("0%", "x", "0.01", -1.0):
        with pytest.raises(ValueError, match="margin=.* is invalid: allowed values are a share"):
            to_report_config({"margin": spec})
        with pytest.raises(ConfigError, match="margin=.* is invalid: allowed values are a share"):
            Settings(margin=spec)


def test_the_reports_margin_is_the_share_of_the_lowest_config_mean() -> None:
    """5% of the lowest mean (0.07), not of the median (0.08) or the first given; a config with
    an unfinished seed (+inf) or no runs (NaN) is never the lowest unless nothing else is."""
    means = [0.09, math.inf, 0.08, math.nan, 0.07, 0.085]
    assert Margin.parse("5%").lowest(means) == pytest.approx(0.0035)
    assert Margin.parse("5%").lowest(reversed(means)) == pytest.approx(0.0035)
    assert math.isnan(Margin.parse("5%").lowest([math.inf, math.nan]))
    assert Margin.parse(0.002).lowest(means) == 0.002

