"""A memory budget the decision respects, and what accumulation saved (``report.decide.memory``)."""

from __future__ import annotations

import pytest

from stability.report.decide import factors, memory, winner
from stability.report.decide.select import aggregate
from stability.report.options import ReportError, to_report_config
from tests.report.test_decision import study


def _runs():
    """fp16 is 0.02 better but peaks at 900 MB; fp32 at 300 MB."""
    runs = study({"fp16-None": -0.02, "fp16-5.0": -0.02}, {"fp32": 0.01, "fp16": 0.011},
                 noise=0.001)
    runs["peak_memory_mb"] = runs["precision.name"].map({"fp32": 300.0, "fp16": 900.0})
    return runs


def test_configs_over_the_budget_are_set_aside_before_the_decision_and_named():
    runs = _runs()
    configs = aggregate(runs)
    assert configs.iloc[0]["precision"] == "fp16"  # the lowest mean, over the budget
    kept, kept_configs, lines = memory.within_budget(runs, configs, 500.0)
    assert set(kept["precision.name"]) == {"fp32"} and len(kept_configs) == 2
    assert lines[0].startswith("memory budget 500 MB (report.memory_budget_mb): 2 of 4 configs "
                               "set aside") and "(900 MB)" in lines[0]
    dec = winner.decide(kept, kept_configs, factors.analyse(kept, kept_configs, 0.005),
                        winner.Settings(margin=0.005))
    assert dec.fingerprint in set(kept_configs["fingerprint"])
    assert memory.within_budget(runs, configs, None) == (runs, configs, [])


def test_no_config_within_the_budget_is_one_line_naming_the_lowest_peak():
    runs = _runs()
    with pytest.raises(ReportError, match=r"memory_budget_mb=100 is invalid .*\(lowest measured "
                                          r"peak 300 MB"):
        memory.within_budget(runs, aggregate(runs), 100.0)
    assert to_report_config({"memory_budget_mb": 8000}).memory_budget_mb == 8000.0
    with pytest.raises(ReportError, match="memory_budget_mb=-1"):
        to_report_config({"memory_budget_mb": -1})


def test_accumulation_memory_is_said_per_level_as_measured():
    runs = _runs()
    runs.loc[runs["clip.enabled"], "train.accum_steps"] = 4
    runs.loc[runs["train.accum_steps"] == 4, "peak_memory_mb"] -= 30.0
    line = memory.accumulation_memory(aggregate(runs))
    assert "accum 1 600 MB; accum 4 570 MB (-5.0%)" in line
