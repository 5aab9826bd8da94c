"""The callbacks' overhead benchmark: each figure is what it says it is (no timing asserted)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")


@pytest.mark.slow
def test_the_overhead_benchmark_reports_each_pair(tmp_path: Path) -> None:
    from benchmarks.integrations import PAIRS, HookTimer, run

    result = run(reps=1, epochs=1, out=tmp_path)
    variants = {"ours", "lightning", "lightning_callback", "lightning_empty", "lightning_hooks",
                "hf", "hf_callback", "hf_empty", "hf_hooks"}
    assert set(result["medians"]) == variants
    # Our loop reports its epochs' wall time only; every trainer fit its wall and CPU time.
    assert set(result["medians"]["ours"]) == {"fit_s"}
    for name in variants - {"ours"}:
        assert set(result["medians"][name]) == {"fit_s", "fit_cpu_s"}, name
    # One round: each paired ratio is exactly the two fits' quotient, NaN where the base has
    # no such figure (our loop's CPU time).
    assert set(result["paired_ratios"]) == {f"{a}/{b}" for a, b in PAIRS}
    for a, b in PAIRS:
        for metric in ("fit_s", "fit_cpu_s"):
            got = result["paired_ratios"][f"{a}/{b}"][metric]
            if metric in result["medians"][b]:
                assert got == result["medians"][a][metric] / result["medians"][b][metric]
            else:
                assert math.isnan(got), (a, b, metric)
    # The hook share is the timed methods' CPU over the rest of that same fit.
    for name in ("lightning_hooks", "hf_hooks"):
        hooks, fit = result["hook_cpu_s"][name], result["medians"][name]["fit_cpu_s"]
        assert 0 < hooks < fit
        assert result["hook_share"][name] == pytest.approx(hooks / (fit - hooks), rel=1e-12)
        assert result["hook_share_range"][name] == [result["hook_share"][name]] * 2
    # What the share covers: every timed method, the per-step ones once an optimizer step
    # (the fit's steps.csv rows); the pre-clip norm came from the trainer's clip each step.
    for name, trainer, per_step in (
            ("lightning_hooks", "lightning", ("on_before_optimizer_step", "_took_norm",
                                              "on_train_batch_end")),
            ("hf_hooks", "hf", ("_before_clip", "_took_norm", "add_micro_batch",
                                "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"))):
        calls = result["hook_calls"][name]
        assert set(calls) == set(HookTimer.HOOKS[trainer])
        (folder,) = tmp_path.glob(f"{'plhooks' if trainer == 'lightning' else 'hfhooks'}-*")
        with (folder / "steps.csv").open() as f:
            steps = len(list(csv.DictReader(f)))
        assert steps > 0 and {calls[k] for k in per_step} == {steps}, (name, calls)
    # The callback variants wrote their records; the bare and the empty ones did not.
    written = sorted(p.parent.name.split("-")[0] for p in tmp_path.glob("*/steps.csv"))
    assert written == ["hfcb", "hfhooks", "ours", "plcb", "plhooks"]
