"""The report's per-layer gradient-norm heatmap: the marked parameter, the figure, the report.

The pure function that finds the first non-finite parameter is tested on small tables; the
report is built against a real MLflow server from fixture sweeps whose ``layer_norms.csv``
comes from the real ``LayerNormRecorder`` (tests/helpers/report_fixtures.py). The end-to-end
check with real training is in tests/report/test_sweep.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from stability.core.layers import LayerNormRecorder
from stability.core.steplog import StepLog
from stability.report import ReportConfig, build_report
from stability.report.examine.layer_norms import FirstNonFinite, Panel, first_non_finite, read_table
from stability.report.examine.plotted import Series
from stability.report.present.sections.layer_norms import heatmap
from stability.tasks.sign_sum import SequenceClassifier
from tests.helpers.report_fixtures import FIRST_BAD, Spec, make_sweep, run_config

INF, NAN = math.inf, math.nan
PNG = b"\x89PNG\r\n\x1a\n"
MARK = re.compile(r"\(seed (\d+)\): first non-finite `([^`]+)` at step (\d+)")


def table(**columns: list[float]) -> pd.DataFrame:
    steps = range(1, len(next(iter(columns.values()))) + 1)
    return pd.DataFrame({"step": list(steps), **columns})


def test_the_mark_is_the_first_non_finite_parameter_of_the_first_skipped_step() -> None:
    # Step 2 was skipped for a non-finite loss (no gradients: zeros); at step 3 w1 is the
    # first non-finite column in parameter order, although b and the later w2 are too.
    t = table(w2=[0.1, 0.0, 0.3, INF], w1=[0.2, 0.0, NAN, INF], b=[0.3, 0.0, INF, 0.1])
    assert first_non_finite(t, {2, 3, 4}) == FirstNonFinite(3, "w1")
    assert first_non_finite(t) == FirstNonFinite(3, "w1")  # a non-finite row is a skipped step
    assert first_non_finite(t, {4}) == FirstNonFinite(4, "w2")
    assert first_non_finite(t, {1, 2}) is None
    assert first_non_finite(t.iloc[:2]) is None
    assert first_non_finite(t[["step"]]) is None


def test_the_recorders_table_reads_back_with_its_inf_in_place(tmp_path: Path) -> None:
    """What training writes (``LayerNormRecorder.flush``) is what the report reads."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    recorder = LayerNormRecorder(model, rescale_to_pre_clip=False,
                                 path=tmp_path / "layer_norms.csv")
    for step in (1, 2):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        if step == 2:
            model[0].bias.grad[0] = math.inf
        recorder.on_step(StepLog(step, 1e-3, 1.0, 1.0, 0.5, step == 2, "", 1.0, False, 1, 8,
                                 int(step == 2)))
        recorder.flush()  # once an epoch in training: the table grows on disk
    t = read_table(tmp_path / "layer_norms.csv")
    assert list(t.columns) == ["step", "0.weight", "0.bias", "1.weight", "1.bias"]
    assert t.loc[1, "0.bias"] == INF and t.loc[0, "0.weight"] == 2.0
    assert first_non_finite(t, {2}) == FirstNonFinite(2, "0.bias")


def test_the_heatmap_marks_each_panels_first_non_finite_parameter(tmp_path: Path) -> None:
    clean = table(a=[1.0, 2.0, 3.0], b=[0.1, 0.2, 0.0])
    broken = table(a=[1.0, 1.0, 2.0, 1.0], b=[0.5, INF, NAN, 0.4], c=[0.1, NAN, 0.1, 0.1])
    fig, notes = heatmap([Panel(Series("winner", "fp32 noclip acc=1", "tab:red"), 0, clean),
                          Panel(series=Series("best fp16", "fp16 noclip acc=1", "tab:orange"),
                                seed=3, table=broken, skipped=frozenset({2, 3}))], tmp_path)
    assert fig is not None and (tmp_path / fig.file).read_bytes()[:8] == PNG
    assert notes == ["best fp16 (seed 3): first non-finite `b` at step 2"]
    assert heatmap([], tmp_path) == (None, [])


# ----------------------------------------------------------------------- in the report


def _report(uri: str, experiment: str, specs: list[Spec], root: Path):
    make_sweep(uri, experiment, f"{experiment}-1", specs, root)
    out = build_report(ReportConfig(tracking_uri=uri, experiment=experiment,
                                    output_dir=str(root / "reports"), device="cpu",
                                    register=False))
    return out, (out.folder / "report.md").read_text(), (out.folder / "report.html").read_text()


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
@pytest.mark.server
def test_the_report_draws_the_representative_runs_and_names_the_first_non_finite(
    mlflow_server, tmp_path
):
    from stability.tracking.contract import Artifact

    fp16 = Spec(precision="fp16", clip=1.0, accum=1, losses={0: 0.40, 1: 0.41, 2: 0.42}, skips=2,
                layer_norms=True)
    # an older run: no table
    baseline = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52})
    out, md, page = _report(mlflow_server.uri, "report-layers", [fp16, baseline], tmp_path)

    assert (out.folder / Artifact.LAYER_NORMS_FIGURE).read_bytes()[:8] == PNG
    assert f"![Per-layer gradient norms]({Artifact.LAYER_NORMS_FIGURE})" in md
    assert re.search(r'<img alt="Per-layer gradient norms" src="data:image/png;base64,', page)
    # Only the representative seed (median of three: seed 1) is drawn and marked; its first
    # skipped step holds inf in parameter FIRST_BAD and nan in a later one.
    names = [n for n, _ in SequenceClassifier(run_config(fp16, 0, tmp_path).model)
             .named_parameters()]
    assert MARK.findall(md) == [("1", names[FIRST_BAD], "1")]
    assert "Without `layer_norms.csv`: baseline = lowest-mean fp32: fp32 noclip acc=1." in md
    assert "## Problems" not in md
    c = MlflowClient(mlflow_server.uri)
    assert Artifact.LAYER_NORMS_FIGURE in {
        a.path for a in c.list_artifacts(out.report_run_id, "plots")}


@pytest.mark.slow  # an end-to-end run over a few seconds (pyproject's marker)
@pytest.mark.server
def test_without_any_table_the_report_says_so_in_one_line_and_draws_nothing(
    mlflow_server, tmp_path
):
    specs = [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.5, 1: 0.6}),
             Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.4, 1: 0.45})]
    out, md, page = _report(mlflow_server.uri, "report-no-layers", specs, tmp_path)
    lines = [line for line in md.splitlines() if "layer_norms" in line]
    assert lines == ["Per-layer gradient norms: none of the 2 representative runs has "
                     "`layer_norms.csv` (recorded with `telemetry.per_layer=true`; older runs "
                     "and runs with it off have none), so no heatmap is drawn."]
    assert not (out.folder / "plots" / "layer_norms.png").exists()
    assert "## Problems" not in md and "none of the 2 representative runs" in page
    assert (out.folder / "plots" / "heatmap.png").is_file()  # the other figures stand
